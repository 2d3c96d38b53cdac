"""The TPU VM's baked boot image in the sandbox (issue 46, item 3): baked once on a CPU VM, reused
by the next run, and the billed TPU VM booted from it installs and pulls nothing."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowException
from airflow_provider_tpu_rl.operators.boot_image import BakeVmDeleteOperator, TpuVmBootImageOperator
from airflow_provider_tpu_rl.operators.tpu_vm import TpuVmCreateOperator, TpuVmStageOperator
from airflow_provider_tpu_rl.render import boot_image
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID, tpu_vm_pipeline_from_conf
from tests.support.sandbox_run import TPU_VM_CONVERSION_TASKS, SandboxRun
from tpu_rl_sandbox.clis.gcloud.compute_images import image_dir
from tpu_rl_sandbox.world.registry import POST_TRAINING_IMAGE, REGISTRY_IMAGES
from tpu_rl_sandbox.world.store import StateStore

RUN_A = "manual__2026-04-01T00:00:00+00:00"
RUN_B = "manual__2026-04-02T00:00:00+00:00"
START = datetime(2030, 1, 1, tzinfo=UTC)
DIGEST = REGISTRY_IMAGES[POST_TRAINING_IMAGE]
FAMILY = boot_image.family_of(DIGEST)
# What installing or pulling on a VM looks like in its tool-call log.
INSTALLS = ("apt", "uv", "pip", "venv-pip", "extra-deps")


def _execute(sb: SandboxRun, factory: Any, conf: dict[str, Any], run_id: str, **kwargs: Any) -> Any:
    op = sb.operator(factory, dag_id=TPU_VM_DAG_ID, conf=conf, run_id=run_id, **kwargs)
    # the operator holds the pipeline's arguments already, with this test's (the bake's result)
    return op.execute(sb.context(op, conf, run_id=run_id, start_date=START, apply_arguments=False))


def _bake_vm(conf: dict[str, Any], run_id: str) -> str:
    return tpu_vm_pipeline_from_conf(conf, run_id=run_id).bake_vm.vm_name


def _installs_or_pulls(calls: list[dict[str, Any]]) -> list[list[str]]:
    """The calls of a VM's log that install software, pull an image or log in to pull one."""

    def installs(call: dict[str, Any]) -> bool:
        tool, argv = call["tool"], call["argv"]
        return (
            tool in INSTALLS
            or tool == "curl"
            or (tool == "docker" and argv[1:2] == ["pull"])
            or (tool == "gcloud" and argv[1:3] == ["auth", "configure-docker"])
        )

    return [call["argv"] for call in calls if installs(call)]


