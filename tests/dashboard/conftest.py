"""The dashboard tests' ledger: three runs of two DAGs, on SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_tpu_rl.ledger.hook import RunLedger, sqlite_connection_uri
from airflow_provider_tpu_rl.ledger.records import ArtifactRecord, MetricRecord, RunRecord
from tests.ledger.fakes import minutes

GKE, VM = "tpu_rl_gke_pipeline", "tpu_rl_tpu_vm_pipeline"
CURVES = "gs://bkt/qwen/trained/rl/tpu-rl-curves-ab.png"


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunLedger:
    """Two runs of the GKE DAG (one with curves) and one of the TPU VM DAG."""
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_connection_uri(tmp_path / "ledger.db"))
    ledger = RunLedger()
    rewards = [MetricRecord("pre", 0, "mean_reward", 0.0884), MetricRecord("post", 0, "mean_reward", 0.245)]
    ledger.record(
        RunRecord(
            GKE, "manual__a+1", "qwen3-30b-a3b", "success", started_at=minutes(0), ended_at=minutes(75)
        ),
        metrics=rewards,
        artifacts=[
            ArtifactRecord("hf_export", "gs://bkt/qwen/hf-trained/rl/"),
            ArtifactRecord("curves", CURVES),
        ],
    )
    ledger.record(RunRecord(GKE, "<b>odd</b>", "qwen3-30b-a3b", "failed", started_at=minutes(90)))
    ledger.record(
        RunRecord(VM, "vm1", "llama3.1-8b", "success", started_at=minutes(30)),
        metrics=[MetricRecord("post", 0, "mean_reward", 0.7)],
    )
    return ledger
