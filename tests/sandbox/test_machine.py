"""The fake machines: real bash in private namespaces, the image's patch targets, the fakes' rules."""

from __future__ import annotations

import ast
import os
import re
import time
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.render.gke import ADAFACTOR_PATCH, TUNIX_RESHARD_PATCH, train_rl_script
from airflow_provider_tpu_rl.render.shell import quote_all
from airflow_provider_tpu_rl.spec.presets import PRESETS
from airflow_provider_tpu_rl.spec.workloads import TrainingSpec
from tests.sandbox.conftest import Cli, wait_for
from tpu_rl_sandbox.machines import pod_image
from tpu_rl_sandbox.machines.fsview import GcsStore
from tpu_rl_sandbox.machines.hosts import MachineServices, PodHost, VmHost

HOST_CGROUP_LIMIT = Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")


def services(cli: Cli, cancelled: object = None) -> MachineServices:
    def secret(project: str, secret: str, version: str) -> tuple[str | None, str]:
        if secret == "hf":
            return "hf_value", ""
        return (
            None,
            f"google.api_core.exceptions.NotFound: 404 Secret [projects/1/secrets/{secret}] not found.",
        )

    return MachineServices(
        gcs=GcsStore(cli.api),
        secret_access=secret,
        fault=lambda kind: None,
        seed="test",
        step_seconds=0.01,
        hold_file=None,
        cancelled=cancelled if callable(cancelled) else (lambda: False),
        default_project="proj",
    )


def run_pod(cli: Cli, root: Path, script: str, **env: str) -> tuple[int, str]:
    pod = PodHost(root, services(cli), "job")
    log = root.parent / f"{root.name}.log"
    with log.open("wb") as handle:
        code = pod.run(
            ["/bin/bash", "-c", script], None, handle.fileno(), handle.fileno(), {**pod.base_env(), **env}
        )
    return code, log.read_text()


def run_vm(
    cli: Cli, root: Path, script: str, scopes: tuple[str, ...] = ("cloud-platform",)
) -> tuple[int, str]:
    vm = VmHost(root, services(cli), "vm-test", "alice", "proj", list(scopes))
    output: list[str] = []
    code = vm.run_session(["bash", "-s"], script.encode(), output.append, output.append, {})
    return code, "".join(output)