def test_a_run_bakes_the_boot_image_once_and_the_tpu_vm_booted_from_it_installs_and_pulls_nothing(
    sb: SandboxRun,
) -> None:
    conf = sb.tpu_vm_conf()
    baked = _execute(sb, TpuVmBootImageOperator, conf, RUN_A, task_id="bake_image")

    # Baked: the tag resolved at the registry, the family named after its digest, the image READY.
    assert baked["digest"] == DIGEST
    assert baked["boot_image_family"] == FAMILY
    assert baked["baked"] is True
    image = sb.state("images")[f"{sb.project}/{baked['boot_image']}"]
    assert (image["family"], image["status"]) == (FAMILY, "READY")
    assert image["labels"]["tpu-rl-baked"] == "true"
    # on a CPU VM of its own, booted from the TPU VM's image family, gone afterwards
    bake_vm = _bake_vm(conf, RUN_A)
    created = [c for c in sb.calls() if c["argv"][:4] == ["compute", "instances", "create", bake_vm]]
    (create,) = created
    assert "--machine-type=n2-standard-8" in create["argv"]
    assert "--image-family=ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e" in create["argv"]
    assert f"{sb.project}/{conf['zone']}/{bake_vm}" not in sb.state("vms")
    (life,) = sb.state("vm_history")[f"{sb.project}/{conf['zone']}/{bake_vm}"]
    assert life["deleted"] is not None
    assert life["stopped"]
    # its billed span (the bake's cost, for the ledger to join): machine type, start, end
    (span,) = baked["vm_spans"]
    assert (span["name"], span["machine_type"]) == (bake_vm, "n2-standard-8")
    assert span["started"] <= span["ended"]
    verbs = [c["argv"][:3] for c in sb.calls() if bake_vm in " ".join(c["argv"])]
    assert verbs.index(["compute", "instances", "stop"]) < verbs.index(["compute", "images", "create"])

    # The TPU VM boots from the family: Docker and the image are on its disk before any session.
    for task_id, factory in TPU_VM_CONVERSION_TASKS:
        _execute(sb, factory, conf, RUN_A, task_id=task_id)
    assert (
        _execute(sb, TpuVmCreateOperator, conf, RUN_A, task_id="create_vm", boot_image_family=FAMILY) == sb.vm
    )
    vm = sb.state("vms")[f"{sb.project}/{conf['zone']}/{sb.vm}"]
    assert (vm["image"]["project"], vm["image"]["family"], vm["image"]["source"]) == (
        sb.project,
        FAMILY,
        baked["boot_image"],
    )
    installed = _execute(
        sb, TpuVmStageOperator, conf, RUN_A, task_id="install_maxtext", boot_image_family=FAMILY
    )
    assert installed["runtime"] == "container"
    trained = _execute(sb, TpuVmStageOperator, conf, RUN_A, task_id="train")
    assert trained["metrics"]["last_step"] == 3

    # Nothing installed or pulled on the billed TPU VM: its only docker calls are the check and
    # the training container.
    calls = sb.vm_tool_calls(sb.vm)
    assert _installs_or_pulls(calls) == []
    docker = [c["argv"][1:3] for c in calls if c["tool"] == "docker"]
    assert ["image", "inspect"] in docker
    assert ["run", "--name=tpu-rl-train"] in docker
    assert [
        p["module"] for p in sb.state("vm_history")[f"{sb.project}/{conf['zone']}/{sb.vm}"][0]["programs"]
    ] == ["maxtext.trainers.post_train.rl.train_rl"]

    # The next run finds the family's image and bakes nothing: no bake VM of its own.
    again = _execute(sb, TpuVmBootImageOperator, conf, RUN_B, task_id="bake_image")
    assert again == {**baked, "baked": False, "vm_spans": []}
    assert not [c for c in sb.calls() if _bake_vm(conf, RUN_B) in " ".join(c["argv"])]
    # and its teardown has nothing to delete (an absent VM counts as deleted)
    assert _execute(sb, BakeVmDeleteOperator, conf, RUN_B, task_id="delete_bake_vm")["deleted"] is True


def test_the_install_stage_checks_the_boot_image_and_fails_in_one_line_when_it_lacks_the_image(
    sb: SandboxRun,
) -> None:
    """install_maxtext does not skip blindly: a family image without the workload image fails it."""
    conf = sb.tpu_vm_conf()
    baked = _execute(sb, TpuVmBootImageOperator, conf, RUN_A, task_id="bake_image")
    # the image's disk without the docker daemon's images (as if baked before the pull)
    (image_dir(sb.layout.root, sb.project, baked["boot_image"]) / ".sandbox-dockerd.json").unlink()
    for task_id, factory in TPU_VM_CONVERSION_TASKS[:2]:  # the bucket and the token
        _execute(sb, factory, conf, RUN_A, task_id=task_id)
    _execute(sb, TpuVmCreateOperator, conf, RUN_A, task_id="create_vm", boot_image_family=FAMILY)
    with pytest.raises(AirflowException) as failed:
        _execute(sb, TpuVmStageOperator, conf, RUN_A, task_id="install_maxtext", boot_image_family=FAMILY)
    assert f"the boot image of family {FAMILY} lacks {POST_TRAINING_IMAGE}" in str(failed.value)
    assert _installs_or_pulls(sb.vm_tool_calls(sb.vm)) == []


