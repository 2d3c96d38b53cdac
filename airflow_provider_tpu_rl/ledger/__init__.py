"""The run ledger: which pipeline runs happened, their settings, rewards, exports, TPU cost, failures.

This package's top level and ``records``, ``dialects``, ``schema``, ``collect`` import no Airflow;
``hook`` (``RunLedger``) and ``cli`` do.
"""

from __future__ import annotations

from airflow_provider_tpu_rl.ledger.collect import collect_run_from_context
from airflow_provider_tpu_rl.ledger.records import (
    ArtifactRecord,
    MetricRecord,
    RunRecord,
    RunSummary,
    StepRecord,
    estimate_chip_hours,
    make_run_id,
)

__all__ = [
    "ArtifactRecord",
    "MetricRecord",
    "RunRecord",
    "RunSummary",
    "StepRecord",
    "collect_run_from_context",
    "estimate_chip_hours",
    "make_run_id",
]
