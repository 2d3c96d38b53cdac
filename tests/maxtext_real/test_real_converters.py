"""MaxText's real converters on a random-weight qwen3-0.6b, judged by the provider's own rules.

For each pipeline (its pinned MaxText release, the keys ``tpu-rl plan`` renders: conftest.py) the
provider's probes (``maxtext/layout.py``: what the checkpoint and export sensors, their triggers and
the job operators' output checks run) must call the real output complete when it is whole, and not
complete when a commit marker (the step's or an item's), an item or a weight file is missing.
MaxText's own reader is run on a damaged step once per release, to show what it refuses. The
normalised layouts (``tools/maxtext_real/layouts.py``) must equal ``tests/fixtures/maxtext/
real_layouts.json``, which the sandbox's simulation is compared against in the main suite;
``MAXTEXT_REAL_REFRESH=1 make test-maxtext`` rewrites the file instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.maxtext import layout
from tools.maxtext_real import layouts, pipelines
from tools.maxtext_real.bucket import checkpoint_verdict, export_verdict, object_names
from tools.maxtext_real.writes import AuditLog, WriteLog

from .conftest import (
    ACTOR_STEP,
    SHARDED_MAX_BYTES,
    Outputs,
    actor_argv,
    clone,
    converter_argv,
    run,
    snapshot,
    tail,
    venv_python,
)

REFRESH = os.environ.get("MAXTEXT_REAL_REFRESH") == "1"
ACTOR_ITEMS = ("model_params", "optimizer_state")


def compare_with_fixture(section: str, found: Any) -> None:
    """``found`` equals the fixture's ``section``, or (refreshing) replaces it."""
    fixture = layouts.load() if layouts.FIXTURE.exists() else {}
    if REFRESH:
        fixture[section] = found
        layouts.save(fixture)
        return
    assert section in fixture, (
        f"{layouts.FIXTURE} has no {section}: run MAXTEXT_REAL_REFRESH=1 make test-maxtext"
    )
    assert found == fixture[section], (
        f"MaxText's real {section} layout differs from {layouts.FIXTURE.name}: if the pins changed, "
        "refresh it (MAXTEXT_REAL_REFRESH=1 make test-maxtext) and make the sandbox's simulation match"
    )


def reader(folder: Path) -> Callable[[str], bytes]:
    return lambda name: (folder / name).read_bytes()


def checkpoint_layout(
    root: Path, events: list[tuple[str, str]], step: int, items: tuple[str, ...]
) -> dict[str, Any]:
    return layouts.checkpoint_layout(object_names(root), reader(root), events, step, items, str(root))


def export_layout(folder: Path, events: list[tuple[str, str]]) -> dict[str, Any]:
    return layouts.export_layout(object_names(folder), reader(folder), events)


def tensor_bytes(path: Path) -> int:
    """The bytes of the tensors a safetensors file holds (its header's offsets)."""
    with path.open("rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")


def ckpt(root: Path, prefix: str, step: int | None, items: tuple[str, ...]) -> dict[str, Any]:
    return checkpoint_verdict(root, prefix, step, items)


# -- the leg runs what the pipelines pin -------------------------------------------------------------
def test_the_release_is_the_one_the_pipelines_run(outputs: Outputs) -> None:
    """Conversion, training and export run in the workload image of the spec's release (one
    MaxText per run), and the leg's venv holds that release."""
    release = outputs.pipeline.release
    steps = {s["task_id"]: s for s in outputs.plan["steps"]}
    image = f"/tpu_post_training:{release}"
    for task in ("train", *pipelines.TASKS):
        words = " ".join([*steps[task]["argv"], *pipelines.step_texts(steps[task])]).split()
        assert any(word.endswith(image) for word in words), (task, words)
    found = list(venv_python(release).parent.parent.glob("lib/python3.12/site-packages/maxtext-*.dist-info"))
    assert [p.name for p in found] == [f"maxtext-{release}.dist-info"]