def mountinfo() -> list[str]:
    return sorted(line.split(" ", 4)[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


# ======================================================================== isolation
def test_pod_files_and_cgroup_stay_in_the_sandbox(cli: Cli, tmp_path: Path) -> None:
    before = mountinfo()
    host_limit = HOST_CGROUP_LIMIT.read_text() if HOST_CGROUP_LIMIT.exists() else None
    script = train_rl_script(
        PRESETS["qwen3-30b-a3b"], _training(), "projects/proj/secrets/hf/versions/latest"
    )
    cgroup_line = script.split(" && ", 1)[0]
    assert "/sys/fs/cgroup/memory.max" in cgroup_line
    marker = f"shm-{os.getpid()}"
    code, out = run_pod(
        cli,
        tmp_path / "pod",
        f"{cgroup_line} && echo x > /dev/shm/{marker} && echo y > /deps/y && hostname && "
        "(mkdir /new-top-level-dir || echo refused) && (ls /work || echo no-work) && cat /proc/1/cmdline | tr '\\0' ' '",
    )
    assert code == 0, out
    assert (tmp_path / "pod" / "sys/fs/cgroup/memory.max").read_text() == "190G\n"
    assert (tmp_path / "pod" / "dev/shm" / marker).is_file()
    assert (tmp_path / "pod" / "deps/y").is_file()
    assert "job-0\n" in out
    assert "Read-only file system" in out
    assert "refused" in out
    assert "no-work" in out  # the host's folders are not in the machine
    assert "/bin/bash -c" in out  # the script's shell is PID 1 of the pod
    assert mountinfo() == before
    # the pod's /dev/shm is its own: its file is not on the host's (whose other entries belong to
    # whatever else runs here, e.g. the PostgreSQL servers of other tests)
    assert marker not in os.listdir("/dev/shm")
    if host_limit is not None:
        assert HOST_CGROUP_LIMIT.read_text() == host_limit


def _training() -> TrainingSpec:
    return TrainingSpec(
        model_name="qwen3-30b-a3b",
        run_name="rl",
        base_output_directory="gs://bkt/out/",
        load_parameters_path="gs://bkt/ckpt/0/items",
        num_batches=2,
    )


def test_timeout_kills_every_process_of_the_machine(cli: Cli, tmp_path: Path) -> None:
    marker = f"{os.getpid() % 89 + 10}{int(time.time()) % 97}"
    os.environ["TPU_RL_SANDBOX_MACHINE_TIMEOUT"] = "1"
    try:
        start = time.monotonic()
        code, out = run_pod(
            cli, tmp_path / "pod", f"(sleep 3{marker} &) ; setsid sleep 3{marker} & sleep 3{marker}"
        )
    finally:
        del os.environ["TPU_RL_SANDBOX_MACHINE_TIMEOUT"]
    # killed at its 1 s timeout, long before its sleeps (over 300 s) would have ended
    assert time.monotonic() - start < 300
    assert code == 137
    assert "killed after 1s" in out
    wait_for(lambda: processes_with(f"sleep 3{marker}") == [], what="the killed pod's sleeps to be gone")


def test_cancellation_kills_the_machine(cli: Cli, tmp_path: Path) -> None:
    deadline = time.monotonic() + 1
    pod = PodHost(tmp_path / "pod", services(cli, lambda: time.monotonic() > deadline), "job")
    start = time.monotonic()
    code = pod.run(["/bin/bash", "-c", "sleep 60"], None, 1, 2, pod.base_env(), "/deps")
    assert code == 137
    assert time.monotonic() - start < 55  # killed, not left to its 60 s sleep


# =================================================================== image patches
def _replacements(patch: str) -> list[tuple[str, str]]:
    """``(old, new)`` of every ``.replace(old, new)`` in a patch's code."""
    pairs = []
    for node in ast.walk(ast.parse(patch)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "replace"
        ):
            old, new = (ast.literal_eval(a) for a in node.args)
            pairs.append((old, new))
    return pairs


def _substitutions(patch: str) -> list[tuple[str, str]]:
    """``(pattern, replacement)`` of every ``re.sub`` in a patch's code."""
    pairs = []
    for node in ast.walk(ast.parse(patch)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sub":
            pairs.append((ast.literal_eval(node.args[0]), ast.literal_eval(node.args[1])))
    return pairs


def test_patch_targets_hold_the_text_the_patches_replace() -> None:
    tunix = _replacements(TUNIX_RESHARD_PATCH)
    assert tunix, "the tunix patch replaces nothing"
    for old, _ in tunix:
        assert old in pod_image.VLLM_SAMPLER, f"tunix patch target gone: {old!r}"
    adafactor = _substitutions(ADAFACTOR_PATCH)
    assert adafactor, "the Adafactor patch substitutes nothing"
    for pattern, _ in adafactor:
        assert re.search(pattern, pod_image.UTILS_RL), f"Adafactor patch target gone: {pattern!r}"
    assert pod_image.UTILS_RL_PATH in ADAFACTOR_PATCH


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        (TUNIX_RESHARD_PATCH, pod_image.VLLM_SAMPLER_PATH),
        (ADAFACTOR_PATCH, pod_image.UTILS_RL_PATH),
    ],
    ids=["tunix-reshard", "adafactor"],
)
def test_patch_runs_for_real_in_the_pod_and_changes_its_file(
    cli: Cli, tmp_path: Path, patch: str, path: str
) -> None:
    root = tmp_path / "pod"
    code, out = run_pod(cli, root, quote_all(["python3", "-c", patch]))
    assert code == 0, out
    original = pod_image.POD_FILES[path]
    patched = (root / path.lstrip("/")).read_text()
    assert patched != original, "the patch left the file unchanged"
    for old, new in _replacements(patch):
        assert old not in patched
        assert new in patched
    for pattern, new in _substitutions(patch):
        assert not re.search(pattern, patched)
        assert new in patched
    compile(patched, path, "exec")  # still Python


def test_patched_tunix_module_imports_with_the_new_default(cli: Cli, tmp_path: Path) -> None:
    check = "import tunix.generate.vllm_sampler as v; print(v.VllmConfig().reshard_chunk_size)"
    code, out = run_pod(
        cli,
        tmp_path / "pod",
        " && ".join([quote_all(["python3", "-c", TUNIX_RESHARD_PATCH]), quote_all(["python3", "-c", check])]),
    )
    assert (code, out.strip().splitlines()[-1]) == (0, "4"), out


def test_pod_reads_the_secret_with_google_auth(cli: Cli, tmp_path: Path) -> None:
    from airflow_provider_tpu_rl.render.shell import hf_token_from_secret_manager

    read = hf_token_from_secret_manager("projects/proj/secrets/hf/versions/latest")
    code, out = run_pod(
        cli, tmp_path / "pod", f'{read} && echo "len=${{#HF_TOKEN}}" && env | grep -c HF_TOKEN='
    )
    assert code == 0, out
    assert "len=8\n1\n" in out
    missing = hf_token_from_secret_manager("projects/proj/secrets/none/versions/latest")
    code, out = run_pod(cli, tmp_path / "pod2", f"{missing} && echo reached")
    assert code == 1
    assert "requests.exceptions.HTTPError: 404 Client Error: Not Found for url:" in out
    assert "reached" not in out
    code, out = run_pod(
        cli, tmp_path / "pod3", "python3 -c 'import requests; print(1)' && curl -sSf https://x.org"
    )
    assert code == 6
    assert "curl: (6) Could not resolve host: x.org" in out


# ========================================================================= the VM
def test_vm_venv_activation_is_real_bash(cli: Cli, tmp_path: Path) -> None:
    root = tmp_path / "vm"
    code, out = run_vm(cli, root, "set -euo pipefail\ncurl -LsSf https://astral.sh/uv/install.sh | sh\n")
    assert code == 0, out
    assert (root / "home/alice/.local/bin/uv").is_file()
    script = """set -euo pipefail
type uv 2>&1 || echo no-uv-yet
source "${HOME}/.local/bin/env"
uv --version
uv venv --python 3.12 --seed v1
before="$PATH"
source v1/bin/activate
echo "venv=$VIRTUAL_ENV python=$(command -v python3)"
python3 -m pip --version
python3 -m maxtext.checkpoint_conversion.to_maxtext model_name=x || echo "rc=$?"
deactivate
[ "$PATH" = "$before" ] && echo restored
bash v1/bin/activate || echo "direct=$?"
uv venv v1 || echo "again=$?"
uv frobnicate || echo "unknown=$?"
"""
    code, out = run_vm(cli, root, script)
    assert code == 0, out
    assert "no-uv-yet" in out
    assert "uv 0.9.7" in out
    assert "venv=/home/alice/v1 python=/home/alice/v1/bin/python3" in out
    assert "pip 25.1.1" in out
    assert "No module named 'maxtext'" in out
    assert "rc=1" in out
    assert "restored" in out
    assert "You must source this script" in out
    assert "direct=33" in out
    assert "A directory already exists at: v1" in out
    assert "again=2" in out
    assert "unrecognized subcommand 'frobnicate'" in out
    assert "unknown=2" in out


@pytest.mark.parametrize(
    ("machine_type", "tpu_vfio", "expected"),
    [
        ("ct6e-standard-8t", True, "0 1 2 3 4 5 6 7 vfio"),
        ("ct6e-standard-4t", True, "0 1 2 3 vfio"),
        ("ct6e-standard-8t", False, "no-vfio"),  # a boot disk without Cloud TPU's udev rule
        ("n2-highmem-32", True, "no-vfio"),  # no TPU chip to bind
    ],
)
def test_a_tpu_vm_has_its_chips_as_vfio_devices_only_with_the_tpu_images_rule(
    cli: Cli, tmp_path: Path, machine_type: str, tpu_vfio: bool, expected: str
) -> None:
    vm = VmHost(
        tmp_path / "vm", services(cli), "vm-test", "alice", "proj", ["cloud-platform"],
        machine_type=machine_type, tpu_vfio=tpu_vfio,
    )  # fmt: skip
    output: list[str] = []
    script = "if [ -d /dev/vfio ]; then ls /dev/vfio | sort | tr '\\n' ' '; else echo no-vfio; fi"
    assert vm.run_session(["bash", "-s"], script.encode(), output.append, output.append, {}) == 0
    assert "".join(output).strip() == expected


def test_vm_sudo_and_apt_rules(cli: Cli, tmp_path: Path) -> None:
    script = """apt-get update || echo "user=$?"
sudo apt-get install cmake < /dev/null || echo "noyes=$?"
sudo DEBIAN_FRONTEND=noninteractive apt-get install -y cmake
sudo -Z true || echo "badopt=$?"
sudo no-such-tool || echo "missing=$?"
sudo env | grep -E '^(USER|SUDO_USER|DEBIAN_FRONTEND)=' | sort
sudo X=1 env | grep '^X='
python3 -c 'import sys; print(sys.version_info[0])'
hostname
"""
    code, out = run_vm(cli, tmp_path / "vm", script)
    assert code == 0, out
    assert "are you root?" in out
    assert "user=100" in out
    assert "Abort." in out
    assert "noyes=1" in out
    assert "Setting up cmake" in out
    assert "sudo: invalid option -- 'Z'" in out
    assert "badopt=1" in out
    assert "sudo: no-such-tool: command not found" in out
    assert "missing=1" in out
    assert "SUDO_USER=alice\nUSER=root\n" in out
    assert "X=1\n" in out
    assert "\n3\n" in out
    assert "vm-test\n" in out


def test_vm_gcloud_secret_needs_the_cloud_platform_scope(cli: Cli, tmp_path: Path) -> None:
    read = "gcloud secrets versions access latest --secret=hf --project=proj"
    code, out = run_vm(cli, tmp_path / "vm", f'HF_TOKEN=$({read})\necho "got=${{#HF_TOKEN}}"\n')
    assert (code, "got=8" in out) == (0, True), out
    code, out = run_vm(cli, tmp_path / "vm2", f"set -e\nHF_TOKEN=$({read})\necho after\n", scopes=())
    assert code == 1
    assert "insufficient authentication scopes" in out
    assert "after" not in out


def test_a_held_job_goes_on_by_itself_after_the_settings_hold_seconds(tmp_path: Path) -> None:
    """A test that forgets its hold file (or is killed) never stalls a job longer than
    ``hold_seconds``; a cancelled job stops holding at once."""
    from tpu_rl_sandbox.machines import maxtext_sim
    from tpu_rl_sandbox.world.settings import SandboxSettings

    assert SandboxSettings().hold_seconds == 120.0
    hold = tmp_path / "hold"
    hold.write_text("held")

    def runner(cancelled: bool) -> maxtext_sim.MaxTextRunner:
        ctx = maxtext_sim.SimContext(
            router=None,  # type: ignore[arg-type]  # the hold touches no storage
            write=lambda text: None,
            platform="gke",
            seed="t",
            hold_file=str(hold),
            hold_seconds=0.3,
            sleep=time.sleep,
            cancelled=lambda: cancelled,
        )
        return maxtext_sim.MaxTextRunner(ctx, "maxtext.trainers.post_train.rl.train_rl", [], {})

    started = time.monotonic()
    runner(False).hold_before_commit()
    assert time.monotonic() - started >= 0.3
    assert hold.exists()
    with pytest.raises(maxtext_sim.Cancelled):
        runner(True).hold_before_commit()
