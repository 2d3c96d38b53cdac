"""The pure parts of reading a claim's job where it runs (``records/writers.py``): what the VM probe
prints, how a run directory's writes tell its pace, the command that stops a job by hand."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.records.run_dirs import WriterClaim
from airflow_provider_tpu_rl.records.writers import (
    UNREACHABLE,
    VM_PROBE_SCRIPT,
    VmWriter,
    directory_activity,
    parse_vm_probe,
    stop_command,
    vm_stop_script,
)
from airflow_provider_tpu_rl.toolchain.process import CommandResult

DIRECTORY = "gs://bkt/llama3.1-8b-Instruct/post-train/dup-rn/"
TRAIN = [
    "python3", "-m", "maxtext.trainers.post_train.rl.train_rl", "model_name=llama3.1-8b",
    "load_parameters_path=gs://bkt/llama3.1-8b-Instruct/mt-format/0/items",
    "run_name=dup-rn", "base_output_directory=gs://bkt/llama3.1-8b-Instruct/post-train/", "num_batches=3",
]  # fmt: skip


def test_the_probe_finds_the_container_and_the_processes_writing_the_directory() -> None:
    other = [word.replace("dup-rn", "other-run") for word in TRAIN]
    lines = [
        f"container tpu-rl-train true {json.dumps(TRAIN, separators=(',', ':'))}",
        f"container tpu-rl-export true {json.dumps(['python3', '-m', 'x', 'run_name=other'])}",
        f"process 4242 {shlex.join(TRAIN)}",
        f"process 4343 {shlex.join(other)}",  # another run's trainer on the same VM: not ours
        "probe-done",
    ]
    found = parse_vm_probe(lines, DIRECTORY)
    assert found is not None
    assert (found.containers, found.pids) == (("tpu-rl-train",), (4242,))
    assert found.describe() == "container tpu-rl-train, process 4242"
    stop = vm_stop_script(found)
    assert "sudo -n docker rm --force tpu-rl-train" in stop
    assert "sudo -n kill -KILL 4242 " in stop
    assert stop.endswith(VM_PROBE_SCRIPT)


def test_a_stopped_container_or_a_probe_cut_short_is_not_a_writer() -> None:
    stopped = parse_vm_probe([f"container tpu-rl-train false {json.dumps(TRAIN)}", "probe-done"], DIRECTORY)
    assert stopped is not None
    assert not stopped.any
    assert parse_vm_probe([f"container tpu-rl-train true {json.dumps(TRAIN)}"], DIRECTORY) is None  # no end


@pytest.mark.parametrize(
    "script", [VM_PROBE_SCRIPT, vm_stop_script(parse_vm_probe(["probe-done"], DIRECTORY))]
)  # type: ignore[arg-type]
def test_the_probe_scripts_are_valid_bash(script: str) -> None:
    result = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True, check=False)
    assert result.returncode == 0, result.stderr


def test_a_directorys_pace_is_the_longest_gap_between_two_committed_checkpoints() -> None:
    root = "bkt/llama/post-train/dup-rn/"
    writes = [
        (f"{root}checkpoints/actor/10/model_params/a", 100.0),
        (f"{root}checkpoints/actor/10/commit_success.txt", 104.0),
        (f"{root}checkpoints/actor/20/model_params/a", 160.0),
        (f"{root}checkpoints/actor/20/commit_success.txt", 164.0),
        (f"{root}checkpoints/actor/30/commit_success.txt", 194.0),
        (f"{root}tensorboard/events", 200.0),
    ]
    activity = directory_activity(writes)
    assert (activity.newest, activity.period, activity.objects) == (200.0, 60.0, 6)
    assert activity.quiet_for(now=260.0) == 60.0
    single = directory_activity(writes[:2])
    assert single.period is None  # one checkpoint: no pace to measure
    assert directory_activity([]).quiet_for() is None


def test_how_to_stop_a_job_by_hand() -> None:
    gke = WriterClaim("d/r", "train-abc123", "proj/us-east5/c1", 0.0)
    assert stop_command(gke) == (
        "gcluster job cancel train-abc123 --project=proj --cluster=c1 --location=us-east5"
    )
    vm = WriterClaim("d/r", "vm-1/train", "proj/us-east5-b/vm-1", 0.0)
    argv = shlex.split(stop_command(vm))
    assert argv[:6] == ["gcloud", "compute", "ssh", "vm-1", "--zone=us-east5-b", "--project=proj"]
    assert argv[6].startswith("--command=sudo docker rm --force tpu-rl-train tpu-rl-convert tpu-rl-export")


def test_a_vm_probe_refused_by_a_booting_guest_answers_unreachable_without_waiting(tmp_path: Path) -> None:
    """The stage's own SSH waits for a booting guest's sshd; the probe only looks: not kept waiting."""
    calls: list[dict[str, Any]] = []

    class Hook:
        def ssh_key_file(self) -> Path:
            return tmp_path / "key"

        def run(self, command: Any, **kwargs: Any) -> CommandResult:
            calls.append({"argv": command.argv[:3], **kwargs})
            if command.argv[:3] == ("gcloud", "compute", "ssh"):
                return CommandResult(255, ("ssh: connect to host 34.1.2.3 port 22: Connection refused",))
            return CommandResult(0, ("RUNNING",))

    claim = WriterClaim("d/r", "vm-1/train", "proj/us-east5-b/vm-1", 0.0, "vm")
    state = VmWriter(claim, Hook(), "gs://b/run").state()  # type: ignore[arg-type]
    assert state.state == UNREACHABLE
    (probe,) = [c for c in calls if c["argv"] == ("gcloud", "compute", "ssh")]
    assert probe["wait_for_sshd"] is False