# -- the converted checkpoint (to_maxtext: step 0, item "items") ------------------------------------
def test_the_converted_step_is_complete(outputs: Outputs) -> None:
    verdict = ckpt(outputs.bucket, outputs.converted, 0, layout.CONVERTED_CHECKPOINT_ITEMS)
    assert verdict["complete"], verdict
    step = outputs.bucket / outputs.converted / "0"
    assert {p.name for p in step.iterdir()} == {"_CHECKPOINT_METADATA", "commit_success.txt", "items"}
    assert not list(step.parent.glob("*.orbax-checkpoint-tmp*"))


def test_the_converted_step_without_its_marker_is_in_progress(outputs: Outputs, tmp_path: Path) -> None:
    root = clone(outputs, tmp_path)
    (root / outputs.converted / "0" / "commit_success.txt").unlink()
    verdict = ckpt(root, outputs.converted, 0, layout.CONVERTED_CHECKPOINT_ITEMS)
    assert not verdict["complete"], verdict
    assert verdict["status"] == "in_progress", verdict


def test_the_converted_step_without_its_items_marker_is_not_complete(
    outputs: Outputs, tmp_path: Path
) -> None:
    """MaxText's reader refuses an item without its own marker (Orbax's is_path_finalized)."""
    root = clone(outputs, tmp_path)
    (root / outputs.converted / "0" / "items" / "commit_success.txt").unlink()
    verdict = ckpt(root, outputs.converted, 0, layout.CONVERTED_CHECKPOINT_ITEMS)
    assert not verdict["complete"], verdict
    assert verdict["missing"] == ["items/commit_success.txt"], verdict


# -- the actor step (tunix's CheckpointManager: model_params, optimizer_state) -----------------------
@pytest.mark.parametrize("items", [layout.RL_CHECKPOINT_ITEMS, ACTOR_ITEMS])
def test_the_actor_step_is_found(outputs: Outputs, items: tuple[str, ...]) -> None:
    for step in (ACTOR_STEP, None):
        verdict = ckpt(outputs.bucket, outputs.actor, step, items)
        assert verdict["complete"], verdict
        assert verdict["steps"] == {str(ACTOR_STEP): "complete"}, verdict
    step_dir = outputs.bucket / outputs.actor / str(ACTOR_STEP)
    assert {p.name for p in step_dir.iterdir()} == {
        "_CHECKPOINT_METADATA",
        "commit_success.txt",
        *ACTOR_ITEMS,
    }
    for item in ACTOR_ITEMS:
        # tunix's handlers: OCDBT unless under Pathways (tunix sft/checkpoint_manager.py l.53-63)
        assert (step_dir / item / "manifest.ocdbt").is_file() is (not outputs.pipeline.pathways)


def test_a_newer_uncommitted_step_is_not_the_latest(outputs: Outputs, tmp_path: Path) -> None:
    root = clone(outputs, tmp_path)
    actor = root / outputs.actor
    shutil.copytree(actor / str(ACTOR_STEP), actor / "20", copy_function=os.link)
    (actor / "20" / "commit_success.txt").unlink()
    latest = ckpt(root, outputs.actor, None, ACTOR_ITEMS)
    assert latest["complete"], latest
    assert latest["steps"] == {str(ACTOR_STEP): "complete", "20": "in_progress"}, latest


@pytest.mark.parametrize("removed", ["commit_success.txt", "model_params/commit_success.txt", "model_params"])
def test_a_damaged_actor_step_is_not_complete(outputs: Outputs, tmp_path: Path, removed: str) -> None:
    root = clone(outputs, tmp_path)
    target = root / outputs.actor / str(ACTOR_STEP) / removed
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    verdict = ckpt(root, outputs.actor, ACTOR_STEP, layout.RL_CHECKPOINT_ITEMS)
    assert not verdict["complete"], verdict
    if removed == "commit_success.txt":
        assert verdict["status"] == "in_progress", verdict
    else:  # committed without it: Orbax writes item markers before the step's, so it never appears
        assert verdict["status"] == "missing_items", verdict
        assert verdict["error"], verdict
    assert not ckpt(root, outputs.actor, None, layout.RL_CHECKPOINT_ITEMS)["complete"]


