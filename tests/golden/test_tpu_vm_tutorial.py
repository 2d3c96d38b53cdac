"""Golden test for seed 002 (Llama 3.1 8B on one v6e-8 TPU VM)."""

from __future__ import annotations

import shlex

import pytest

from airflow_provider_tpu_rl.render import tpu_vm
from airflow_provider_tpu_rl.spec import tpu_vm_pipeline_from_conf
from airflow_provider_tpu_rl.spec.workloads import DEFAULT_CHECKPOINT_PERIOD
from tests.golden.shellwords import commands, flags

MODEL = "llama3.1-8b-Instruct"


def _pipeline(runtime: str = "container", **conf: str):
    return tpu_vm_pipeline_from_conf(
        {
            "project": "tpu-proj-123",
            "zone": "us-east5-b",
            "vm_name": "llama-vm",
            "reservation": "v6e8-res",
            "bucket": "rl-bucket-1",
            "runtime": runtime,
            **conf,
        },
        run_id="manual__2026-11-30",
    )


RUNTIMES = ("container", "install")
IMAGE = "us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4"


GCS = f"gs://rl-bucket-1/{MODEL}"


def _values(pipeline) -> dict[str, str]:
    """The seed's variables; its /dev/shm folders replaced by the bucket's (a documented
    difference: conversion and export run on a CPU VM, training on a TPU VM that exists only around
    it, so every stage reads and writes GCS)."""
    run = pipeline.training.run_name
    return {
        "TPU_NAME": "llama-vm",
        "ZONE": "us-east5-b",
        "PROJECT": "tpu-proj-123",
        "RESERVATION": "v6e8-res",
        "MODEL_NAME": MODEL,
        "HF_TOKEN": "hf_tutorial_token",
        "MODEL_CHECKPOINT_DIRECTORY": f"{GCS}/mt-format/",
        "USE_PATHWAYS": "0",
        "LAZY_LOAD_TENSORS": "False",
        # The seed writes $MODEL_CHECKPOINT_DIRECTORY/0/items (a double slash); same folder.
        "MAXTEXT_CKPT_PATH": f"{GCS}/mt-format/0/items",
        "RUN_NAME": run,
        "BASE_OUTPUT_DIRECTORY": f"{GCS}/post-train/",
        "CHIPS_PER_VM": "8",
        "NUM_BATCHES": "50",
        "HF_MODEL_NAME": "llama3.1-8b",
        "POST_TRAIN_PATH": f"{GCS}/post-train/{run}/checkpoints/actor/50/model_params",
        # one export folder per run, never overwritten by another run
        "HF_EXPORT": f"{GCS}/hf-trained/{run}/",
    }


def _script_lines(script: str) -> list[list[str]]:
    return [shlex.split(line) for line in script.splitlines() if line.strip()]


def _module_call(script: str, module: str) -> dict[str, str]:
    for tokens in _script_lines(script):
        if tokens[:1] == ["HF_TOKEN=$tpu_rl_hf_token"]:  # the token in this command's env alone
            tokens = tokens[1:]
        if tokens[:3] == ["python3", "-m", module]:
            return {k: v for k, _, v in (t.partition("=") for t in tokens[3:])}
        if tokens[1:4] == ["docker", "run"] or tokens[2:4] == ["docker", "run"]:  # in the container
            at = tokens.index("python3")
            if tokens[at : at + 3] == ["python3", "-m", module]:
                return {k: v for k, _, v in (t.partition("=") for t in tokens[at + 3 :])}
    raise AssertionError(f"{module} not in script")


def _tutorial_call(name: str, values: dict[str, str]) -> dict[str, str]:
    (argv,) = [c for c in commands(name, values) if c[0] == "python3"]
    return {k: v for k, _, v in (t.partition("=") for t in argv[3:])}


