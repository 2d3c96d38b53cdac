"""The MaxText job operators finishing without a sandbox: their job's output is found complete, so
``execute_complete`` returns as after a successful job (what asset events and lineage are read from)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from airflow_provider_tpu_rl.operators.gke_jobs import (
    MaxTextConvertOperator,
    MaxTextExportOperator,
    PathwaysRLTrainOperator,
    _GclusterJobOperator,
)

RUN_ID = "manual__2026-03-01T00:00:00+00:00"
BUCKET = "b-1"
MODEL = "qwen3-30b-a3b"
ARGUMENTS: dict[type[_GclusterJobOperator], dict[str, Any]] = {
    MaxTextConvertOperator: {"task_id": "convert_to_maxtext"},
    PathwaysRLTrainOperator: {"task_id": "train", "run_name": "rl-1", "num_batches": 3},
    MaxTextExportOperator: {"task_id": "export_to_huggingface", "run_name": "rl-1", "checkpoint_step": 3},
}


@dataclass
class _NoRecord:
    """A run directory record with no earlier run and no attempts."""

    attempts: tuple[Any, ...] = ()

    def before(self, run: str) -> None:
        return None


class _Records:
    def read(self, bucket: str, run_dir: str) -> _NoRecord:
        return _NoRecord()


def job_operator(factory: type[_GclusterJobOperator], **kwargs: Any) -> Any:
    """One of the job operators with explicit arguments, as a user's DAG gives them."""
    return factory(
        project_id="p-123456", location="us-east5", cluster_name="c1", bucket=BUCKET, model=MODEL,
        job_name="tpu-rl-job-1", **{**ARGUMENTS[factory], **kwargs},
    )  # fmt: skip


def finish(
    op: _GclusterJobOperator, monkeypatch: pytest.MonkeyPatch, context: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``execute_complete`` after the job succeeded: its output verified complete (no GCS call)."""
    ready = {"checkpoint_uri": "gs://b-1/x/0/items/", "uris": ["gs://b-1/x/0/items/"], "step": 0}
    monkeypatch.setattr(op, "output_ready", lambda plan: ready)
    monkeypatch.setattr(op, "run_records", lambda: _Records())
    event = {"status": "success", "job_name": "tpu-rl-job-1", "foreign": True, "metrics": {"last_step": 3}}
    context = {} if context is None else context
    context.setdefault("run_id", RUN_ID)
    result: dict[str, Any] = op.execute_complete(context, event)
    return result
