"""The single-host pipeline's commands (render/tpu_vm.py): the TPU VM's create argv of each capacity.

The stage scripts and the VM commands against the tutorial's own text are
tests/golden/test_tpu_vm_tutorial.py; what a first real run needs of them (one kept SSH key, the VM's
service account granted), tests/render/test_plan.py."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from airflow_provider_tpu_rl.render import tpu_vm
from airflow_provider_tpu_rl.render.plan import tpu_vm_plan
from airflow_provider_tpu_rl.spec import tpu_vm_pipeline_from_conf

VM_CONF = {"project": "tpu-proj-123", "zone": "us-east5-b", "vm_name": "llama-vm", "bucket": "rl-bucket-1"}
COMMON = [
    "--zone=us-east5-b",
    "--project=tpu-proj-123",
    "--machine-type=ct6e-standard-8t",
    "--image-project=ubuntu-os-accelerator-images",
    "--image-family=ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
    "--boot-disk-size=200GB",
    "--boot-disk-type=hyperdisk-balanced",  # v6e takes no Persistent Disk (spec/cluster.py)
]
# the golden argv of each capacity (before the service account, scopes and labels)
CREATE = {
    "on-demand": [
        "gcloud", "compute", "instances", "create", "llama-vm", *COMMON,
        "--maintenance-policy=TERMINATE",
        "--provisioning-model=STANDARD",
        "--reservation-affinity=none",
    ],
    "reservation": [
        "gcloud", "compute", "instances", "create", "llama-vm", *COMMON,
        "--maintenance-policy=TERMINATE",
        "--instance-termination-action=DELETE",
        "--provisioning-model=RESERVATION_BOUND",
        "--reservation-affinity=specific",
        "--reservation=v6e8-res",
    ],
    "spot": [
        "gcloud", "compute", "instances", "create", "llama-vm", *COMMON,
        "--maintenance-policy=TERMINATE",
        "--provisioning-model=SPOT",
        "--instance-termination-action=STOP",
    ],
    "flex-start": [
        "gcloud", "alpha", "compute", "instances", "create", "llama-vm", *COMMON,
        "--maintenance-policy=TERMINATE",
        "--provisioning-model=FLEX_START",
        "--max-run-duration=72h",
        "--instance-termination-action=DELETE",
        "--reservation-affinity=none",
    ],
}  # fmt: skip


def _vm_pipeline(capacity: str, **conf: Any) -> Any:
    reservation = "v6e8-res" if capacity == "reservation" else ""
    return tpu_vm_pipeline_from_conf({**VM_CONF, "capacity": capacity, "reservation": reservation, **conf})


@pytest.mark.parametrize("capacity", list(CREATE))
def test_the_tpu_vm_create_of_each_capacity(capacity: str) -> None:
    create = tpu_vm.create_vm(_vm_pipeline(capacity).vm)
    assert list(create.argv) == [*CREATE[capacity], "--scopes=cloud-platform"]


def test_the_plan_creates_the_tpu_vm_with_its_capacity() -> None:
    (create,) = [s.command for s in tpu_vm_plan(_vm_pipeline("spot")) if s.task_id == "create_vm"][:1]
    assert "--provisioning-model=SPOT" in create.argv
    assert "spot capacity" in create.description


def test_the_flex_start_run_time_is_max_vm_hours() -> None:
    create = tpu_vm.create_vm(_vm_pipeline("flex-start", max_vm_hours=100).vm)
    assert "--max-run-duration=100h" in create.argv


def test_the_tpu_vm_defaults_to_on_demand() -> None:
    create = tpu_vm.create_vm(tpu_vm_pipeline_from_conf(VM_CONF).vm)
    assert list(create.argv) == [*CREATE["on-demand"], "--scopes=cloud-platform"]
    assert create.description.endswith("on-demand capacity)")


# -- an earlier try's container of the stage's name (issue 54, item 2) ---------------------------
RUN = "tpu_rl_tpu_vm_pipeline/manual__retry"
# Stand-ins for the VM's sudo, docker and gcloud: sudo runs its command, docker answers `inspect`
# with $INSPECT (none: "No such object"), `wait` with $WAITED and records every call.
STUBS = {
    "sudo": '#!/bin/bash\nwhile [[ "$1" == -* ]]; do shift; done\nexec "$@"\n',
    "gcloud": "#!/bin/bash\necho hf_stub_token\n",
    "docker": (
        "#!/bin/bash\n"
        'echo "$*" >>"$CALLS"\n'
        'case "$1" in\n'
        '  inspect) [ -n "${INSPECT:-}" ] || { echo "Error: No such object: ${@: -1}" >&2; exit 1; }\n'
        '           echo "$INSPECT" ;;\n'
        "  logs) echo 'Train step 7 (from the container)' ;;\n"
        '  wait) [ "$WAITED" != gone ] || { echo "Error response from daemon: No such container: ${@: -1}" >&2; exit 1; }\n'
        '        echo "$WAITED" ;;\n'
        "esac\n"
    ),
}


def _run_train_script(tmp_path: Any, inspect: str, waited: str = "0") -> tuple[int, str, list[str]]:
    """The rendered container train script under bash with the stubs: exit code, stderr, docker's calls."""
    import os
    import subprocess

    pipeline = tpu_vm_pipeline_from_conf({**VM_CONF, "run_name": "rn-1"}, run_id="manual__retry")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    calls.touch()
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "CALLS": str(calls),
        "INSPECT": inspect,
        "WAITED": waited,
    }
    done = subprocess.run(
        ["bash", "-s"],
        input=tpu_vm.container_train_script(pipeline),
        capture_output=True,
        text=True,
        env={**env, "HOME": os.environ.get("HOME", "/tmp")},
        timeout=60,
        check=False,
    )
    return done.returncode, done.stderr, calls.read_text().splitlines()


