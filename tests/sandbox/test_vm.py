"""Single-host path: TPU VM create, SSH stage scripts on stdin, /dev/shm, copy to GCS, delete."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from airflow_provider_tpu_rl.render.tpu_vm import install_script
from tests.sandbox.conftest import Cli
from tpu_rl_sandbox.world.settings import load_settings, reset_settings, update_settings
from tpu_rl_sandbox.world.store import StateStore

INSTALL = """set -euo pipefail
sudo apt update && sudo apt upgrade -y --fix-missing
sudo apt install -y build-essential cmake ninja-build
curl -LsSf https://astral.sh/uv/install.sh | sh
source "${HOME}/.local/bin/env"
uv python install 3.12
uv venv --python 3.12 --seed maxtext_venv
source maxtext_venv/bin/activate
UV_TORCH_BACKEND=cpu uv pip install "maxtext[tpu-post-train]==0.2.3" --resolution=lowest
install_tpu_post_train_extra_deps
"""
RUN = """set -euo pipefail
source maxtext_venv/bin/activate
export HF_TOKEN="$(gcloud secrets versions access latest --secret=hf --project={project})"
export MODEL_NAME='llama3.1-8b-Instruct'
export MODEL_CHECKPOINT_DIRECTORY=/dev/shm/$MODEL_NAME/mt-format/
export USE_PATHWAYS=0
python3 -m maxtext.checkpoint_conversion.to_maxtext model_name="${{MODEL_NAME?}}" \\
    base_output_directory="${{MODEL_CHECKPOINT_DIRECTORY?}}" scan_layers=True use_multimodal=False hardware=cpu \\
    skip_jax_distributed_system=true checkpoint_storage_use_zarr3=$((1 - USE_PATHWAYS)) \\
    checkpoint_storage_use_ocdbt=$((1 - USE_PATHWAYS)) --lazy_load_tensors=False
export BASE_OUTPUT_DIRECTORY=/dev/shm/$MODEL_NAME/post-train/
export RUN_NAME=run1
TPU_ACCELERATOR_TYPE=v6e-8 TPU_WORKER_ID=0 python3 -m maxtext.trainers.post_train.rl.train_rl \\
    model_name="${{MODEL_NAME?}}" load_parameters_path="$MODEL_CHECKPOINT_DIRECTORY/0/items" run_name="$RUN_NAME" \\
    base_output_directory="$BASE_OUTPUT_DIRECTORY" chips_per_vm=8 num_batches=2 num_test_batches=1 \\
    rollout_data_parallelism=1 rollout_tensor_parallelism=-1
python3 -m maxtext.checkpoint_conversion.to_huggingface model_name=llama3.1-8b \\
    load_parameters_path=$BASE_OUTPUT_DIRECTORY/$RUN_NAME/checkpoints/actor/2/model_params \\
    base_output_directory=/dev/shm/$MODEL_NAME/hf-trained/ scan_layers=True use_multimodal=False weight_dtype=bfloat16
gcloud storage rsync --recursive /dev/shm/$MODEL_NAME/hf-trained gs://{bucket}/llama/hf-trained
gcloud storage cp -r /dev/shm/$MODEL_NAME/post-train/$RUN_NAME gs://{bucket}/llama/checkpoints/
"""


def create_vm(cli: Cli, names: dict[str, str], vm: str, *extra: str) -> None:
    result = cli.gcloud(
        "compute",
        "instances",
        "create",
        vm,
        f"--zone={names['zone']}",
        f"--project={names['project']}",
        "--machine-type=ct6e-standard-8t",
        "--image-project=ubuntu-os-accelerator-images",
        "--image-family=ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
        "--boot-disk-size=200GB",
        "--maintenance-policy=TERMINATE",
        "--instance-termination-action=DELETE",
        "--provisioning-model=RESERVATION_BOUND",
        "--reservation-affinity=specific",
        "--reservation=res-8",  # a v6e-8 reservation: one ct6e-standard-8t VM
        *extra,
    )
    assert result.code == 0, result.text


def ssh(
    cli: Cli, names: dict[str, str], vm: str, script: str, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    result = cli.gcloud(
        "compute",
        "ssh",
        vm,
        "--zone",
        names["zone"],
        "--project",
        names["project"],
        "--command",
        "bash -s",
        stdin=script.encode(),
        env=env,
    )
    return result.code, result.out, result.err


def grant_vm_account(cli: Cli, names: dict[str, str], vm: str) -> str:
    """Let the VM's service account read the ``hf`` secret and write the bucket; its e-mail."""
    account = cli.gcloud(
        "compute",
        "instances",
        "describe",
        vm,
        f"--zone={names['zone']}",
        f"--project={names['project']}",
        "--format=value(serviceAccounts[0].email)",
    ).out.strip()
    assert account.endswith("-compute@developer.gserviceaccount.com"), account
    for grant in (
        ("secrets", "add-iam-policy-binding", "hf", f"--project={names['project']}"),
        ("storage", "buckets", "add-iam-policy-binding", f"gs://{names['bucket']}"),
    ):
        role = "secretmanager.secretAccessor" if grant[0] == "secrets" else "storage.objectAdmin"
        done = cli.gcloud(
            *grant, f"--member=serviceAccount:{account}", f"--role=roles/{role}", "--condition=None"
        )
        assert done.code == 0, done.text
    time.sleep(load_settings(cli.layout).iam_propagation_seconds)  # a new secret grant takes effect
    return account