def test_vm_create_and_delete_match_tutorial() -> None:
    pipeline = _pipeline()
    create, delete = commands("llama_vm.sh", _values(pipeline))
    ours = tpu_vm.create_vm(pipeline.vm)
    want, got = flags(create[4:], set()), flags(list(ours.argv[4:]), set())
    assert ours.argv[:5] == tuple(create[:5])
    # Documented difference: cloud-platform scope so the VM can copy to GCS and read the secret.
    assert got.pop("--scopes") == ["cloud-platform"]
    # Documented difference (item 20): the boot disk type v6e takes, explicit (the tutorial leaves
    # the API's default, documented as pd-standard, which v6e does not take).
    assert "--boot-disk-type" not in want
    assert got.pop("--boot-disk-type") == ["hyperdisk-balanced"]
    assert got == want
    assert list(tpu_vm.delete_vm(pipeline.vm).argv) == delete


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_stage_scripts_match_tutorial(runtime: str) -> None:
    """Both runtimes give train_rl the tutorial's arguments and TPU_* variables (in the container
    by name: ``-e NAME``)."""
    pipeline = _pipeline(runtime)
    values = _values(pipeline)
    convert = tpu_vm.stage_command(pipeline, "convert").stdin_text or ""
    want = _tutorial_call("llama_convert.sh", values)
    assert want.pop("hf_access_token") == "hf_tutorial_token"
    assert _module_call(convert, "maxtext.checkpoint_conversion.to_maxtext") == want

    train = tpu_vm.stage_command(pipeline, "train").stdin_text or ""
    want = _tutorial_call("llama_train.sh", values)
    got = _module_call(train, "maxtext.trainers.post_train.rl.train_rl")
    # Documented difference: a checkpoint every 10 steps (the tutorial keeps rl.yml's 50: its
    # whole run, so a failure restarts at step 0).
    assert "checkpoint_period" not in want
    assert got.pop("checkpoint_period") == str(DEFAULT_CHECKPOINT_PERIOD)
    assert got == want
    exports = {t[1] for t in _script_lines(train) if t[0] == "export" and "=" in t[1]}
    tutorial_exports = {c[1] for c in commands("llama_train.sh", values) if c[0] == "export"}
    assert tutorial_exports <= exports
    assert 'TPU_NAME="$(hostname)"' in train

    if runtime == "container":
        (docker,) = [t for t in _script_lines(train) if "docker" in t and "run" in t]
        passed = {docker[i + 1] for i, t in enumerate(docker) if t == "-e"}
        assert {e.split("=", 1)[0] for e in exports} | {"TPU_NAME", "HF_TOKEN"} == passed

    export = tpu_vm.stage_command(pipeline, "export").stdin_text or ""
    want = _tutorial_call("llama_export.sh", values)
    got = _module_call(export, "maxtext.checkpoint_conversion.to_huggingface")
    # Documented difference (item 20): the export runs on the CPU VM, not on the TPU VM as in the
    # tutorial, and MaxText looks for a JAX cluster there unless told not to.
    assert "hardware" not in want
    assert "skip_jax_distributed_system" not in want
    assert got.pop("hardware") == "cpu"
    assert got.pop("skip_jax_distributed_system") == "true"
    assert got == want


def test_every_stage_reads_and_writes_gcs_not_dev_shm() -> None:
    """Conversion and export run on the CPU VM, training on the TPU VM: nothing is kept on a VM."""
    pipeline = _pipeline()
    for stage in ("convert", "train", "export"):
        script = tpu_vm.stage_command(pipeline, stage).stdin_text or ""
        assert "/dev/shm" not in script, stage
        assert "rsync" not in script, stage
    assert (
        _module_call(tpu_vm.train_script(pipeline), "maxtext.trainers.post_train.rl.train_rl")[
            "load_parameters_path"
        ]
        == f"{GCS}/mt-format/0/items"
    )


