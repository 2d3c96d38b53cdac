"""GclusterHook.run / run_checked against fake executables: streaming, stdin, env, masking, errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import CommandError, ConfigurationError, FailureKind
from airflow_provider_tpu_rl.hooks import gcluster as gcluster_module
from airflow_provider_tpu_rl.hooks.gcluster import GclusterConfig
from airflow_provider_tpu_rl.render.command import Command

SENTINEL = "hf_SENTINELtoken0123456789"
GUARD = 30.0  # seconds: only reached when the code under test hangs


def test_streams_stdout_and_stderr_lines_in_order_and_logs_each(make_hook, fake_tools, recording_logger):
    fake_tools.respond(
        {"match": ["deploy"], "steps": [["out", "one"], ["err", "two"], ["out", "three"], ["err", "four"]]}
    )
    seen: list[str] = []
    result = make_hook().run(Command(("gcluster", "deploy", "bp.yaml")), on_line=seen.append, timeout=GUARD)
    assert result.exit_code == 0
    assert result.ok
    assert list(result.output_lines) == ["one", "two", "three", "four"]
    assert seen == ["one", "two", "three", "four"]
    logged = [m for m in recording_logger.messages if m.startswith("[gcluster] ")]
    assert logged == ["[gcluster] one", "[gcluster] two", "[gcluster] three", "[gcluster] four"]


def test_lines_reach_on_line_while_the_process_still_runs(make_hook, fake_tools, tmp_path):
    ack = tmp_path / "ack"
    fake_tools.respond({"match": ["job"], "steps": [["out", "waiting"], ["wait_for", str(ack)]]})

    def on_line(line: str) -> None:
        if line == "waiting":
            ack.touch()  # the fake only goes on once it sees this: proves the line came before exit

    result = make_hook().run(Command(("gcluster", "job", "logs", "x")), on_line=on_line, timeout=GUARD)
    assert result.output_lines == ("waiting", "handshake ok")


def test_argv0_is_mapped_to_the_configured_binary_and_no_shell_is_used(make_hook, fake_tools):
    fake_tools.respond({"match": [], "steps": [["out", "ok"]]})
    hook = make_hook()
    odd = "a b; echo $HOME && `id` | cat"
    hook.run(Command(("gcloud", "storage", "buckets", "create", odd)), timeout=GUARD)
    hook.run(Command(("gcluster", "--version")), timeout=GUARD)
    calls = fake_tools.calls()
    assert [c["tool"] for c in calls] == ["gcloud", "gcluster"]
    assert calls[0]["argv"] == ["storage", "buckets", "create", odd]  # passed through verbatim


def test_unknown_tool_is_refused(make_hook):
    with pytest.raises(ConfigurationError, match="unknown tool 'kubectl'"):
        make_hook().run(Command(("kubectl", "get", "pods")))


def test_stdin_is_closed_so_a_prompt_gets_eof_instead_of_hanging(make_hook, fake_tools):
    fake_tools.respond({"match": ["destroy"], "steps": [["prompt"]], "exit": 1})
    # Give this process a stdin that never ends: an inherited stdin would make the fake block.
    read_end, write_end = os.pipe()
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        result = make_hook().run(Command(("gcluster", "destroy", "rl-cluster")), timeout=GUARD)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)
    assert not result.timed_out
    assert result.exit_code == 1
    assert "Error: EOF" in result.output_lines
    assert fake_tools.calls()[0]["prompt"] == "eof"


def test_stdin_secret_goes_only_to_stdin_and_is_masked_everywhere(
    make_hook, fake_tools, recording_logger, monkeypatch
):
    masked: list[str] = []
    monkeypatch.setattr(gcluster_module, "mask_secret", masked.append)
    fake_tools.respond({"match": ["secrets"], "steps": [["stdin"], ["err", f"echo {SENTINEL} again"]]})
    command = Command(("gcloud", "secrets", "create", "hf-token", "--data-file=-"), stdin_secret="hf_token")
    result = make_hook().run(command, secrets={"hf_token": SENTINEL}, timeout=GUARD)

    call = fake_tools.calls()[0]
    assert call["stdin"] == SENTINEL  # delivered exactly, on stdin
    assert all(SENTINEL not in arg for arg in call["argv"])
    assert all(SENTINEL not in value for value in call["env"].values())
    assert masked == [SENTINEL]
    assert result.output_lines == ("received token=***", "echo *** again")
    assert SENTINEL not in recording_logger.text
    assert "received token=***" in recording_logger.text


def test_secret_is_redacted_in_the_exception_message(make_hook, fake_tools):
    fake_tools.respond(
        {"match": ["submit"], "steps": [["stdin"], ["err", f"Error: bad token {SENTINEL}"]], "exit": 1}
    )
    command = Command(("gcluster", "job", "submit", "--name", "j"), stdin_secret="hf_token")
    with pytest.raises(CommandError) as info:
        make_hook().run_checked(command, secrets={"hf_token": SENTINEL}, timeout=GUARD)
    assert SENTINEL not in str(info.value)
    assert "Error: bad token ***" in str(info.value)


def test_missing_stdin_secret_fails_before_starting(make_hook, fake_tools):
    command = Command(("gcloud", "secrets", "create", "x", "--data-file=-"), stdin_secret="hf_token")
    with pytest.raises(ConfigurationError, match="needs the secret 'hf_token'"):
        make_hook().run(command, secrets={})
    assert fake_tools.calls() == []


def test_stdin_text_is_fed_then_closed(make_hook, fake_tools):
    fake_tools.respond({"match": ["ssh"], "steps": [["stdin"]]})
    script = "set -e\n" + "echo x\n" * 20000  # larger than a pipe buffer
    result = make_hook().run(Command(("gcloud", "compute", "ssh", "vm"), stdin_text=script), timeout=GUARD)
    assert result.exit_code == 0
    assert fake_tools.calls()[0]["stdin"] == script


def test_each_call_gets_its_own_home_and_kubeconfig(make_hook, fake_tools):
    fake_tools.respond({"match": ["job"], "steps": [["env", "HOME"], ["env", "KUBECONFIG"]]})
    hook = make_hook()
    first = dict(line.split("=", 1) for line in hook.run(Command(("gcluster", "job", "list"))).output_lines)
    second = dict(line.split("=", 1) for line in hook.run(Command(("gcluster", "job", "list"))).output_lines)
    assert first["HOME"] != second["HOME"]
    assert first["KUBECONFIG"] != second["KUBECONFIG"]
    for env in (first, second):
        assert env["HOME"] != os.environ.get("HOME")
        assert env["KUBECONFIG"] == str(Path(env["HOME"]) / ".kube" / "config")
        assert not Path(env["HOME"]).exists()  # removed after the call


def test_job_home_keeps_the_job_context_across_calls(make_hook, fake_tools):
    fake_tools.respond(
        {"match": ["config", "set"], "steps": [["write_home", ".gcluster/context.json", '{"project": "p"}']]},
        {"match": ["job", "list"], "steps": [["cat_home", ".gcluster/context.json"], ["env", "HOME"]]},
    )
    hook = make_hook()
    with hook.job_session() as home:
        hook.run(Command(("gcluster", "job", "config", "set", "project", "p")), job_home=home)
        shared = hook.run(Command(("gcluster", "job", "list")), job_home=home)
        assert shared.output_lines == ('{"project": "p"}', f"HOME={home}")
        fresh = hook.run(Command(("gcluster", "job", "list")))
        assert fresh.output_lines[0] == "missing"
    assert not home.exists()


def test_environment_is_minimal_plus_command_env(make_hook, fake_tools, monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", "do-not-leak")
    monkeypatch.setenv("SOME_RANDOM_TOKEN", "do-not-leak")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://localhost:4443")
    monkeypatch.setenv("TPU_RL_SANDBOX_STATE", "/tmp/sandbox")
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", "proj")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    fake_tools.respond({"match": [], "steps": []})
    make_hook().run(Command(("gcloud", "version"), env={"TF_LOG": "INFO"}), timeout=GUARD)
    env = fake_tools.calls()[0]["env"]
    assert "AIRFLOW__CORE__FERNET_KEY" not in env
    assert "SOME_RANDOM_TOKEN" not in env
    assert env["STORAGE_EMULATOR_HOST"] == "http://localhost:4443"
    assert "TPU_RL_SANDBOX_STATE" not in env  # not on the allow-list without inherit_env
    assert env["CLOUDSDK_CORE_PROJECT"] == "proj"
    assert env["HTTPS_PROXY"] == "http://proxy:3128"
    assert env["TF_LOG"] == "INFO"
    assert "do-not-leak" not in env.values()


def test_inherit_env_extends_the_allow_list(make_hook, fake_tools, monkeypatch):
    monkeypatch.setenv("MY_TOOL_LEVEL", "3")
    monkeypatch.setenv("MY_TOOL_OTHER", "4")
    monkeypatch.setenv("EXACT_NAME", "5")
    monkeypatch.setenv("EXACT_NAME_LONGER", "do-not-pass")
    monkeypatch.setenv("SOME_RANDOM_TOKEN", "do-not-leak")
    fake_tools.respond({"match": [], "steps": []})
    make_hook(inherit_env=["MY_TOOL_*", "EXACT_NAME"]).run(Command(("gcloud", "version")), timeout=GUARD)
    env = fake_tools.calls()[0]["env"]
    assert (env["MY_TOOL_LEVEL"], env["MY_TOOL_OTHER"], env["EXACT_NAME"]) == ("3", "4", "5")
    assert "EXACT_NAME_LONGER" not in env
    assert "SOME_RANDOM_TOKEN" not in env


@pytest.mark.parametrize("value", [["BAD-NAME"], ["*"], ["A;B"], [3]])
def test_inherit_env_refuses_bad_names(value):
    with pytest.raises(ConfigurationError, match="inherit_env"):
        GclusterConfig(inherit_env=value)


def test_inherit_env_from_a_form_field_text():
    assert GclusterConfig.from_extra({"inherit_env": "A_*, B"}).inherit_env == ("A_*", "B")
    assert GclusterConfig.from_extra({"inherit_env": '["C"]'}).inherit_env == ("C",)


def test_ok_if_output_contains_turns_a_failure_into_success(make_hook, fake_tools, recording_logger):
    fake_tools.respond(
        {
            "match": ["buckets"],
            "steps": [["err", "ERROR: HTTPError 409: The requested bucket already exists"]],
            "exit": 1,
        }
    )
    command = Command(
        ("gcloud", "storage", "buckets", "create", "gs://b"), ok_if_output_contains=("already exists",)
    )
    result = make_hook().run_checked(command, timeout=GUARD)
    assert result.exit_code == 1
    assert result.ok_marker == "already exists"


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (
            "Error: googleapi: Error 503: The service is currently unavailable., backendError",
            FailureKind.TRANSIENT,
        ),
        ("Error creating NodePool: GCE_STOCKOUT: no capacity in us-east5-b", FailureKind.CAPACITY),
        (
            "Error: Quota 'TPUS_V6E_PER_PROJECT_PER_ZONE' exceeded. Limit: 32.0 in zone us-east5-b",
            FailureKind.CAPACITY,
        ),
    ],
)
def test_retryable_failures_raise_a_retryable_command_error(make_hook, fake_tools, line, kind):
    fake_tools.respond({"match": ["deploy"], "steps": [["out", "Planning..."], ["err", line]], "exit": 1})
    with pytest.raises(CommandError) as info:
        make_hook().run_checked(Command(("gcluster", "deploy", "bp.yaml")), timeout=GUARD)
    assert info.value.kind is kind
    assert info.value.retryable
    assert not isinstance(info.value, AirflowFailException)
    assert line in str(info.value)
    assert "exit code 1" in str(info.value)


def test_config_failure_raises_a_non_retryable_command_error_with_the_last_lines(make_hook, fake_tools):
    steps = [["out", f"noise {i}"] for i in range(100)] + [["err", "Error: unknown flag: --bogus"]]
    fake_tools.respond({"match": ["job"], "steps": steps, "exit": 1})
    with pytest.raises(CommandError) as info:
        make_hook().run_checked(Command(("gcluster", "job", "submit", "--bogus")), timeout=GUARD)
    message = str(info.value)
    assert info.value.kind is FailureKind.CONFIG
    assert not info.value.retryable
    assert not isinstance(info.value, AirflowFailException)
    assert "Error: unknown flag: --bogus" in message
    assert "noise 99" in message
    assert "noise 0\n" not in message  # only the tail


def test_timeout_stops_the_command_and_counts_as_transient(make_hook, fake_tools):
    fake_tools.respond({"match": ["deploy"], "steps": [["out", "started"], ["sleep", 300]]})
    hook = make_hook()
    result = hook.run(Command(("gcluster", "deploy", "bp.yaml")), timeout=0.5)
    assert result.timed_out
    assert not result.ok
    with pytest.raises(CommandError, match="timed out") as info:
        hook.check_result(Command(("gcluster", "deploy", "bp.yaml")), result)
    assert info.value.kind is FailureKind.TRANSIENT
    assert info.value.retryable


def test_terminate_kills_the_whole_process_group(make_hook, fake_tools):
    fake_tools.respond({"match": ["logs"], "steps": [["spawn_child"], ["sleep", 300]]})
    hook = make_hook()

    def on_line(line: str) -> None:
        if line == "child started":
            hook.terminate()

    result = hook.run(Command(("gcluster", "job", "logs", "j", "-f")), on_line=on_line, timeout=GUARD)
    assert not result.timed_out
    assert result.exit_code != 0
    child_pid = int((fake_tools.bin_dir / "child.pid").read_text())
    assert not _alive(child_pid)


def test_run_uses_cwd(make_hook, fake_tools, tmp_path):
    fake_tools.respond({"match": [], "steps": []})
    make_hook().run(Command(("gcluster", "deploy", "bp.yaml")), cwd=tmp_path, timeout=GUARD)
    assert fake_tools.calls()[0]["cwd"] == str(tmp_path)


def test_gcluster_path_must_be_executable(make_hook, tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ConfigurationError, match="not an executable file"):
        make_hook(gcluster_path=str(missing)).run(Command(("gcluster", "--version")))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in state  # a zombie is dead, just not reaped yet


def test_a_call_without_timeout_is_stopped_at_the_command_timeout(make_hook, fake_tools, monkeypatch):
    monkeypatch.setenv("AIRFLOW__TPU_RL__COMMAND_TIMEOUT_MINUTES", "0.01")  # 0.6 s
    monkeypatch.setenv("AIRFLOW__TPU_RL__KILL_GRACE_SECONDS", "1")
    fake_tools.respond({"match": ["describe"], "steps": [["out", "started"], ["sleep", 60]]})
    result = make_hook().run(Command(("gcloud", "container", "clusters", "describe", "c")))
    assert result.timed_out
    assert result.output_lines == ("started",)


def test_deploy_and_destroy_default_to_their_stage_bound(monkeypatch):
    monkeypatch.setenv("AIRFLOW__TPU_RL__DEPLOY_TIMEOUT_MINUTES", "30")
    monkeypatch.setenv("AIRFLOW__TPU_RL__TEARDOWN_TIMEOUT_MINUTES", "60")
    monkeypatch.setenv("AIRFLOW__TPU_RL__COMMAND_TIMEOUT_MINUTES", "7")
    deploy = gcluster_module.default_timeout(Command(("gcluster", "deploy", "c", "--auto-approve")))
    destroy = gcluster_module.default_timeout(Command(("gcluster", "destroy", "c", "--auto-approve")))
    other = gcluster_module.default_timeout(Command(("gcluster", "job", "list")))
    assert 0 < deploy < 30 * 60  # stopped before the task's own execution_timeout
    assert 30 * 60 < destroy < 60 * 60
    assert other == 7 * 60


def test_terraform_commands_get_a_state_lock_timeout(make_hook, fake_tools, monkeypatch):
    monkeypatch.setenv("AIRFLOW__TPU_RL__TERRAFORM_LOCK_TIMEOUT_MINUTES", "5")
    fake_tools.respond({"match": [], "steps": [["env", "TF_CLI_ARGS_apply"]]})
    hook = make_hook()
    deploy = hook.run(Command(("gcluster", "deploy", "c")), timeout=GUARD)
    gcloud = hook.run(Command(("gcloud", "version")), timeout=GUARD)
    assert "TF_CLI_ARGS_apply=-lock-timeout=300s" in deploy.output_lines
    assert not any(line.startswith("TF_CLI_ARGS_apply=-lock") for line in gcloud.output_lines)


REFUSED = "ssh: connect to host 34.1.2.3 port 22: Connection refused"
SSH = Command(
    ("gcloud", "compute", "ssh", "vm-1", "--zone=z", "--command=bash -s"), description="install on vm-1"
)


def _refused(code: int = 255) -> dict:
    tail = (
        "[/usr/bin/ssh] exited with return code [255]." if code == 255 else "Could not SSH into the instance."
    )
    return {"steps": [["err", REFUSED], ["err", f"ERROR: (gcloud.compute.ssh) {tail}"]], "exit": code}


def test_ssh_refused_by_a_booting_guest_is_tried_again_until_sshd_answers(
    make_hook, fake_tools, recording_logger, monkeypatch
):
    """Refused with ssh's 255, then with gcloud's given-up key poll (exit 1), then a session."""
    monkeypatch.setenv("AIRFLOW__TPU_RL__SSH_BOOT_POLL_SECONDS", "0.05")
    fake_tools.respond(
        {"match": ["ssh"], "sequence": [_refused(255), _refused(1), {"steps": [["out", "installed"]]}]}
    )
    result = make_hook().run_checked(SSH, timeout=GUARD)
    assert result.output_lines == ("installed",)
    assert len(fake_tools.calls()) == 3
    waits = [m for m in recording_logger.messages if "still booting" in m]
    assert len(waits) == 2  # one line per wait
    assert waits[0].startswith(
        f"install on vm-1: {REFUSED} (the VM's guest is still booting): trying again in 0.05s"
    )


def test_ssh_refused_past_the_boot_wait_fails_in_one_line(make_hook, fake_tools, monkeypatch):
    monkeypatch.setenv("AIRFLOW__TPU_RL__SSH_BOOT_POLL_SECONDS", "0.05")
    monkeypatch.setenv("AIRFLOW__TPU_RL__SSH_BOOT_WAIT_MINUTES", "0.01")  # 0.6 s
    fake_tools.respond({"match": ["ssh"], **_refused()})
    with pytest.raises(CommandError) as failed:
        make_hook().run_checked(SSH, timeout=GUARD)
    assert str(failed.value) == (
        "install on vm-1: the VM's sshd still refused connections after the boot wait "
        f"([tpu_rl] ssh_boot_wait_minutes = 0.01): {REFUSED}"
    )
    assert failed.value.kind is FailureKind.TRANSIENT
    assert 2 <= len(fake_tools.calls()) <= 13  # bounded: about 0.6 s of 0.05 s waits


def test_only_a_refused_connection_is_tried_again(make_hook, fake_tools, monkeypatch):
    """A timed-out connect (a firewall) or a failed session is not a booting guest: one try."""
    monkeypatch.setenv("AIRFLOW__TPU_RL__SSH_BOOT_POLL_SECONDS", "0.05")
    timed_out = "ssh: connect to host 34.1.2.3 port 22: Connection timed out"
    fake_tools.respond({"match": ["ssh"], "steps": [["err", timed_out]], "exit": 255})
    assert not make_hook().run(SSH, timeout=GUARD).ok
    fake_tools.respond({"match": ["ssh"], "steps": [["err", REFUSED]], "exit": 3})  # the script's own
    assert not make_hook().run(SSH, timeout=GUARD).ok
    assert len(fake_tools.calls()) == 2


def test_a_probe_that_only_looks_is_not_kept_waiting_on_a_booting_guest(make_hook, fake_tools, monkeypatch):
    monkeypatch.setenv("AIRFLOW__TPU_RL__SSH_BOOT_POLL_SECONDS", "0.05")
    fake_tools.respond({"match": ["ssh"], "sequence": [_refused(255), {"steps": [["out", "ok"]]}]})
    assert not make_hook().run(SSH, timeout=GUARD, wait_for_sshd=False).ok
    assert len(fake_tools.calls()) == 1
