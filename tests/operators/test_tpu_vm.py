"""The single-host pipeline's operators against the sandbox: CPU VM → install → convert → TPU VM →
install → train → TPU VM deleted → export → CPU VM deleted."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from airflow_provider_tpu_rl.assets import converted_checkpoint_asset
from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import CommandError
from airflow_provider_tpu_rl.operators.gke import EnsureBucketOperator, HfTokenSecretOperator
from airflow_provider_tpu_rl.operators.tpu_vm import (
    CpuVmCreateOperator,
    CpuVmDeleteOperator,
    TpuVmCreateOperator,
    TpuVmDeleteOperator,
    TpuVmStageOperator,
    stage_lineage,
)
from airflow_provider_tpu_rl.records.lease import ClusterLeaseHook, vm_lease_name
from airflow_provider_tpu_rl.render import gke, tpu_vm
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID, tpu_vm_pipeline_from_conf
from tests.support.compat import capture_task_logs
from tests.support.outlets import outlet_events
from tests.support.sandbox_run import TPU_VM_CONVERSION_TASKS, SandboxRun, printed_rewards
from tpu_rl_sandbox.world.settings import update_settings

RUN_ID = "manual__2026-03-01T00:00:00+00:00"
START = datetime(2030, 1, 1, tzinfo=UTC)


def _execute(sb: SandboxRun, factory: Any, conf: dict[str, Any], **kwargs: Any) -> Any:
    return _execute_op(sb, factory, conf, **kwargs)[1]


def _execute_op(
    sb: SandboxRun, factory: Any, conf: dict[str, Any], events: Any = None, **kwargs: Any
) -> tuple[Any, Any]:
    """The operator and what its execute returned (``events``: the context's outlet_events)."""
    op = sb.operator(factory, dag_id=TPU_VM_DAG_ID, **kwargs)
    context = sb.context(op, conf, run_id=RUN_ID, start_date=START)
    if events is not None:
        context["outlet_events"] = events
    return op, op.execute(context)


def _updated(sb: SandboxRun, prefix: str) -> dict[str, datetime]:
    """Object name → last write time, as the emulator reports it."""
    out = {}
    for info in sb.api.iter_objects(sb.bucket, prefix):
        seconds, _, fraction = info.updated.rstrip("Z").partition(".")
        out[info.name] = datetime.fromisoformat(f"{seconds}.{(fraction or '0').ljust(6, '0')[:6]}+00:00")
    return out


def _delete_calls(sb: SandboxRun) -> list[dict[str, Any]]:
    return [c for c in sb.calls() if c["argv"][:3] == ["compute", "instances", "delete"]]


def test_the_whole_vm_pipeline_leaves_checkpoint_and_export_in_gcs(sb: SandboxRun) -> None:
    conf = sb.tpu_vm_conf()
    pipeline = tpu_vm_pipeline_from_conf(conf, run_id=RUN_ID)
    _execute(sb, EnsureBucketOperator, conf, task_id="ensure_bucket")
    _execute(sb, HfTokenSecretOperator, conf, task_id="sync_hf_token")

    vm_key = f"{sb.project}/{conf['zone']}/{sb.vm}"
    expires = int(START.timestamp()) + 72 * 3600  # max_vm_hours defaults to 72
    wanted = {"tpu-rl-managed": "true", "tpu-rl-expires": str(expires), "tpu-rl-bucket": sb.bucket}

    cpu_vm = f"{sb.vm}-cpu"
    cpu_key = f"{sb.project}/{conf['zone']}/{cpu_vm}"
    stages: dict[str, dict[str, Any]] = {}
    ops: dict[str, TpuVmStageOperator] = {}
    checkpoint_asset, events = converted_checkpoint_asset(conf["model"]), outlet_events()
    with capture_task_logs() as logs:
        assert _execute(sb, CpuVmCreateOperator, conf, task_id="create_cpu_vm") == cpu_vm
        stages["install_cpu_vm"] = _execute(sb, TpuVmStageOperator, conf, task_id="install_cpu_vm")
        ops["convert"], stages["convert_to_maxtext"] = _execute_op(
            sb, TpuVmStageOperator, conf, events, task_id="convert_to_maxtext", outlets=[checkpoint_asset]
        )
        assert _execute(sb, TpuVmCreateOperator, conf, task_id="create_vm") == sb.vm

        vm = sb.state("vms")[vm_key]
        assert wanted.items() <= vm["labels"].items()
        assert vm["machineType"] == "ct6e-standard-8t"
        assert vm["reservationAffinity"] == {"type": "specific", "reservation": "res-8"}
        record = json.loads(sb.api.download(sb.bucket, gke.resource_record_object(sb.vm)))
        assert {k: record[k] for k in ("kind", "name", "expires_at", "keep")} == {
            "kind": "vm",
            "name": sb.vm,
            "expires_at": expires,
            "keep": False,
        }
        for stage, task_id in (("install", "install_maxtext"), ("train", "train")):
            ops[stage], stages[stage] = _execute_op(sb, TpuVmStageOperator, conf, task_id=task_id)
        deleted = _execute(sb, TpuVmDeleteOperator, conf, task_id="delete_vm")
        ops["export"], stages["export"] = _execute_op(
            sb, TpuVmStageOperator, conf, task_id="export_to_huggingface"
        )
    output = "\n".join(str(entry.get("event")) for entry in logs)
    (span,) = deleted.pop("billed")["spans"]  # the TPU VM's one RUNNING span, by its clock
    assert (span["machine"], span["chips"], span["ended_by"]) == (sb.vm, 8, "delete")
    # the CPU VM (the export's) still holds the grants both VMs hold
    assert deleted == {"vm_name": sb.vm, "deleted": True, "bucket_deleted": False, "removed_grants": []}
    # What each stage read and wrote, kept for OpenLineage (install: nothing), and the converted
    # checkpoint's asset event once the conversion was verified
    for stage, op in ops.items():
        assert op._lineage == stage_lineage(pipeline, stage)
    assert ops["install"]._lineage is None
    assert events[checkpoint_asset].extra["checkpoint_uri"] == pipeline.conversion.output_directory
    assert events[checkpoint_asset].extra["reused"] is False
    assert vm_key not in sb.state("vms")

    # The CPU VM: a CPU machine type, no reservation, the TPU VM's labels (the janitor's).
    cpu = sb.state("vms")[cpu_key]
    assert cpu["machineType"] == "n2-highmem-32"
    assert cpu["reservationAffinity"] == {"type": "any", "reservation": None}
    assert wanted.items() <= cpu["labels"].items()
    assert stages["convert_to_maxtext"]["vm_name"] == stages["export"]["vm_name"] == cpu_vm
    assert stages["train"]["vm_name"] == sb.vm

    # Which VM ran what: the conversions on the CPU VM, training alone on the TPU VM.
    history = sb.state("vm_history")
    (tpu_life,) = history[vm_key]
    (cpu_life,) = history[cpu_key]
    assert [p["module"] for p in tpu_life["programs"]] == ["maxtext.trainers.post_train.rl.train_rl"]
    assert [p["module"] for p in cpu_life["programs"]] == [
        "maxtext.checkpoint_conversion.to_maxtext",
        "maxtext.checkpoint_conversion.to_huggingface",
    ]
    # The default runtime: both VMs ran the post-training image's container, one MaxText release
    # converting, training and exporting (issue 46, item 4).
    assert stages["install"]["runtime"] == stages["train"]["runtime"] == "container"
    assert [p["runtime"] for p in tpu_life["programs"]] == ["container"]
    assert [p["runtime"] for p in cpu_life["programs"]] == ["container", "container"]
    assert len({p["maxtext_version"] for p in tpu_life["programs"] + cpu_life["programs"]}) == 1
    # The TPU VM lived only around training: created after the converted checkpoint was committed,
    # deleted before the export wrote anything.
    converted_marker = (
        pipeline.conversion.output_directory.removeprefix(f"gs://{sb.bucket}/") + "0/commit_success.txt"
    )
    converted_at = _updated(sb, converted_marker)[converted_marker]
    assert converted_at.timestamp() < tpu_life["created"] < tpu_life["deleted"]
    export_written = _updated(sb, pipeline.gcs_export.removeprefix(f"gs://{sb.bucket}/") + "/")
    assert tpu_life["deleted"] < min(export_written.values()).timestamp()

    # The token reached MaxText's containers only (docker run, by name), on both VMs.
    tool_calls = sb.vm_tool_calls(cpu_vm)
    gcloud_calls = [c for c in tool_calls if c["tool"] == "gcloud"]
    maxtext = [c for c in tool_calls if c["tool"] == "docker" and c["argv"][1:2] == ["run"]]
    assert gcloud_calls
    assert len(maxtext) == 2
    assert not [c["argv"] for c in gcloud_calls if "HF_TOKEN" in c["env_names"]]
    assert all("HF_TOKEN" in c["env_names"] for c in maxtext)

    # Training: the rewards reported are those MaxText printed over SSH.
    rewards = printed_rewards(output)
    metrics = stages["train"]["metrics"]
    assert set(rewards) == {"pre", "post"}
    assert metrics["pre"]["mean_reward"] == rewards["pre"]
    assert metrics["post"]["mean_reward"] == rewards["post"]
    assert metrics["last_step"] == 3
    assert stages["train"]["num_test_batches"] == 10  # the Llama preset's (the tutorial's)
    summary = f"Training: mean reward before {rewards['pre']}, after {rewards['post']}"
    assert summary in output
    assert stages["train"]["checkpoint_uri"] == pipeline.gcs_actor_checkpoint + "/model_params/"
    # one training attempt, from the start to the last step, recorded with its run directory
    (attempt,) = stages["train"]["attempts"]
    assert (attempt["from_step"], attempt["reached_step"], attempt["job"]) == (0, 3, f"{sb.vm}/train")
    assert attempt["started_at"] < attempt["ended_at"]

    # The final checkpoint is in GCS, its commit marker written last.
    bucket_prefix = f"gs://{sb.bucket}/"
    step_prefix = pipeline.gcs_actor_checkpoint.removeprefix(bucket_prefix) + "/"
    written = _updated(sb, step_prefix)
    marker = step_prefix + "commit_success.txt"
    assert marker in written
    assert any(name.startswith(step_prefix + "model_params/") for name in written)
    assert step_prefix + "_CHECKPOINT_METADATA" in written
    assert max(when for name, when in written.items() if name != marker) < written[marker]

    # The Hugging Face export is complete in GCS: config, tokenizer, index and every shard it lists.
    export_prefix = pipeline.gcs_export.removeprefix(bucket_prefix) + "/"
    assert stages["export"]["export_uri"] == pipeline.gcs_export + "/"
    exported = set(sb.objects(prefix=export_prefix))
    assert {export_prefix + "config.json", export_prefix + "tokenizer_config.json"} <= exported
    index = json.loads(sb.api.download(sb.bucket, export_prefix + "model.safetensors.index.json"))
    shards = {export_prefix + shard for shard in index["weight_map"].values()}
    assert shards
    assert shards <= exported

    deleted = _execute(sb, CpuVmDeleteOperator, conf, task_id="delete_cpu_vm")
    removed = deleted.pop("removed_grants")  # the last VM to hold them: the grants go
    assert sorted(text.split(" ")[0] for text in removed) == [gke.SECRET_ACCESSOR, gke.STORAGE_OBJECT_ADMIN]
    assert deleted == {"vm_name": cpu_vm, "deleted": True, "bucket_deleted": False}
    assert cpu_key not in sb.state("vms")
    assert not sb.layout.vm_dir(sb.vm).exists()
    assert not sb.layout.vm_dir(cpu_vm).exists()
    assert sb.bucket_exists()
    assert marker in sb.objects(prefix=step_prefix)
    assert sb.state("vm_history")[cpu_key][0]["deleted"] is not None


@pytest.mark.parametrize("runtime", ["container", "install"])
def test_the_tpu_vms_runtime_installs_and_trains(sb: SandboxRun, runtime: str) -> None:
    """install_maxtext then train on the TPU VM with each runtime: container pulls the image (no
    venv, no uv on the VM) and trains in it; install builds the venv and trains there. Both write
    the checkpoints to GCS, and the token reaches only the command that starts MaxText (with
    container: the docker client, which hands it to the container by name)."""
    conf = sb.tpu_vm_conf(runtime=runtime)
    pipeline = tpu_vm_pipeline_from_conf(conf, run_id=RUN_ID)
    for task_id, factory in TPU_VM_CONVERSION_TASKS:
        _execute(sb, factory, conf, task_id=task_id)
    _execute(sb, TpuVmCreateOperator, conf, task_id="create_vm")
    installed = _execute(sb, TpuVmStageOperator, conf, task_id="install_maxtext")
    trained = _execute(sb, TpuVmStageOperator, conf, task_id="train")
    assert installed["runtime"] == trained["runtime"] == runtime
    assert trained["metrics"]["last_step"] == 3

    step_prefix = pipeline.gcs_actor_checkpoint.removeprefix(f"gs://{sb.bucket}/") + "/"
    assert step_prefix + "commit_success.txt" in sb.objects(prefix=step_prefix)
    (life,) = sb.state("vm_history")[f"{sb.project}/{conf['zone']}/{sb.vm}"]
    assert [(p["module"], p["runtime"]) for p in life["programs"]] == [
        ("maxtext.trainers.post_train.rl.train_rl", runtime)
    ]
    calls = sb.vm_tool_calls(sb.vm)
    with_token = [c["argv"][:2] for c in calls if "HF_TOKEN" in c["env_names"]]
    venv = sb.layout.vm_dir(sb.vm) / "home"
    if runtime == "container":
        assert with_token == [["docker", "run"]]
        assert not [c for c in calls if c["tool"] in ("uv", "pip", "venv-pip")]
        assert not list(venv.glob("*/maxtext_venv"))
    else:
        assert with_token == [["python3", "-m"]]
        assert not [c for c in calls if c["tool"] == "docker"]
        assert list(venv.glob("*/maxtext_venv"))


def test_the_first_stage_waits_for_the_guests_sshd_and_fails_in_one_line_past_the_bound(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new VM's guest boots after RUNNING: its install's ssh is refused (gcloud's own key poll
    gives up first), the stage tries again, one log line a wait, and runs once sshd answers; a
    guest that outlasts ``[tpu_rl] ssh_boot_wait_minutes`` fails the stage in one line."""
    conf = sb.tpu_vm_conf()
    monkeypatch.setenv("AIRFLOW__TPU_RL__SSH_BOOT_POLL_SECONDS", "0.3")
    for task_id, factory in TPU_VM_CONVERSION_TASKS[:2]:
        _execute(sb, factory, conf, task_id=task_id)
    # 15 s with the time scale off: the first ssh comes within it even on a loaded machine
    update_settings(sb.layout, capacity_minutes={"guest_boot": 150})
    try:
        _execute(sb, CpuVmCreateOperator, conf, task_id="create_cpu_vm")
        with capture_task_logs() as logs:
            installed = _execute(sb, TpuVmStageOperator, conf, task_id="install_cpu_vm")
        assert installed["stage"] == "install"
        waits = [str(line.get("event")) for line in logs if "still booting" in str(line.get("event"))]
        assert waits, "the first ssh should have met the booting guest"
        assert all("port 22: Connection refused (the VM's guest is still booting)" in w for w in waits)

        # a guest that boots for a minute from the same RUNNING: past a 1.2 s bound
        update_settings(sb.layout, capacity_minutes={"guest_boot": 600})
        monkeypatch.setenv("AIRFLOW__TPU_RL__SSH_BOOT_WAIT_MINUTES", "0.02")
        with pytest.raises(CommandError) as failed:
            _execute(sb, TpuVmStageOperator, conf, task_id="install_cpu_vm")
        assert "\n" not in str(failed.value)
        assert "the VM's sshd still refused connections after the boot wait" in str(failed.value)
    finally:
        update_settings(sb.layout, capacity_minutes={})


def test_training_on_a_cpu_vm_fails_as_jax_does(sb: SandboxRun) -> None:
    """The sandbox's machine type decides the devices: train_rl on the CPU VM cannot start the TPU
    backend (a test that the TPU VM's absence would not go unnoticed)."""
    conf = sb.tpu_vm_conf()
    for task_id, factory in TPU_VM_CONVERSION_TASKS:
        _execute(sb, factory, conf, task_id=task_id)
    pipeline = tpu_vm_pipeline_from_conf(conf, run_id=RUN_ID)
    command = tpu_vm.ssh(pipeline.cpu_vm, tpu_vm.container_train_script(pipeline), "train on the CPU VM")
    hook = sb.operator(TpuVmStageOperator, dag_id=TPU_VM_DAG_ID, task_id="train").hook
    result = hook.run(command)
    assert result.exit_code != 0
    assert "Unable to initialize backend 'tpu'" in result.output


def test_deleting_this_runs_vm_that_is_already_gone_succeeds(sb: SandboxRun) -> None:
    conf = sb.tpu_vm_conf()
    _execute(sb, EnsureBucketOperator, conf, task_id="ensure_bucket")
    # The run holds the VM's lease, but the VM is gone (its termination action deleted it).
    ClusterLeaseHook().acquire(
        sb.bucket, vm_lease_name(sb.vm), dag_id=TPU_VM_DAG_ID, run_id=RUN_ID, ttl=timedelta(hours=1)
    )

    result = _execute(sb, TpuVmDeleteOperator, conf, task_id="delete_vm")

    assert result.pop("billed") is None  # no start of it was ever noted: not known
    assert result == {"vm_name": sb.vm, "deleted": True, "bucket_deleted": False, "removed_grants": []}
    (call,) = _delete_calls(sb)
    assert call["exit_code"] != 0  # gcloud said "not found": counted as already deleted
    assert ClusterLeaseHook().read(sb.bucket, vm_lease_name(sb.vm)) is None  # released


def test_a_delete_that_fails_for_good_names_the_vm_it_leaves_and_keeps_its_records(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one case where the VM survives its run: the task fails at once, naming the VM, and the
    lease and the resource record stay for a retry or the janitor."""
    conf = sb.tpu_vm_conf()
    _execute(sb, EnsureBucketOperator, conf, task_id="ensure_bucket")
    _execute(sb, HfTokenSecretOperator, conf, task_id="sync_hf_token")
    _execute(sb, TpuVmCreateOperator, conf, task_id="create_vm")
    monkeypatch.setenv("TPU_RL_SANDBOX_FAIL", "destroy")

    with pytest.raises(AirflowFailException) as failed:
        _execute(sb, TpuVmDeleteOperator, conf, task_id="delete_vm")

    assert f"delete VM {sb.vm} " in str(failed.value)
    assert [call["exit_code"] != 0 for call in _delete_calls(sb)] == [True]
    assert f"{sb.project}/{conf['zone']}/{sb.vm}" in sb.state("vms")
    lease = ClusterLeaseHook().read(sb.bucket, vm_lease_name(sb.vm))
    assert lease is not None
    assert lease.holder == f"{TPU_VM_DAG_ID}/{RUN_ID}"
    record = json.loads(sb.api.download(sb.bucket, gke.resource_record_object(sb.vm)))
    assert record["run_id"] == RUN_ID


def test_two_runs_with_one_vm_name_never_share_or_delete_each_others_vm(sb: SandboxRun) -> None:
    conf = sb.tpu_vm_conf()
    other_run = "manual__2026-03-02T00:00:00+00:00"
    _execute(sb, EnsureBucketOperator, conf, task_id="ensure_bucket")
    _execute(sb, HfTokenSecretOperator, conf, task_id="sync_hf_token")
    _execute(sb, TpuVmCreateOperator, conf, task_id="create_vm")
    vm_key = f"{sb.project}/{conf['zone']}/{sb.vm}"
    created = sb.state("vms")[vm_key]["created"]

    second = sb.operator(TpuVmCreateOperator, dag_id=TPU_VM_DAG_ID, task_id="create_vm", run_id=other_run)
    with pytest.raises(AirflowFailException) as refused:
        second.execute(sb.context(second, conf, run_id=other_run, start_date=START))
    assert str(refused.value).startswith(f"TPU VM {sb.vm} is in use by run {TPU_VM_DAG_ID}/{RUN_ID} until ")
    # Its teardown leaves the first run's VM, lease and record alone.
    teardown = sb.operator(TpuVmDeleteOperator, dag_id=TPU_VM_DAG_ID, task_id="delete_vm", run_id=other_run)
    result = teardown.execute(sb.context(teardown, conf, run_id=other_run, start_date=START))
    assert result["deleted"] is False
    assert _delete_calls(sb) == []
    assert sb.state("vms")[vm_key]["created"] == created
    record = json.loads(sb.api.download(sb.bucket, gke.resource_record_object(sb.vm)))
    assert record["run_id"] == RUN_ID


def test_a_vm_this_run_did_not_create_is_never_taken_as_its_own(sb: SandboxRun) -> None:
    """ "Already exists" is success only for this run's VM: one of another run (its lease gone,
    say, in another bucket) fails the create in one line and is left alone."""
    conf = sb.tpu_vm_conf()
    other_run = "manual__2026-03-02T00:00:00+00:00"
    _execute(sb, EnsureBucketOperator, conf, task_id="ensure_bucket")
    _execute(sb, HfTokenSecretOperator, conf, task_id="sync_hf_token")
    _execute(sb, TpuVmCreateOperator, conf, task_id="create_vm")
    ClusterLeaseHook().release(sb.bucket, ClusterLeaseHook().read(sb.bucket, vm_lease_name(sb.vm)))

    second = sb.operator(TpuVmCreateOperator, dag_id=TPU_VM_DAG_ID, task_id="create_vm", run_id=other_run)
    with pytest.raises(AirflowFailException) as refused:
        second.execute(sb.context(second, conf, run_id=other_run, start_date=START))

    message = str(refused.value)
    assert "\n" not in message
    assert f"TPU VM {sb.vm} already exists in {conf['zone']} and this run did not create it" in message
    assert "choose another vm_name" in message


def test_create_reuses_the_vm_of_the_same_run(sb: SandboxRun) -> None:
    conf = sb.tpu_vm_conf()
    _execute(sb, EnsureBucketOperator, conf, task_id="ensure_bucket")
    _execute(sb, HfTokenSecretOperator, conf, task_id="sync_hf_token")
    _execute(sb, TpuVmCreateOperator, conf, task_id="create_vm")
    created = sb.state("vms")[f"{sb.project}/{conf['zone']}/{sb.vm}"]["created"]

    assert _execute(sb, TpuVmCreateOperator, conf, task_id="create_vm") == sb.vm

    assert sb.state("vms")[f"{sb.project}/{conf['zone']}/{sb.vm}"]["created"] == created
    creates = [c for c in sb.calls() if c["argv"][:3] == ["compute", "instances", "create"]]
    assert len(creates) == 2


def test_keep_vm_leaves_it_running(sb: SandboxRun) -> None:
    conf = sb.tpu_vm_conf(keep_vm=True)
    _execute(sb, EnsureBucketOperator, conf, task_id="ensure_bucket")
    _execute(sb, HfTokenSecretOperator, conf, task_id="sync_hf_token")
    _execute(sb, TpuVmCreateOperator, conf, task_id="create_vm")

    result = _execute(sb, TpuVmDeleteOperator, conf, task_id="delete_vm")

    assert result["deleted"] is False
    assert f"{sb.project}/{conf['zone']}/{sb.vm}" in sb.state("vms")
    assert _delete_calls(sb) == []


def test_a_reused_run_name_never_writes_over_another_runs_export(sb: SandboxRun) -> None:
    conf = sb.tpu_vm_conf(run_name="rl-shared")
    other_run = "manual__2026-03-02T00:00:00+00:00"
    for task_id, factory in TPU_VM_CONVERSION_TASKS:
        _execute(sb, factory, conf, task_id=task_id)
    _execute(sb, TpuVmCreateOperator, conf, task_id="create_vm")
    for task_id in ("install_maxtext", "train", "export_to_huggingface"):
        _execute(sb, TpuVmStageOperator, conf, task_id=task_id)
    pipeline = tpu_vm_pipeline_from_conf(conf, run_id=RUN_ID)
    export_prefix = pipeline.gcs_export.removeprefix(f"gs://{sb.bucket}/") + "/"
    written = _updated(sb, export_prefix)
    ssh_calls = len([c for c in sb.calls() if c["argv"][:2] == ["compute", "ssh"]])

    later = sb.operator(
        TpuVmStageOperator, dag_id=TPU_VM_DAG_ID, task_id="export_to_huggingface", run_id=other_run
    )
    with capture_task_logs() as logs:
        result = later.execute(sb.context(later, conf, run_id=other_run, start_date=START))

    assert result["skipped"] is True
    assert result["resumed_from"] == f"{TPU_VM_DAG_ID}/{RUN_ID}"
    assert _updated(sb, export_prefix) == written  # not one object written again
    assert len([c for c in sb.calls() if c["argv"][:2] == ["compute", "ssh"]]) == ssh_calls
    assert any("this run adopts it" in str(line.get("event")) for line in logs)
