"""The sandbox shell reads commands the way bash does (quoting, expansion, set -e rules)."""

from __future__ import annotations

from tpu_rl_sandbox.bashsim import CallbackSink, CommandFn, NullSink, Shell, Sink


class RecordingHost:
    """Knows ``python3`` (records its argv and env) and ``hostname``; nothing else."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], dict[str, str]]] = []

    def resolve_command(self, shell: Shell, name: str) -> CommandFn | None:
        if name == "python3":
            return self._python
        if name == "hostname":
            return self._hostname
        return None

    def _hostname(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        out.write("10.0.0.7 \n")
        return 0

    def _python(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        self.calls.append((argv, env))
        if "-c" in argv and "fail" in argv:
            return 1
        return 0

    def read_file(self, shell: Shell, path: str) -> str | None:
        return None

    def open_sink(self, shell: Shell, path: str, append: bool) -> Sink | None:
        return NullSink()

    def file_test(self, shell: Shell, op: str, path: str) -> bool:
        return False

    def is_dir(self, shell: Shell, path: str) -> bool:
        return True


def run(script: str, env: dict[str, str] | None = None) -> tuple[int, str, str, RecordingHost]:
    host = RecordingHost()
    out: list[str] = []
    err: list[str] = []
    status = Shell(host, dict(env or {}), "/", CallbackSink(out.append), CallbackSink(err.append)).run(script)
    return status, "".join(out), "".join(err), host


SEED_TRAINING_COMMAND = (
    "(echo 190G > /sys/fs/cgroup/memory.max || echo 190G > /sys/fs/cgroup/memory/memory.limit_in_bytes) 2>/dev/null || true && \\\n"
    "    export VLLM_HOST_IP=$(hostname -I | awk '{print $1}') && \\\n"
    "    export VLLM_ENABLE_V1_MULTIPROCESSING=0 && \\\n"
    "    python3 -c \"import pathlib, re; p = pathlib.Path('/x'); p.write_text(re.sub('a', 'b', p.read_text()))\" && \\\n"
    "    JAX_PLATFORMS=proxy,cpu ENABLE_PATHWAYS_PERSISTENCE=1 \\\n"
    "    python3 -m maxtext.trainers.post_train.rl.train_rl run_name=rl \\\n"
    '    vllm_hf_overrides=\'{"architectures": ["MaxTextForCausalLM"]}\' \\\n'
    "    vllm_additional_config=\"{'maxtext_config': {'model_name': 'qwen3-30b-a3b'}}\""
)


def test_seed_training_command_reaches_maxtext_with_its_arguments_and_env_prefix() -> None:
    status, _, err, host = run(SEED_TRAINING_COMMAND)
    # awk is not provided by this host: bash reports it and the pipeline's status is awk's (127),
    # but `export` still succeeds, so the && chain goes on.
    assert "awk: command not found" in err
    assert status == 0
    argv, env = host.calls[-1]
    assert argv[:3] == ["python3", "-m", "maxtext.trainers.post_train.rl.train_rl"]
    assert 'vllm_hf_overrides={"architectures": ["MaxTextForCausalLM"]}' in argv
    assert "vllm_additional_config={'maxtext_config': {'model_name': 'qwen3-30b-a3b'}}" in argv
    assert env["JAX_PLATFORMS"] == "proxy,cpu"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_job_completion_index_guard() -> None:
    command = '[ "$JOB_COMPLETION_INDEX" != "0" ] || python3 -m maxtext.checkpoint_conversion.to_maxtext a=1'
    _, _, _, on_index_zero = run(command, {"JOB_COMPLETION_INDEX": "0"})
    _, _, _, on_index_three = run(command, {"JOB_COMPLETION_INDEX": "3"})
    assert len(on_index_zero.calls) == 1
    assert on_index_three.calls == []


def test_set_e_does_not_stop_on_a_failing_substitution_inside_export() -> None:
    script = 'set -euo pipefail\nexport HF_TOKEN="$(python3 -c fail)"\npython3 -m tool "token=${HF_TOKEN}"\n'
    status, _, _, host = run(script)
    assert status == 0
    assert host.calls[-1][0][-1] == "token="


def test_set_e_stops_on_a_plain_failure_and_unknown_command_is_127() -> None:
    status, out, err, _ = run("set -e\necho before\nno-such-tool --flag\necho after\n")
    assert status == 127
    assert out == "before\n"
    assert "line 3: no-such-tool: command not found" in err


def test_set_e_ignores_failures_left_of_and_or_and_in_conditions() -> None:
    status, out, _, _ = run(
        "set -e\nfalse && echo no\nif false; then echo no; else echo else; fi\n! false\necho end\n"
    )
    assert status == 0
    assert out == "else\nend\n"


def test_parameter_expansions() -> None:
    status, out, _, _ = run(
        "A=abc.tar.gz; echo ${A%.gz} ${A%%.*} ${A#*.} ${#A} ${UNSET:-dflt} $((1 - ${ONE:-1}))", {}
    )
    assert status == 0
    assert out == "abc.tar abc tar.gz 10 dflt 0\n"


def test_required_parameter_and_nounset_stop_the_shell() -> None:
    status, out, err, _ = run('echo start; echo "${MODEL_NAME?}"; echo never')
    assert (status, out) == (1, "start\n")
    assert "MODEL_NAME: parameter not set" in err
    status, _, err, _ = run("set -u; echo $NOPE")
    assert status == 1
    assert "NOPE: unbound variable" in err


def test_syntax_error_is_exit_2() -> None:
    status, _, err, _ = run("echo 'unterminated")
    assert status == 2
    assert "unexpected EOF" in err
