"""The real-converter leg's outputs: MaxText's own converters run once per pipeline and session.

``make test-maxtext`` builds a CPU venv per MaxText release the pipelines pin
(``tools/maxtext_real/setup.sh``, releases from ``tools/maxtext_real/pipelines.py``) and runs this
folder with the project's venv (``TPU_RL_MAXTEXT_LEG=1``: ``tests/conftest.py`` leaves the folder out
of every other leg). For each pipeline a session fixture runs, in a local folder that stands for the
bucket and with Orbax's GCS commit-file atomicity (the provider judges GCS listings):

1. ``to_maxtext`` with the keys ``tpu-rl plan`` renders, on a random-weight ``qwen3-0.6b`` built here
   and served from an offline Hugging Face cache (``tools/maxtext_real/tiny_model.py``);
2. a training-style actor step written by tunix's own checkpoint manager with ``train_rl``'s options
   (``tools/maxtext_real/actor_step.py``);
3. ``to_huggingface`` with the rendered keys, from that actor step.

What each run writes, in order, is recorded (``tools/maxtext_real/writes.py``) for the layout
fixture the sandbox's simulation is compared against.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tools.maxtext_real import layouts, pipelines
from tools.maxtext_real.pipelines import PIPELINES, Pipeline
from tools.maxtext_real.writes import AuditLog, WriteLog

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools" / "maxtext_real"
ACTOR_STEP = 10
SHARDED_MAX_BYTES = 300_000_000  # below qwen3-0.6b's 1.19 GB: the sharded path, 4 shards
RUN_TIMEOUT = 900
TIMINGS: dict[str, float] = {}


def venv_python(release: str) -> Path:
    """The Python of the release's venv (built by ``make test-maxtext``)."""
    venvs = Path(os.environ.get("MAXTEXT_VENVS", ROOT))
    return venvs / f".venv-maxtext-{release}" / "bin" / "python"


@pytest.fixture(scope="session", autouse=True)
def _venvs_built() -> None:
    for release in pipelines.releases():
        if not venv_python(release).is_file():
            pytest.fail(
                f"no MaxText {release} venv at {venv_python(release).parent.parent}: run make test-maxtext"
            )


def run(label: str, argv: list[str], env: dict[str, str], log: Path) -> subprocess.CompletedProcess[bytes]:
    """Run one MaxText program, its output in ``log``; its wall time in TIMINGS."""
    start = time.monotonic()
    with log.open("wb") as out:
        done = subprocess.run(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT, check=False
        )
    TIMINGS[label] = time.monotonic() - start
    return done


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