@pytest.fixture
def boot_apt_seconds(cli: Cli, request: pytest.FixtureRequest) -> Iterator[float]:
    """How long a new VM's image keeps apt busy (default none: these tests run the tutorial's own
    install, which races it; the tests below pin the race); the defaults come back afterwards."""
    seconds = float(getattr(request, "param", 0.0))
    update_settings(cli.layout, boot_apt_seconds=seconds)
    yield seconds
    reset_settings(cli.layout)


@pytest.fixture
def prepared(cli: Cli, names: dict[str, str], boot_apt_seconds: float) -> dict[str, str]:
    assert (
        cli.gcloud(
            "storage", "buckets", "create", f"gs://{names['bucket']}", f"--project={names['project']}"
        ).code
        == 0
    )
    assert (
        cli.gcloud(
            "secrets", "create", "hf", f"--project={names['project']}", "--data-file=-", stdin=b"hf_vm"
        ).code
        == 0
    )
    return names


def test_vm_pipeline_copies_results_before_delete(cli: Cli, prepared: dict[str, str]) -> None:
    names, vm = prepared, f"vm-{prepared['cluster']}"
    create_vm(cli, names, vm, "--labels=tpu-rl-run=r1", "--scopes=cloud-platform")
    grant_vm_account(cli, names, vm)
    code, out, err = ssh(cli, names, vm, INSTALL)
    assert code == 0, err
    assert "everything's installed!" in out
    code, out, err = ssh(cli, names, vm, RUN.format(project=names["project"], bucket=names["bucket"]))
    assert code == 0, out + err
    assert "Post RL Training: corr=" in out
    shm = cli.layout.vm_dir(vm) / "dev" / "shm" / "llama3.1-8b-Instruct"
    assert (shm / "mt-format" / "0" / "items" / "manifest.ocdbt").is_file()  # ocdbt = 1 - USE_PATHWAYS
    assert (
        shm / "post-train" / "run1" / "checkpoints" / "actor" / "2" / "model_params" / "_METADATA"
    ).is_file()
    assert not any(p.name.endswith("orbax-checkpoint-tmp") for p in shm.rglob("*"))
    exported = {n.rsplit("/", 1)[1] for n in cli.objects(names["bucket"], "llama/hf-trained/")}
    assert {"config.json", "model.safetensors.index.json", "tokenizer.json"} <= exported
    assert "llama/checkpoints/run1/checkpoints/actor/2/model_params/_METADATA" in cli.objects(
        names["bucket"], "llama/checkpoints/"
    )
    listed = cli.gcloud(
        "compute",
        "instances",
        "list",
        f"--project={names['project']}",
        "--filter=labels.tpu-rl-run=r1",
        "--format=json",
    )
    assert [i["name"] for i in json.loads(listed.out)] == [vm]
    described = json.loads(
        cli.gcloud(
            "compute",
            "instances",
            "describe",
            vm,
            f"--zone={names['zone']}",
            f"--project={names['project']}",
            "--format=json",
        ).out
    )
    assert described["status"] == "RUNNING"
    assert described["reservationAffinity"]["values"] == ["res-8"]
    deleted = cli.gcloud(
        "compute",
        "instances",
        "delete",
        vm,
        f"--zone={names['zone']}",
        f"--project={names['project']}",
        "--quiet",
    )
    assert deleted.code == 0
    assert not shm.exists()
    assert cli.objects(names["bucket"], "llama/hf-trained/")  # the copy survives the VM
    again = cli.gcloud(
        "compute",
        "instances",
        "delete",
        vm,
        f"--zone={names['zone']}",
        f"--project={names['project']}",
        "--quiet",
    )
    assert again.code == 1
    assert "was not found" in again.err


