"""Golden test for seed 002 (Llama 3.1 8B on one v6e-8 TPU VM)."""

from __future__ import annotations

import shlex

from airflow_provider_tpu_rl.render import tpu_vm
from airflow_provider_tpu_rl.spec import tpu_vm_pipeline_from_conf
from airflow_provider_tpu_rl.spec.workloads import DEFAULT_CHECKPOINT_PERIOD
from tests.golden.shellwords import commands, flags

MODEL = "llama3.1-8b-Instruct"


def _pipeline():
    return tpu_vm_pipeline_from_conf(
        {
            "project": "tpu-proj-123",
            "zone": "us-east5-b",
            "vm_name": "llama-vm",
            "reservation": "v6e8-res",
            "bucket": "rl-bucket-1",
        },
        run_id="manual__2026-11-30",
    )


def _values(pipeline) -> dict[str, str]:
    run = pipeline.training.run_name
    return {
        "TPU_NAME": "llama-vm",
        "ZONE": "us-east5-b",
        "PROJECT": "tpu-proj-123",
        "RESERVATION": "v6e8-res",
        "MODEL_NAME": MODEL,
        "HF_TOKEN": "hf_tutorial_token",
        "MODEL_CHECKPOINT_DIRECTORY": f"/dev/shm/{MODEL}/mt-format/",
        "USE_PATHWAYS": "0",
        "LAZY_LOAD_TENSORS": "False",
        # The seed writes $MODEL_CHECKPOINT_DIRECTORY/0/items (a double slash); same folder.
        "MAXTEXT_CKPT_PATH": f"/dev/shm/{MODEL}/mt-format/0/items",
        "RUN_NAME": run,
        "BASE_OUTPUT_DIRECTORY": f"/dev/shm/{MODEL}/post-train/",
        "CHIPS_PER_VM": "8",
        "NUM_BATCHES": "50",
        "HF_MODEL_NAME": "llama3.1-8b",
        "POST_TRAIN_PATH": f"/dev/shm/{MODEL}/post-train/{run}/checkpoints/actor/50/model_params",
        "HF_EXPORT": f"/dev/shm/{MODEL}/hf-trained/",
    }


def _script_lines(script: str) -> list[list[str]]:
    return [shlex.split(line) for line in script.splitlines() if line.strip()]


def _module_call(script: str, module: str) -> dict[str, str]:
    for tokens in _script_lines(script):
        if tokens[:1] == ["HF_TOKEN=$tpu_rl_hf_token"]:  # the token in this command's env alone
            tokens = tokens[1:]
        if tokens[:3] == ["python3", "-m", module]:
            return {k: v for k, _, v in (t.partition("=") for t in tokens[3:])}
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
    assert got == want
    assert list(tpu_vm.delete_vm(pipeline.vm).argv) == delete


def test_stage_scripts_match_tutorial() -> None:
    pipeline = _pipeline()
    values = _values(pipeline)
    convert = tpu_vm.convert_script(pipeline)
    want = _tutorial_call("llama_convert.sh", values)
    assert want.pop("hf_access_token") == "hf_tutorial_token"
    assert _module_call(convert, "maxtext.checkpoint_conversion.to_maxtext") == want

    train = tpu_vm.train_script(pipeline)
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

    export = tpu_vm.export_script(pipeline)
    want = _tutorial_call("llama_export.sh", values)
    assert _module_call(export, "maxtext.checkpoint_conversion.to_huggingface") == want


def test_outputs_leave_dev_shm_before_the_vm_goes() -> None:
    pipeline = _pipeline()
    train_lines = _script_lines(tpu_vm.train_script(pipeline))
    export_lines = _script_lines(tpu_vm.export_script(pipeline))
    run = pipeline.training.run_name
    gcs_step = f"gs://rl-bucket-1/{MODEL}/post-train/{run}/checkpoints/actor/50"
    assert train_lines[-2] == [
        "gcloud", "storage", "rsync", "--recursive", r"--exclude=(^|/)commit_success\.txt$",
        f"/dev/shm/{MODEL}/post-train/{run}/checkpoints/actor/50", gcs_step,
    ]  # fmt: skip
    # The commit marker goes last, after every other file of the step.
    assert train_lines[-1][-5:] == ["gcloud", "storage", "cp", "-", f"{gcs_step}/commit_success.txt"]
    assert export_lines[-1] == [
        "gcloud", "storage", "rsync", "--recursive",
        f"/dev/shm/{MODEL}/hf-trained", f"gs://rl-bucket-1/{MODEL}/hf-trained/{run}",
    ]  # fmt: skip


def test_token_comes_from_secret_manager_in_every_stage() -> None:
    pipeline = _pipeline()
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
        assert token_lines[0].startswith('HF_TOKEN="$tpu_rl_hf_token" python3 -m maxtext.')