@pytest.fixture(scope="session")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An offline Hugging Face home holding the random-weight Qwen/Qwen3-0.6B (model + tokenizer)."""
    root = tmp_path_factory.mktemp("hf")
    release = PIPELINES["gke"].release
    argv = [
        str(venv_python(release)),
        str(TOOLS / "tiny_model.py"),
        str(root / "src"),
        "--hf-home",
        str(root / "home"),
    ]
    done = run("tiny model", argv, converter_env(root / "home"), root / "tiny_model.log")
    assert done.returncode == 0, tail(root / "tiny_model.log")
    return root / "home"


def converter_env(hf_home: Path) -> dict[str, str]:
    """The converters' environment: offline, the model and tokenizer from ``hf_home``'s cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "JAX_", "XLA_", "TPU_RL_"))}
    return {**env, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_TOKEN": "unused-offline"}


def snapshot(hf_home: Path) -> Path:
    return next((hf_home / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots").iterdir())


@dataclass
class Outputs:
    """One pipeline's converted checkpoint, actor step and export in a folder standing for a bucket."""

    pipeline: Pipeline
    bucket: Path
    logs: Path
    env: dict[str, str]
    plan: dict[str, Any]
    export_argv: list[str]  # python3 -m maxtext… as localized, for the reruns of negative tests
    hf_src: Path
    converted: str  # the checkpoint roots and the export folder, relative to the bucket
    actor: str
    export: str
    events: dict[str, list[tuple[str, str]]] = field(default_factory=dict)


def converter_argv(release: str, localized: list[str], *extra: str) -> list[str]:
    """``python3 -m MODULE ARGS`` run by run_converter.py in the release's venv, GCS atomicity on."""
    assert localized[:2] == ["python3", "-m"], localized
    return [
        str(venv_python(release)),
        str(TOOLS / "run_converter.py"),
        "--gcs-atomicity",
        *extra,
        *localized[2:],
    ]


def actor_argv(pipeline: Pipeline, items_dir: Path, actor_dir: Path, *, gcs: bool = True) -> list[str]:
    argv = [
        str(venv_python(pipeline.release)),
        str(TOOLS / "actor_step.py"),
        str(items_dir),
        str(actor_dir),
        str(ACTOR_STEP),
        "--period",
        str(ACTOR_STEP),
    ]
    return argv + (["--pathways"] if pipeline.pathways else []) + (["--gcs-atomicity"] if gcs else [])


@pytest.fixture(scope="session", params=sorted(PIPELINES))
def outputs(
    request: pytest.FixtureRequest, hf_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Outputs]:
    pipeline = PIPELINES[request.param]
    bucket = tmp_path_factory.mktemp(f"bucket-{pipeline.name}")
    logs = tmp_path_factory.mktemp(f"logs-{pipeline.name}")
    env = converter_env(hf_home)
    rendered = pipelines.plan(pipeline.dag_id)
    calls = pipelines.converter_calls(rendered)
    snap = snapshot(hf_home)

    convert = pipelines.localize(calls["convert_to_maxtext"], bucket, snap)
    converted_root = Path(pipelines.value(convert, "base_output_directory"))
    export = pipelines.localize(calls["export_to_huggingface"], bucket, snap, step=ACTOR_STEP)
    actor_dir = Path(pipelines.value(export, "load_parameters_path").rstrip("/")).parent.parent
    export_dir = Path(pipelines.value(export, "base_output_directory"))
    rel = lambda path: path.relative_to(bucket).as_posix()  # noqa: E731
    out = Outputs(
        pipeline,
        bucket,
        logs,
        env,
        rendered,
        export,
        hf_home.parent / "src",
        rel(converted_root),
        rel(actor_dir),
        rel(export_dir),
    )

    # Orbax's and MaxText's own writes are recorded from inside the programs (write_audit.py);
    # the export's, some of which are native, with inotify, on a folder that already exists.
    for folder in (converted_root, actor_dir, export_dir):
        folder.mkdir(parents=True)
    audit = AuditLog(bucket, logs / "to_maxtext.writes")
    log = logs / "to_maxtext.log"
    done = run(
        f"{pipeline.name} to_maxtext",
        converter_argv(pipeline.release, convert),
        env | audit.env(),
        log,
    )
    assert done.returncode == 0, tail(log)
    audit.read().check_complete(out.converted, layouts.is_milestone_file)
    out.events["converted"] = audit.under(out.converted)

    audit = AuditLog(bucket, logs / "actor_step.writes")
    log = logs / "actor_step.log"
    argv = actor_argv(pipeline, converted_root / "0" / "items", actor_dir)
    done = run(f"{pipeline.name} actor step", argv, env | audit.env(), log)
    assert done.returncode == 0, tail(log)
    audit.read().check_complete(out.actor, layouts.is_milestone_file)
    out.events["actor"] = audit.under(out.actor)

    log = logs / "to_huggingface.log"
    with WriteLog(bucket) as writes:
        done = run(f"{pipeline.name} to_huggingface", converter_argv(pipeline.release, export), env, log)
    assert done.returncode == 0, tail(log)
    writes.check_complete(out.export, layouts.is_milestone_file)
    out.events["export"] = writes.under(out.export)
    yield out
    shutil.rmtree(bucket, ignore_errors=True)  # ~2 GB a pipeline


def clone(outputs: Outputs, tmp_path: Path) -> Path:
    """A hard-linked copy of the bucket folder, to damage."""
    copy = tmp_path / "bucket"
    shutil.copytree(outputs.bucket, copy, copy_function=os.link)
    return copy


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.section("MaxText programs (wall seconds)")
        for label, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{label}: {seconds:.1f} s")