def test_the_vm_maxtext_takes_the_config_keys_of_the_release_pip_installed(
    cli: Cli, prepared: dict[str, str]
) -> None:
    """maxtext==0.2.3 on the VM: a key that only 0.2.4 (the GKE image) has is refused, as pyconfig does."""
    names, vm = prepared, f"vmk-{prepared['cluster']}"
    create_vm(cli, names, vm)
    code, out, err = ssh(cli, names, vm, INSTALL)
    assert code == 0, err
    train = (
        "source maxtext_venv/bin/activate\n"
        "python3 -m maxtext.trainers.post_train.rl.train_rl model_name=llama3.1-8b-Instruct "
        "rl.num_generations=4 {key}=1\n"
    )
    code, out, err = ssh(cli, names, vm, train.format(key="inference_rollouts"))
    assert code == 1
    assert "ValueError: 'inference_rollouts' not in " in out
    assert "valid config keys of MaxText 0.2.3" in out
    code, out, err = ssh(cli, names, vm, train.format(key="degenerate_group_masking"))  # a 0.2.3 key
    assert "not in " not in out + err


def test_vm_rules(cli: Cli, prepared: dict[str, str]) -> None:
    names, vm = prepared, f"vmr-{prepared['cluster']}"
    create_vm(cli, names, vm)
    duplicate = cli.gcloud(
        "compute", "instances", "create", vm, f"--zone={names['zone']}", f"--project={names['project']}"
    )
    assert duplicate.code == 1
    assert "already exists" in duplicate.err
    code, _, err = ssh(
        cli, names, vm, "set -e\npython3 -m maxtext.checkpoint_conversion.to_maxtext model_name=x\n"
    )
    assert code == 1
    assert "No module named 'maxtext'" in err  # nothing installed yet
    code, _, err = ssh(cli, names, vm, "set -e\napt install -y cmake\n")
    assert code == 100  # needs sudo
    # sudo's VAR=value words set the command's environment, as with real sudo.
    code, _, err = ssh(
        cli, names, vm, "set -e\nsudo DEBIAN_FRONTEND=noninteractive apt-get install -y cmake\n"
    )
    assert code == 0, err
    code, _, err = ssh(cli, names, vm, "set -e\nuv --version\n")
    assert code == 127
    assert "uv: command not found" in err
    # Default scopes: the VM can read but not write GCS, nor read secrets.
    code, _, err = ssh(
        cli, names, vm, f"echo x > /tmp/f && gcloud storage cp /tmp/f gs://{names['bucket']}/f\n"
    )
    assert code == 1
    assert "HTTPError 403" in err
    code, _, err = ssh(
        cli, names, vm, f"gcloud secrets versions access latest --secret=hf --project={names['project']}\n"
    )
    assert code == 1
    assert "insufficient authentication scopes" in err
    missing = cli.gcloud(
        "compute",
        "ssh",
        "no-such-vm",
        "--zone",
        names["zone"],
        "--project",
        names["project"],
        "--command",
        "true",
    )
    assert missing.code == 1
    assert "was not found" in missing.err
    no_zone = cli.gcloud("compute", "instances", "create", "zoneless", f"--project={names['project']}")
    assert no_zone.code == 1
    assert "Specify the [--zone] flag." in no_zone.err


@pytest.mark.usefixtures("clean_faults")
def test_ssh_and_vm_create_faults(cli: Cli, prepared: dict[str, str]) -> None:
    names, vm = prepared, f"vmf-{prepared['cluster']}"
    stockout = cli.gcloud(
        "compute",
        "instances",
        "create",
        vm,
        f"--zone={names['zone']}",
        f"--project={names['project']}",
        env={"TPU_RL_SANDBOX_FAIL": "deploy:transient"},
    )
    assert stockout.code == 1
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in stockout.err
    create_vm(cli, names, vm)
    for expected in (255, 0):
        code, _, err = ssh(cli, names, vm, "true\n", env={"TPU_RL_SANDBOX_FAIL": "ssh:transient"})
        assert code == expected
        if expected == 255:
            assert "port 22: Connection timed out" in err
    code, _, err = ssh(cli, names, vm, "true\n", env={"TPU_RL_SANDBOX_FAIL": "ssh"})
    assert code == 255


