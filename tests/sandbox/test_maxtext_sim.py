"""The sandbox's MaxText simulation writes what MaxText and Orbax write.

Each pipeline's converter calls, as ``tpu-rl plan`` renders them (model and bucket swapped, as the
real-converter leg swaps them: ``tools/maxtext_real/pipelines.py``), and a training run's step, run
through the simulation on an in-memory bucket (or a machine's disk) that records every write, give
the layouts ``make test-maxtext`` recorded from MaxText's own converters and tunix's checkpoint
manager (``tests/fixtures/maxtext/real_layouts.json``): the same files, written in the same order,
the same ``_CHECKPOINT_METADATA`` and commit markers, the same ``config.json``; and the simulated
readers refuse what the real ones refused, with their messages.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.maxtext import layout
from tools.maxtext_real import layouts, pipelines
from tools.maxtext_real.pipelines import PIPELINES, Pipeline
from tpu_rl_sandbox.apis.gcs_client import GcsError, ObjectInfo
from tpu_rl_sandbox.machines import hf_export, maxtext_sim
from tpu_rl_sandbox.machines.fsview import GcsStore, LocalStore, Router

BUCKET = "sim-bucket"
ROOT = f"gs://{BUCKET}"
ACTOR_STEP = 10
ACTOR_ITEMS = ("model_params", "optimizer_state")
FIXTURE = layouts.load()


class RecordingGcs:
    """An in-memory bucket that records each write (``+``) and delete (``-``), in order."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.events: list[tuple[str, str]] = []

    def get_bucket(self, bucket: str) -> dict[str, Any] | None:
        return {"name": bucket} if bucket == BUCKET else None

    def upload(self, bucket: str, name: str, data: bytes) -> None:
        self.objects[name] = data
        self.events.append(("+", name))

    def download(self, bucket: str, name: str) -> bytes:
        if name not in self.objects:
            raise GcsError(404, "No such object")
        return self.objects[name]

    def exists(self, bucket: str, name: str) -> bool:
        return name in self.objects

    def delete(self, bucket: str, name: str) -> None:
        del self.objects[name]
        self.events.append(("-", name))

    def iter_objects(self, bucket: str, prefix: str = "") -> Iterator[ObjectInfo]:
        for name in sorted(self.objects):
            if name.startswith(prefix):
                yield ObjectInfo(bucket=bucket, name=name, size=len(self.objects[name]), updated="")

    def under(self, prefix: str) -> tuple[list[str], list[tuple[str, str]]]:
        """Object names and events below ``prefix``, relative to it."""
        folder = prefix.rstrip("/") + "/"
        names = [n[len(folder) :] for n in self.objects if n.startswith(folder)]
        return names, [(kind, n[len(folder) :]) for kind, n in self.events if n.startswith(folder)]