def test_cpu_vm_create_and_delete() -> None:
    """The CPU VM: the TPU VM's name with -cpu, a CPU machine type, no reservation flags."""
    pipeline = _pipeline()
    cpu = pipeline.cpu_vm
    assert cpu.vm_name == "llama-vm-cpu"
    assert list(tpu_vm.create_cpu_vm(cpu, "sa@tpu-proj-123.iam.gserviceaccount.com").argv) == [
        "gcloud", "compute", "instances", "create", "llama-vm-cpu",
        "--zone=us-east5-b", "--project=tpu-proj-123", "--machine-type=n2-highmem-32",
        "--image-project=ubuntu-os-cloud", "--image-family=ubuntu-2204-lts", "--boot-disk-size=200GB",
        "--boot-disk-type=pd-balanced",
        "--service-account=sa@tpu-proj-123.iam.gserviceaccount.com", "--scopes=cloud-platform",
    ]  # fmt: skip
    assert list(tpu_vm.delete_vm(cpu).argv) == [
        "gcloud", "compute", "instances", "delete", "llama-vm-cpu",
        "--zone=us-east5-b", "--project=tpu-proj-123", "--quiet",
    ]  # fmt: skip


def test_a_lost_tpu_vm_is_described_and_started_by_name() -> None:
    """A train retry reads the TPU VM's status and starts it when preemption stopped it."""
    vm = _pipeline().vm
    assert list(tpu_vm.describe_vm_status(vm).argv) == [
        "gcloud", "compute", "instances", "describe", "llama-vm",
        "--zone=us-east5-b", "--project=tpu-proj-123", "--format=value(status)",
    ]  # fmt: skip
    assert list(tpu_vm.start_vm(vm).argv) == [
        "gcloud", "compute", "instances", "start", "llama-vm", "--zone=us-east5-b", "--project=tpu-proj-123",
    ]  # fmt: skip


def test_each_stage_runs_on_its_vm() -> None:
    """Conversion and export on the CPU VM (the converters force JAX onto the CPU), training on the
    TPU VM; MaxText is installed on both; another VM for a fixed stage is refused."""
    pipeline = _pipeline()

    def vm_of(stage: str, machine: str | None = None) -> str:
        return tpu_vm.stage_command(pipeline, stage, machine=machine).argv[3]

    assert vm_of("convert") == vm_of("export") == vm_of("install", "cpu") == "llama-vm-cpu"
    assert vm_of("train") == vm_of("install") == vm_of("install", "tpu") == "llama-vm"
    for stage, machine in (("convert", "tpu"), ("export", "tpu"), ("train", "cpu")):
        with pytest.raises(ValueError, match=f"the {stage} stage runs on the"):
            tpu_vm.stage_command(pipeline, stage, machine=machine)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_token_comes_from_secret_manager_in_every_stage(runtime: str) -> None:
    pipeline = _pipeline(runtime)
    for stage in ("convert", "train", "export"):
        command = tpu_vm.stage_command(pipeline, stage)
        assert command.argv[-1] == "--command=bash -s"
        assert command.stdin_text is not None
        assert "hf_access_token" not in command.stdin_text
        assert (
            "tpu_rl_hf_token=$(gcloud secrets versions access latest "
            "--secret=tpu-rl-hf-token-huggingface_default --project=tpu-proj-123)"
        ) in command.stdin_text
        # Never exported: only the MaxText command gets HF_TOKEN, not the gcloud copies after it.
        assert "export HF_TOKEN" not in command.stdin_text
        assert "export tpu_rl_hf_token" not in command.stdin_text
        token_lines = [line for line in command.stdin_text.splitlines() if "HF_TOKEN" in line]
        assert len(token_lines) == 1
        if runtime == "container":
            # sudo keeps it by name, docker passes it by name: the value is on no argv
            assert token_lines[0].startswith('HF_TOKEN="$tpu_rl_hf_token" sudo --preserve-env=')
            tokens = shlex.split(token_lines[0])
            assert tokens[0] == "HF_TOKEN=$tpu_rl_hf_token"
            assert all("HF_TOKEN=" not in t and "tpu_rl_hf_token" not in t for t in tokens[1:])
            assert "HF_TOKEN" in tokens[2].removeprefix("--preserve-env=").split(",")
            assert tokens[tokens.index("HF_TOKEN") - 1] == "-e"
        else:
            assert token_lines[0].startswith('HF_TOKEN="$tpu_rl_hf_token" python3 -m maxtext.')