DIRECTORY = "gs://rl-bucket-1/llama3.1-8b-Instruct/post-train/rn-1/"


def test_the_container_is_labelled_with_its_run_directory_and_run() -> None:
    pipeline = tpu_vm_pipeline_from_conf({**VM_CONF, "run_name": "rn-1"}, run_id="manual__retry")
    script = tpu_vm.container_train_script(pipeline)
    (run,) = [line for line in script.splitlines() if " docker run " in line]
    assert f"--label=io.tpu-rl.run-dir={DIRECTORY}" in run.split()
    assert f"--label=io.tpu-rl.run-id={RUN}" in run.split()
    # no line of any container stage force-removes a container (one running would be stopped)
    for stage in ("convert", "train", "export"):
        machine = "cpu" if stage != "train" else "tpu"
        text, _ = tpu_vm.stage_script(pipeline, stage, machine)
        for line in text.splitlines():
            tokens = shlex.split(line)
            if any(tokens[at : at + 2] == ["docker", "rm"] for at in range(len(tokens))):
                assert not {"--force", "-f"} & set(tokens), line


def test_a_running_container_of_this_run_is_followed_and_its_exit_status_is_the_stages(tmp_path: Any) -> None:
    code, err, calls = _run_train_script(
        tmp_path, f"true 2026-03-01T00:00:00.5Z {DIRECTORY} {RUN}", waited="17"
    )
    assert code == 17
    assert calls[0].startswith("inspect ")
    assert sorted(calls[1:]) == ["logs --follow tpu-rl-train", "wait tpu-rl-train"]  # nothing removed or run
    assert "tpu-rl: following container tpu-rl-train of this run (started 2026-03-01T00:00:00.5Z)" in err


def test_a_followed_container_whose_exit_status_is_lost_fails_the_stage_in_its_own_line(
    tmp_path: Any,
) -> None:
    """It ended (and, with --rm, was removed) between the look and the wait: nothing is started."""
    code, err, calls = _run_train_script(tmp_path, f"true 2026-03-01T00:00:00Z {DIRECTORY} {RUN}", "gone")
    assert code == 1
    assert "run" not in [call.split()[0] for call in calls]
    (line,) = [text for text in err.splitlines() if text.startswith(tpu_vm.UNSEEN_EXIT)]
    assert f"a retry looks at {DIRECTORY} again" in line


@pytest.mark.parametrize(
    "identity",
    [
        f"true 2026-03-01T00:00:00Z gs://rl-bucket-1/llama3.1-8b-Instruct/post-train/other/ {RUN}",
        f"true 2026-03-01T00:00:00Z {DIRECTORY} tpu_rl_tpu_vm_pipeline/manual__other",
        "true 2026-03-01T00:00:00Z  ",  # started without the labels (by hand, or an older provider)
    ],
)
def test_a_running_container_of_another_run_is_refused_in_one_line_and_left_alone(
    tmp_path: Any, identity: str
) -> None:
    code, err, calls = _run_train_script(tmp_path, identity)
    assert code == 3
    assert [call.split()[0] for call in calls] == ["inspect"]  # not removed, nothing started
    (line,) = [text for text in err.splitlines() if text.startswith(tpu_vm.REFUSED_CONTAINER)]
    assert "container tpu-rl-train on VM llama-vm is running for run " in line
    assert f"not {DIRECTORY} of this run" in line
    assert "(sudo docker rm --force tpu-rl-train on llama-vm)" in line


def test_a_container_that_is_not_running_is_removed_and_a_new_one_started(tmp_path: Any) -> None:
    code, _, calls = _run_train_script(tmp_path, f"false 2026-03-01T00:00:00Z {DIRECTORY} {RUN}")
    assert code == 0
    assert [call.split()[0] for call in calls] == ["inspect", "rm", "run"]
    assert calls[1] == "rm tpu-rl-train"  # without --force: a running one is never stopped


def test_without_a_container_of_its_name_the_stage_starts_one(tmp_path: Any) -> None:
    code, _, calls = _run_train_script(tmp_path, "")
    assert code == 0
    assert [call.split()[0] for call in calls] == ["inspect", "run"]


@pytest.mark.parametrize(
    ("cpu_machine_type", "disk_type"), [(None, "pd-balanced"), ("n4-highmem-32", "hyperdisk-balanced")]
)
def test_every_vm_create_names_the_boot_disk_type_its_series_takes(
    cpu_machine_type: str | None, disk_type: str
) -> None:
    """Never Compute Engine's default (pd-standard: slow, and refused by Hyperdisk-only series): the
    CPU VM's type follows ``cpu_machine_type``, the TPU VM's is v6e's Hyperdisk Balanced."""
    conf = {**VM_CONF, **({"cpu_machine_type": cpu_machine_type} if cpu_machine_type else {})}
    pipeline = tpu_vm_pipeline_from_conf(conf)
    cpu = tpu_vm.create_cpu_vm(pipeline.cpu_vm).argv
    assert [a for a in cpu if a.startswith("--boot-disk-type")] == [f"--boot-disk-type={disk_type}"]
    tpu = tpu_vm.create_vm(pipeline.vm).argv
    assert [a for a in tpu if a.startswith("--boot-disk-type")] == ["--boot-disk-type=hyperdisk-balanced"]