# ------------------------------------------------- apt on a VM whose image is still updating itself
def _created(cli: Cli, names: dict[str, str], vm: str) -> float:
    record = cli.state("vms")[f"{names['project']}/{names['zone']}/{vm}"]
    return datetime.fromisoformat(str(record["created"]).replace("Z", "+00:00")).timestamp()


# 10 s of each lock: the two ssh calls land in their half whatever the load (each takes about a
# second on a quiet machine)
@pytest.mark.parametrize("boot_apt_seconds", [20.0], indirect=True)
def test_a_new_vms_image_holds_apts_locks_as_apt_reports_them(
    cli: Cli, prepared: dict[str, str], boot_apt_seconds: float
) -> None:
    """apt-daily's update holds the lists lock, which ``apt-get update`` never waits for; then
    unattended-upgrades holds dpkg's frontend lock, which apt waits for only with
    ``DPkg::Lock::Timeout`` (the messages are apt 2.6.1's, tried with the locks held)."""
    names, vm = prepared, f"vma-{prepared['cluster']}"
    create_vm(cli, names, vm)
    created = _created(cli, names, vm)

    code, _, err = ssh(cli, names, vm, "sudo apt-get -o DPkg::Lock::Timeout=60 update")
    assert code == 100
    assert "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 812 (apt-get)" in err

    time.sleep(max(0.0, created + boot_apt_seconds / 2 + 0.2 - time.time()))
    code, _, err = ssh(cli, names, vm, "sudo apt-get install -y cmake")
    assert code == 100
    assert (
        "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1033 (unattended-upgr)"
        in err
    )
    code, out, err = ssh(cli, names, vm, "sudo apt-get -o DPkg::Lock::Timeout=60 install -y cmake")
    assert code == 0, err
    assert "Waiting for cache lock: Could not get lock /var/lib/dpkg/lock-frontend." in out
    assert time.time() >= created + boot_apt_seconds
    assert ssh(cli, names, vm, "sudo apt-get update")[0] == 0


# the first ssh lands within the image's apt work even on a loaded machine (its lists, then dpkg)
@pytest.mark.parametrize("boot_apt_seconds", [40.0], indirect=True)
def test_the_providers_install_waits_for_the_images_apt_work(cli: Cli, prepared: dict[str, str]) -> None:
    """The tutorial's ``sudo apt update`` fails on a VM that has just booted; install_maxtext's
    apt commands wait for the locks and go on."""
    names = prepared
    tutorial_vm, provider_vm = f"vmt-{names['cluster']}", f"vmp-{names['cluster']}"
    apt_lines = install_script().split("\ncurl ", 1)[0] + "\n"
    assert "apt-get" in apt_lines
    assert "curl" not in apt_lines
    create_vm(cli, names, tutorial_vm)
    code, _, err = ssh(cli, names, tutorial_vm, INSTALL)
    assert code == 100
    # apt update's lists lock, or (a later first ssh) apt install's dpkg frontend lock
    assert (
        "Could not get lock /var/lib/apt/lists/lock" in err
        or "Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend)" in err
    ), err

    deleted = cli.gcloud(
        "compute",
        "instances",
        "delete",
        tutorial_vm,
        f"--zone={names['zone']}",
        f"--project={names['project']}",
        "--quiet",
    )
    assert deleted.code == 0, deleted.text
    create_vm(cli, names, provider_vm)
    code, _, err = ssh(cli, names, provider_vm, apt_lines)
    assert code == 0, err


CPU_RUN = """set -euo pipefail
source maxtext_venv/bin/activate
export HF_TOKEN="$(gcloud secrets versions access latest --secret=hf --project={project})"
python3 -m maxtext.checkpoint_conversion.to_maxtext model_name=llama3.1-8b-Instruct \\
    base_output_directory=gs://{bucket}/llama/mt-format/ scan_layers=True use_multimodal=False hardware=cpu \\
    skip_jax_distributed_system=true --lazy_load_tensors=False
TPU_ACCELERATOR_TYPE=v6e-8 TPU_WORKER_ID=0 python3 -m maxtext.trainers.post_train.rl.train_rl \\
    model_name=llama3.1-8b-Instruct load_parameters_path=gs://{bucket}/llama/mt-format/0/items run_name=run1 \\
    base_output_directory=gs://{bucket}/llama/post-train/ chips_per_vm=8 num_batches=2 num_test_batches=1
"""