def test_container_runtime_install_pulls_the_image_and_builds_nothing() -> None:
    """Runtime container: install_maxtext on the TPU VM installs Docker only when the image has none
    (apt with the boot-time lock handling), authenticates root's docker to the image's registry
    (gcloud's credential helper when root can run it, else an access token for the pull alone) and
    pulls the image; no uv, no pip, no apt upgrade. So does the CPU VM (its
    conversions run in the same image)."""
    pipeline = _pipeline()
    command = tpu_vm.stage_command(pipeline, "install")
    assert command.argv[3] == "llama-vm"
    script = command.stdin_text or ""
    assert script == "\n".join(
        [
            "set -euo pipefail",
            "if ! command -v docker >/dev/null 2>&1; then",
            *(f"  {line}" for line in tpu_vm.APT_UPDATE_AFTER_BOOT),
            "  sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y docker.io",
            "fi",
            "if sudo sh -c 'command -v docker-credential-gcloud' >/dev/null 2>&1; then",
            "  sudo gcloud auth configure-docker us-docker.pkg.dev --quiet",
            f"  sudo docker pull {IMAGE}",
            "else",
            "  echo 'docker-credential-gcloud is not on root PATH: logging in to us-docker.pkg.dev with an access "
            "token' >&2",
            "  gcloud auth print-access-token | sudo docker login --username=oauth2accesstoken --password-stdin "
            "us-docker.pkg.dev",
            f"  sudo docker pull {IMAGE} || {{ sudo docker logout us-docker.pkg.dev; exit 1; }}",
            "  sudo docker logout us-docker.pkg.dev",
            "fi",
            "",
        ]
    )
    for absent in ("uv ", "pip install", "upgrade", "install_tpu_post_train_extra_deps", "HF_TOKEN"):
        assert absent not in script
    cpu = tpu_vm.stage_command(pipeline, "install", machine="cpu")
    assert cpu.argv[3] == "llama-vm-cpu"
    assert cpu.stdin_text == script


def test_install_runtime_is_the_seed_install() -> None:
    """Runtime install: today's scripts exactly (the source install, training in its venv)."""
    pipeline = _pipeline("install")
    assert tpu_vm.stage_command(pipeline, "install").stdin_text == tpu_vm.install_script()
    assert tpu_vm.stage_command(pipeline, "train").stdin_text == tpu_vm.train_script(pipeline)
    assert "docker" not in tpu_vm.train_script(pipeline)


def test_container_runtime_train_runs_in_the_image() -> None:
    """docker run --rm --privileged --net=host --ipc=host (Cloud TPU's flags for TPU access), a
    fixed name whose leftover from an earlier try is looked at first (followed, refused or removed:
    tests/render/test_tpu_vm.py), then the image and train_rl."""
    image = "europe-docker.pkg.dev/my-proj/images/post-train:v1@sha256:" + "b" * 64
    pipeline = _pipeline(workload_image=image)
    script = tpu_vm.stage_command(pipeline, "train").stdin_text or ""
    lines = _script_lines(script)
    assert lines[0] == ["set", "-euo", "pipefail"]
    assert script.splitlines()[1].startswith("if found=$(sudo docker inspect ")
    (docker,) = [t for t in lines if t[1:2] == ["sudo"]]
    at = docker.index(image)
    assert docker[3:9] == ["docker", "run", "--name=tpu-rl-train", "--rm", "--privileged", "--net=host"]
    assert docker[9] == "--ipc=host"
    assert docker[at + 1 : at + 4] == ["python3", "-m", "maxtext.trainers.post_train.rl.train_rl"]
    assert "source" not in script
    assert "maxtext_venv" not in script
    # only the registry of the image is configured, by its host
    install = tpu_vm.stage_command(pipeline, "install").stdin_text or ""
    assert "sudo gcloud auth configure-docker europe-docker.pkg.dev --quiet" in install
    assert f"sudo docker pull {shlex.quote(image)}" in install