# -- the Hugging Face export ---------------------------------------------------------------------------
def test_the_export_is_complete(outputs: Outputs) -> None:
    verdict = export_verdict(outputs.bucket, outputs.export)
    assert verdict["complete"], verdict
    assert verdict["weight_files"] == [layout.HF_SINGLE_WEIGHTS_FILE]  # 1.19 GB: below the 3 GiB shard size
    weights = tensor_bytes(outputs.bucket / outputs.export / layout.HF_SINGLE_WEIGHTS_FILE)
    compare_with_fixture(f"{outputs.pipeline.name}.export_tensor_bytes", weights)


@pytest.mark.parametrize(
    "removed", ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"]
)
def test_an_export_without_a_file_is_not_complete(outputs: Outputs, tmp_path: Path, removed: str) -> None:
    root = clone(outputs, tmp_path)
    (root / outputs.export / removed).unlink()
    verdict = export_verdict(root, outputs.export)
    assert not verdict["complete"], verdict


def safetensors_digest(path: Path) -> dict[str, tuple[str, list[int], str]]:
    with path.open("rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        found = {}
        for key, meta in header.items():
            if key != "__metadata__":
                start, end = meta["data_offsets"]
                f.seek(8 + size + start)
                found[key] = (meta["dtype"], meta["shape"], hashlib.sha256(f.read(end - start)).hexdigest())
        return found


def test_the_round_trip_is_lossless(outputs: Outputs) -> None:
    """HF -> to_maxtext -> actor step -> to_huggingface gives back every tensor, bit for bit."""
    exported = safetensors_digest(outputs.bucket / outputs.export / "model.safetensors")
    assert exported == safetensors_digest(outputs.hf_src / "model.safetensors")


# -- MaxText's own reader --------------------------------------------------------------------------------
def last_error(log: Path, *replace: tuple[str, str]) -> str:
    """The last line of a failed run that names an error, with paths replaced."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    errors = [
        line
        for line in lines
        if line.startswith(("FATAL ", "ValueError", "AttributeError", "FileNotFoundError"))
    ]
    assert errors, tail(log)
    error = errors[-1]
    for old, new in replace:
        error = error.replace(old, new)
    return error


def test_maxtext_refuses_an_item_without_its_marker(outputs: Outputs, tmp_path: Path) -> None:
    root = clone(outputs, tmp_path)
    item = root / outputs.actor / str(ACTOR_STEP) / "model_params"
    (item / "commit_success.txt").unlink()
    argv = [word.replace(str(outputs.bucket), str(root)) for word in outputs.export_argv]
    log = tmp_path / "refused.log"
    done = run(
        f"{outputs.pipeline.name} to_huggingface (no item marker)",
        converter_argv(outputs.pipeline.release, argv),
        outputs.env,
        log,
    )
    assert done.returncode != 0
    error = last_error(log, (str(item), "<item folder>"))
    compare_with_fixture(f"{outputs.pipeline.name}.reader_without_item_marker", error)
    assert error == "ValueError: Found incomplete checkpoint at <item folder>."


def test_to_huggingface_with_hf_model_path_and_no_checkpoint(outputs: Outputs, tmp_path: Path) -> None:
    """``--hf_model_path`` is a flag of 0.2.4's to_huggingface only; a load path that holds no
    checkpoint fails on its metadata (no FileNotFoundError: MaxText reads the metadata first)."""
    missing = tmp_path / "nothing" / "model_params"
    argv = [
        f"load_parameters_path={missing}" if word.startswith("load_parameters_path=") else word
        for word in outputs.export_argv
    ] + [f"--hf_model_path={snapshot(Path(outputs.env['HF_HOME']))}"]
    log = tmp_path / "flag.log"
    done = run(
        f"{outputs.pipeline.name} to_huggingface --hf_model_path",
        converter_argv(outputs.pipeline.release, argv),
        outputs.env,
        log,
    )
    assert done.returncode != 0, tail(log)
    error = last_error(log)
    compare_with_fixture(f"to_huggingface_hf_model_path.{outputs.pipeline.release}", error)


# -- the layouts the sandbox's simulation is compared against ------------------------------------------
def test_the_layouts_match_the_fixture(outputs: Outputs) -> None:
    name = outputs.pipeline.name
    bucket = outputs.bucket
    converted = checkpoint_layout(
        bucket / outputs.converted, outputs.events["converted"], 0, layout.CONVERTED_CHECKPOINT_ITEMS
    )
    actor = checkpoint_layout(bucket / outputs.actor, outputs.events["actor"], ACTOR_STEP, ACTOR_ITEMS)
    export = export_layout(bucket / outputs.export, outputs.events["export"])
    compare_with_fixture(f"{name}.converted", converted)
    compare_with_fixture(f"{name}.actor", actor)
    compare_with_fixture(f"{name}.export", export)


def test_a_sharded_export(outputs: Outputs, tmp_path: Path) -> None:
    """Above the shard size: numbered shards, then the index (the shard size lowered to take that path)."""
    if outputs.pipeline.name != "gke":
        pytest.skip("one sharded export is enough")
    root = clone(outputs, tmp_path)
    out = root / "sharded"
    argv = [word.replace(str(outputs.bucket), str(root)) for word in outputs.export_argv]
    argv = [f"base_output_directory={out}/" if w.startswith("base_output_directory=") else w for w in argv]
    out.mkdir()
    log = tmp_path / "sharded.log"
    with WriteLog(root) as writes:
        argv = converter_argv(outputs.pipeline.release, argv, "--max-shard-bytes", str(SHARDED_MAX_BYTES))
        done = run("gke to_huggingface (sharded)", argv, outputs.env, log)
    assert done.returncode == 0, tail(log)
    writes.check_complete("sharded", layouts.is_milestone_file)
    verdict = export_verdict(root, "sharded")
    shards = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    assert verdict["complete"], verdict
    assert verdict["weight_files"] == shards, verdict
    found = export_layout(out, writes.under("sharded"))
    compare_with_fixture(
        "gke.export_sharded", {**found, "max_shard_bytes": SHARDED_MAX_BYTES, "shards": len(shards)}
    )
    (out / shards[1]).unlink()
    assert export_verdict(root, "sharded")["missing"] == [shards[1]]
    (out / layout.HF_INDEX_FILE).unlink()
    assert not export_verdict(root, "sharded")["complete"]


def test_an_actor_step_on_a_local_disk(outputs: Outputs, tmp_path: Path) -> None:
    """Orbax's atomic rename on a local disk: ``<step>.orbax-checkpoint-tmp`` and an
    ``<item>.orbax-checkpoint-tmp`` per item, renamed item first, then the step; no markers."""
    if outputs.pipeline.name != "tpu_vm":
        pytest.skip("one local step is enough")
    actor = tmp_path / "local" / "actor"
    actor.mkdir(parents=True)
    audit = AuditLog(tmp_path / "local", tmp_path / "local.writes")
    argv = actor_argv(outputs.pipeline, outputs.bucket / outputs.converted / "0" / "items", actor, gcs=False)
    done = run("tpu_vm actor step (local disk)", argv, outputs.env | audit.env(), tmp_path / "local.log")
    assert done.returncode == 0, tail(tmp_path / "local.log")
    audit.read().check_complete("actor", layouts.is_milestone_file)
    assert not list(actor.rglob(layout.COMMIT_SUCCESS_FILE))
    compare_with_fixture(
        "local.actor",
        {
            "files": layouts.files(object_names(actor)),
            "order": layouts.checkpoint_order(audit.under("actor"), ACTOR_ITEMS),
        },
    )