def test_a_cpu_vm_converts_but_cannot_train(cli: Cli, prepared: dict[str, str]) -> None:
    """The machine type decides the devices: a CPU VM (no reservation flags, accepted) runs the
    conversion, and train_rl there fails as JAX does without a TPU. Its life is recorded."""
    names, vm = prepared, f"cpu-{prepared['cluster']}"
    created = cli.gcloud(
        "compute", "instances", "create", vm, f"--zone={names['zone']}", f"--project={names['project']}",
        "--machine-type=n2-highmem-32", "--image-project=ubuntu-os-cloud", "--image-family=ubuntu-2204-lts",
        "--boot-disk-size=200GB", "--scopes=cloud-platform",
    )  # fmt: skip
    assert created.code == 0, created.text
    grant_vm_account(cli, names, vm)
    code, _, err = ssh(cli, names, vm, INSTALL)
    assert code == 0, err
    code, out, err = ssh(cli, names, vm, CPU_RUN.format(project=names["project"], bucket=names["bucket"]))
    assert code != 0
    assert "Unable to initialize backend 'tpu'" in err
    assert "Checkpoint saved at step 0" in out  # the conversion before it ran
    deleted = cli.gcloud(
        "compute",
        "instances",
        "delete",
        vm,
        f"--zone={names['zone']}",
        f"--project={names['project']}",
        "--quiet",
    )
    assert deleted.code == 0, deleted.text
    (life,) = cli.state("vm_history")[f"{names['project']}/{names['zone']}/{vm}"]
    assert life["machineType"] == "n2-highmem-32"
    assert life["created"] < life["deleted"]
    assert [p["module"] for p in life["programs"]] == [
        "maxtext.checkpoint_conversion.to_maxtext",
        "maxtext.trainers.post_train.rl.train_rl",
    ]


def test_a_stopped_vm_refuses_ssh_until_it_is_started(cli: Cli, prepared: dict[str, str]) -> None:
    """A VM preemption left TERMINATED (termination action STOP) has no external IP: ssh fails as
    gcloud's ssh_utils does; ``instances start`` brings it back, its boot disk as it was."""
    names, vm = prepared, f"vms-{prepared['cluster']}"
    where = (f"--zone={names['zone']}", f"--project={names['project']}")
    create_vm(cli, names, vm)
    assert ssh(cli, names, vm, "touch kept\n")[0] == 0
    with StateStore(cli.layout).txn() as txn:  # as gcloud's InstancesCommands._preempt_vm leaves a STOP VM
        txn.doc("vms")[f"{names['project']}/{names['zone']}/{vm}"].update(
            status="TERMINATED", lastStopTimestamp="2030-01-01T00:00:00.000-00:00"
        )
        txn.save("vms")

    code, _, err = ssh(cli, names, vm, "true\n")
    assert code == 1
    assert (
        f"ERROR: (gcloud.compute.ssh) Instance [{vm}] in zone [{names['zone']}] has not been allocated an "
        "external IP address yet. Try rerunning this command later." in err
    )
    described = json.loads(cli.gcloud("compute", "instances", "describe", vm, *where, "--format=json").out)
    assert described["status"] == "TERMINATED"
    assert "natIP" not in described["networkInterfaces"][0]["accessConfigs"][0]

    started = cli.gcloud("compute", "instances", "start", vm, *where)
    assert started.code == 0, started.text
    assert f"Updated [https://www.googleapis.com/compute/v1/projects/{names['project']}/zones/" in started.err
    assert ssh(cli, names, vm, "test -f kept\n")[0] == 0
    history = cli.state("vm_history")[f"{names['project']}/{names['zone']}/{vm}"]
    assert len(history) == 1
    assert len(history[0]["started"]) == 1

    missing = cli.gcloud("compute", "instances", "start", f"{vm}-none", *where)
    assert missing.code == 1
    assert "was not found" in missing.err
    refused = cli.gcloud("compute", "instances", "start", vm, *where, "--machine-type=n2-standard-8")
    assert refused.code == 2