def test_a_boot_image_without_the_tpus_devices_fails_the_install_stage_in_one_line(sb: SandboxRun) -> None:
    """A family image made from a disk without Cloud TPU's udev rule (baked from a plain Ubuntu
    image, say) boots a TPU VM with no /dev/vfio: install_maxtext fails in seconds, not train."""
    conf = sb.tpu_vm_conf()
    baked = _execute(sb, TpuVmBootImageOperator, conf, RUN_A, task_id="bake_image")
    # the bake VM booted from Google's TPU family: its disk, and so the image, has the rule
    images = sb.state("images")
    assert images[f"{sb.project}/{baked['boot_image']}"]["tpuVfio"] is True
    with StateStore(sb.layout).txn() as txn:  # as if baked from an image without it
        txn.doc("images")[f"{sb.project}/{baked['boot_image']}"]["tpuVfio"] = False
        txn.save("images")
    for task_id, factory in TPU_VM_CONVERSION_TASKS[:2]:  # the bucket and the token
        _execute(sb, factory, conf, RUN_A, task_id=task_id)
    _execute(sb, TpuVmCreateOperator, conf, RUN_A, task_id="create_vm", boot_image_family=FAMILY)
    with pytest.raises(AirflowException) as failed:
        _execute(sb, TpuVmStageOperator, conf, RUN_A, task_id="install_maxtext", boot_image_family=FAMILY)
    assert f"the boot image of family {FAMILY} lacks the TPU's devices (no /dev/vfio/vfio" in str(
        failed.value
    )
    # the check came first: no tool ran on the VM (no docker call, nothing installed)
    assert sb.vm_tool_calls(sb.vm) == []


def test_without_a_baked_image_the_tpu_vm_installs_docker_and_pulls(sb: SandboxRun) -> None:
    """The switch off (or no family given): the TPU VM pays the install and the pull itself."""
    conf = sb.tpu_vm_conf()
    off = _execute(sb, TpuVmBootImageOperator, conf, RUN_A, task_id="bake_image", bake=False)
    assert off == {
        "boot_image_family": None,
        "boot_image": None,
        "digest": None,
        "baked": False,
        "vm_spans": [],
    }
    assert not [c for c in sb.calls() if c["argv"][:2] == ["compute", "images"]]
    for task_id, factory in TPU_VM_CONVERSION_TASKS[:2]:
        _execute(sb, factory, conf, RUN_A, task_id=task_id)
    _execute(sb, TpuVmCreateOperator, conf, RUN_A, task_id="create_vm")
    _execute(sb, TpuVmStageOperator, conf, RUN_A, task_id="install_maxtext")
    pulled = _installs_or_pulls(sb.vm_tool_calls(sb.vm))
    assert ["docker", "pull", POST_TRAINING_IMAGE] in pulled
    assert any(argv[0] in ("apt", "apt-get") for argv in pulled)


def test_a_bake_cut_short_leaves_no_vm(sb: SandboxRun, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed bake step: the task deletes its VM. A try killed before it could (its bake VM
    left): the next try deletes it and bakes afresh."""
    conf = sb.tpu_vm_conf()
    bake_vm = _bake_vm(conf, RUN_A)
    monkeypatch.setenv("TPU_RL_SANDBOX_FAIL", "ssh")
    with pytest.raises(Exception, match="ssh"):
        _execute(sb, TpuVmBootImageOperator, conf, RUN_A, task_id="bake_image")
    assert f"{sb.project}/{conf['zone']}/{bake_vm}" not in sb.state("vms")
    monkeypatch.delenv("TPU_RL_SANDBOX_FAIL")
    # a killed try's bake VM, half-baked (stopped)
    for verb in ("create", "stop"):
        argv = [
            "gcloud",
            "compute",
            "instances",
            verb,
            bake_vm,
            f"--zone={conf['zone']}",
            f"--project={sb.project}",
        ]
        subprocess.run(argv, check=True, capture_output=True)
    retried = _execute(sb, TpuVmBootImageOperator, conf, RUN_A, task_id="bake_image")
    assert retried["baked"] is True
    assert [span["name"] for span in retried["vm_spans"]] == [bake_vm]
    # the first try's, the killed one's, and the retry's twice: "already exists", deleted, created
    creates = [c for c in sb.calls() if c["argv"][:4] == ["compute", "instances", "create", bake_vm]]
    assert [c["exit_code"] for c in creates] == [0, 0, 1, 0]
    assert f"{sb.project}/{conf['zone']}/{bake_vm}" not in sb.state("vms")