class RecordingDisk(LocalStore):
    """A machine's disk that records folders made (``mkdir``), files written and folders renamed (``mv``)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.events: list[tuple[str, str]] = []

    def write(self, path: str, data: bytes) -> None:
        missing = []
        folder = self.host_path(path).parent
        while not folder.exists():
            missing.append(folder)
            folder = folder.parent
        for made in reversed(missing):
            self.events.append(("mkdir", "/" + made.relative_to(self.root).as_posix()))
        super().write(path, data)
        self.events.append(("+", path))

    def make_dir(self, path: str) -> None:
        if not self.host_path(path).exists():
            self.events.append(("mkdir", path))
        super().make_dir(path)

    def rename_dir(self, src: str, dst: str) -> None:
        super().rename_dir(src, dst)
        self.events.append(("mv", dst))


def context(gcs: RecordingGcs, disk: LocalStore | None, pipeline: Pipeline, *, training: bool) -> Any:
    """Where the pipeline runs the program: conversions on a CPU machine (the TPU VM pipeline's CPU
    VM, the GKE pipeline's CPU pod), training on the TPU VM or the GKE job's Pathways head."""
    if training:
        platform, chips = ("gke", None) if pipeline.pathways else ("vm", 8)
    else:
        platform, chips = ("gke" if pipeline.name == "gke" else "vm", 0)
    return maxtext_sim.SimContext(
        router=Router(gcs=GcsStore(gcs), local=disk),  # type: ignore[arg-type]
        write=lambda text: None,
        platform=platform,
        seed="real-layouts",
        maxtext_version=pipeline.release,
        step_seconds=0.0,
        tpu_chips=chips,
    )


def run(module: str, argv: list[str], ctx: Any) -> tuple[int, str]:
    output: list[str] = []
    ctx.write = output.append
    code = maxtext_sim.run(
        module, argv[3:] if argv[:2] == ["python3", "-m"] else argv, {"HF_TOKEN": "hf_x"}, ctx
    )
    return code, "".join(output)


@cache
def rendered(dag_id: str) -> dict[str, list[str]]:
    return pipelines.converter_calls(pipelines.plan(dag_id))


@dataclass
class Simulated:
    """One pipeline's conversion, training step and export, simulated on a recording bucket."""

    pipeline: Pipeline
    gcs: RecordingGcs
    converted: str  # object prefixes
    actor: str
    export: str
    export_argv: list[str]
    outputs: dict[str, str] = field(default_factory=dict)

    def layout(self, kind: str) -> dict[str, Any]:
        prefix = {"converted": self.converted, "actor": self.actor, "export": self.export}[kind]
        names, events = self.gcs.under(prefix)
        read = lambda name: self.gcs.objects[f"{prefix}/{name}"]  # noqa: E731
        if kind == "export":
            return layouts.export_layout(names, read, events)
        step, items = (
            (0, layout.CONVERTED_CHECKPOINT_ITEMS) if kind == "converted" else (ACTOR_STEP, ACTOR_ITEMS)
        )
        return layouts.checkpoint_layout(names, read, events, step, items, f"{ROOT}/{prefix}")


def prefix_of(uri: str) -> str:
    return uri.removeprefix(ROOT + "/").rstrip("/")


def with_model(argv: list[str], model: str) -> list[str]:
    return [f"model_name={model}" if word.startswith("model_name=") else word for word in argv]


def simulate(pipeline: Pipeline, gcs: RecordingGcs, model: str = pipelines.MODEL) -> Simulated:
    """The pipeline's rendered conversion and export (and a training step) of ``model``."""
    calls = rendered(pipeline.dag_id)
    repo = maxtext_sim.HF_IDS[model]
    convert = with_model(pipelines.localize(calls["convert_to_maxtext"], ROOT, repo), model)
    export = with_model(
        pipelines.localize(calls["export_to_huggingface"], ROOT, repo, step=ACTOR_STEP), model
    )
    converted = pipelines.value(convert, "base_output_directory")
    load = pipelines.value(export, "load_parameters_path").rstrip("/")
    run_dir, _, _ = load.rpartition("/checkpoints/actor/")
    base, _, run_name = run_dir.rpartition("/")
    sim = Simulated(
        pipeline,
        gcs,
        prefix_of(converted),
        prefix_of(load.rsplit("/", 2)[0]),
        prefix_of(pipelines.value(export, "base_output_directory")),
        export,
    )
    code, sim.outputs["convert"] = run(
        maxtext_sim.TO_MAXTEXT, convert, context(gcs, None, pipeline, training=False)
    )
    assert code == 0, sim.outputs["convert"]
    train = [
        f"model_name={model}",
        f"load_parameters_path={converted.rstrip('/')}/0/items",
        f"base_output_directory={base}/",
        f"run_name={run_name}",
        f"num_batches={ACTOR_STEP}",
        f"checkpoint_period={ACTOR_STEP}",
        "num_test_batches=0",
    ]
    code, sim.outputs["train"] = run(maxtext_sim.TRAIN_RL, train, context(gcs, None, pipeline, training=True))
    assert code == 0, sim.outputs["train"]
    code, sim.outputs["export"] = run(
        maxtext_sim.TO_HUGGINGFACE, export, context(gcs, None, pipeline, training=False)
    )
    assert code == 0, sim.outputs["export"]
    return sim


@pytest.fixture(scope="module", params=sorted(PIPELINES))
def simulated(request: pytest.FixtureRequest) -> Simulated:
    return simulate(PIPELINES[request.param], RecordingGcs())


@pytest.mark.parametrize("kind", ["converted", "actor", "export"])
def test_the_simulation_writes_the_real_layout(simulated: Simulated, kind: str) -> None:
    assert simulated.layout(kind) == FIXTURE[f"{simulated.pipeline.name}.{kind}"]


def test_the_simulated_export_holds_the_real_tensor_bytes(simulated: Simulated) -> None:
    index_free = simulated.gcs.under(simulated.export)[0]
    assert layout.HF_INDEX_FILE not in index_free
    assert (
        hf_export.MODELS[pipelines.MODEL].total_size
        == FIXTURE[f"{simulated.pipeline.name}.export_tensor_bytes"]
    )


def test_a_model_above_the_shard_size_is_sharded_as_maxtext_shards_it() -> None:
    """The GKE pipeline's own model (qwen3-30b-a3b, 61 GB): 19 shards, then the index."""
    gcs = RecordingGcs()
    sim = simulate(PIPELINES["gke"], gcs, model="qwen3-30b-a3b")
    real = FIXTURE["gke.export_sharded"]  # qwen3-0.6b with the shard size lowered to 300 MB
    found = sim.layout("export")
    assert (found["files"], found["order"]) == (real["files"], real["order"])
    names = gcs.under(sim.export)[0]
    assert sorted(n for n in names if n.endswith(".safetensors")) == [
        f"model-{i:05d}-of-00019.safetensors" for i in range(1, 20)
    ]
    index = json.loads(gcs.objects[f"{sim.export}/{layout.HF_INDEX_FILE}"])
    assert index["metadata"]["total_size"] == 61_064_245_248
    # the lowered shard size splits qwen3-0.6b's real tensor bytes into the real run's shard count
    assert math.ceil(hf_export.MODELS[pipelines.MODEL].total_size / real["max_shard_bytes"]) == real["shards"]


@pytest.mark.parametrize("model", sorted(hf_export.MODELS))
def test_each_model_takes_at_least_its_size_in_shards(model: str) -> None:
    exported = hf_export.MODELS[model]
    assert exported.shards >= math.ceil(exported.total_size / hf_export.MAX_SHARD_SIZE)
    assert hf_export.config_json(exported, "0.2.3")["transformers_version"] == "5.11.0"


def test_the_readers_refuse_an_item_without_its_marker(simulated: Simulated) -> None:
    item = f"{simulated.actor}/{ACTOR_STEP}/model_params"
    marker = simulated.gcs.objects.pop(f"{item}/{layout.COMMIT_SUCCESS_FILE}")
    try:
        code, output = run(
            maxtext_sim.TO_HUGGINGFACE,
            simulated.export_argv,
            context(simulated.gcs, None, simulated.pipeline, training=False),
        )
    finally:
        simulated.gcs.objects[f"{item}/{layout.COMMIT_SUCCESS_FILE}"] = marker
    assert code == 1
    expected = FIXTURE[f"{simulated.pipeline.name}.reader_without_item_marker"]
    assert expected.replace("<item folder>", f"{ROOT}/{item}") in output.splitlines()


def test_hf_model_path_and_a_missing_checkpoint_as_each_release_answers(simulated: Simulated) -> None:
    release = simulated.pipeline.release
    argv = [
        f"load_parameters_path={ROOT}/nothing/model_params" if w.startswith("load_parameters_path=") else w
        for w in simulated.export_argv
    ] + ["--hf_model_path=Qwen/Qwen3-0.6B"]
    code, output = run(
        maxtext_sim.TO_HUGGINGFACE, argv, context(simulated.gcs, None, simulated.pipeline, training=False)
    )
    assert code == 1
    assert FIXTURE[f"to_huggingface_hf_model_path.{release}"] in output.splitlines()


def test_a_step_on_a_machine_disk_is_renamed_into_place(tmp_path: Path) -> None:
    """Orbax's atomic rename on a local disk (the TPU VM's training writes to GCS; a script may not)."""
    pipeline = PIPELINES["tpu_vm"]
    disk = RecordingDisk(tmp_path)
    gcs = RecordingGcs()
    convert = [
        "model_name=qwen3-0.6b",
        "base_output_directory=/dev/shm/mt/",
        "hardware=cpu",
        "skip_jax_distributed_system=true",
    ]
    assert run(maxtext_sim.TO_MAXTEXT, convert, context(gcs, disk, pipeline, training=False))[0] == 0
    train = [
        "model_name=qwen3-0.6b",
        "load_parameters_path=/dev/shm/mt/0/items",
        "base_output_directory=/dev/shm/post/",
        "run_name=r",
        f"num_batches={ACTOR_STEP}",
        f"checkpoint_period={ACTOR_STEP}",
        "num_test_batches=0",
    ]
    code, output = run(maxtext_sim.TRAIN_RL, train, context(gcs, disk, pipeline, training=True))
    assert code == 0, output
    actor = "/dev/shm/post/r/checkpoints/actor/"
    events = [(kind, name[len(actor) :]) for kind, name in disk.events if name.startswith(actor)]
    names = [
        p.relative_to(tmp_path / actor.lstrip("/")).as_posix()
        for p in (tmp_path / actor.lstrip("/")).rglob("*")
        if p.is_file()
    ]
    real = FIXTURE["local.actor"]
    assert {"files": layouts.files(names), "order": layouts.checkpoint_order(events, ACTOR_ITEMS)} == real


@pytest.mark.parametrize(("release", "refused"), [("0.2.3", True), ("0.2.4", False)])
def test_to_huggingface_flags_by_release(release: str, refused: bool) -> None:
    """``--hf_model_path`` is an absl flag of maxtext-v0.2.4's to_huggingface only (l.112-119); the
    TPU VM's runtime ``install`` runs 0.2.3, whose absl refuses it without a traceback."""
    argv = ["model_name=qwen3-0.6b", "--hf_model_path=Qwen/Qwen3-0.6B"]
    if not refused:
        assert maxtext_sim.parse_args(maxtext_sim.TO_HUGGINGFACE, argv, release).flags["hf_model_path"]
        return
    with pytest.raises(maxtext_sim.WorkloadFailed) as failure:
        maxtext_sim.parse_args(maxtext_sim.TO_HUGGINGFACE, argv, release)
    assert failure.value.lines[0] == "FATAL Flags parsing error: Unknown command line flag 'hf_model_path'"
    assert failure.value.traceback is False
