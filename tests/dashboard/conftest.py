"""The dashboard tests' ledgers, on SQLite: three runs of two DAGs, and a run of every kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_tpu_rl.ledger.billing import BilledSpan
from airflow_provider_tpu_rl.ledger.hook import RunLedger, sqlite_connection_uri
from airflow_provider_tpu_rl.ledger.records import (
    ArtifactRecord,
    MetricRecord,
    RunClosing,
    RunRecord,
    StepRecord,
)
from tests.support.ledger_fakes import minutes

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


# Every kind of row the ledger can hold, one run each (EVERY_STATE: airflow run id -> what it is).
REFUSAL = "refused at validate: project, bucket: set project to your GCP project (my-tpu-project is the form's example)"
SETTINGS = {
    "model": "qwen3-30b-a3b",
    "capacity": "spot",
    "steps": 50,
    "learning_rate": "2e-5",
    "run_name": "rl-abc123",
    "compute_type": "ct6e-standard-4t",
    "topology": "4x8",
    "num_slices": 1,
    "train_overrides": {"num_test_batches": 2},
}
EVERY_STATE = {
    "refused": "refused at validate: no settings, no stage, its reason in one line",
    "failed": "failed in training: no metrics, no picture",
    "running": "still running: listed from its validate on, with its settings",
    "no-picture": "succeeded without curves (matplotlib missing where record_run ran)",
    "success": "succeeded with its curves, rewards, TPU time and cost",
    "abandoned": "crashed: the janitor destroyed its cluster and closed its row, with why",
}
ABANDONED_REASON = (
    "janitor: destroyed cluster c1 (orphaned: its DAG run tpu_rl_gke_pipeline/abandoned is running "
    "but none of its tasks has been alive since 2026-03-01T09:25:00+00:00)"
)


def billed(start: float, end: float, chips: int) -> tuple[BilledSpan, ...]:
    """The TPU machines' billed span by their clocks, here the capacity tasks' span (one machine)."""
    return (BilledSpan("tpu-vm", "1", chips, minutes(start), minutes(end)),)


@pytest.fixture
def every_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunLedger:
    """One GKE run of each kind in :data:`EVERY_STATE`, as the pipelines record them."""
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_connection_uri(tmp_path / "states.db"))
    ledger = RunLedger()
    model = "qwen3-30b-a3b"
    ledger.record(
        RunRecord(
            GKE, "refused", model, "failed", started_at=minutes(0), ended_at=minutes(1), refusal=REFUSAL
        ),
        steps=[StepRecord("validate", "failed", 1, minutes(0), minutes(0.2))],
    )
    ledger.record(
        RunRecord(
            GKE, "failed", model, "failed", started_at=minutes(10), ended_at=minutes(40), chips=32,
            cluster_started_at=minutes(15), cluster_ended_at=minutes(35), settings=SETTINGS,
            usd_per_chip_hour=2.7, billed_spans=billed(15, 35, 32),
        ),
        steps=[
            StepRecord("deploy_tpu_pool", "success", 1, minutes(15), minutes(20)),
            StepRecord("train", "failed", 2, minutes(20), minutes(33)),
        ],
    )  # fmt: skip
    ledger.record(
        RunRecord(GKE, "running", model, "running", started_at=minutes(50), chips=32, settings=SETTINGS),
        steps=[StepRecord("validate", "success", 1, minutes(50), minutes(50.5))],
    )
    ledger.record(
        RunRecord(
            GKE, "no-picture", model, "success", started_at=minutes(60), ended_at=minutes(61.45), chips=8,
            cluster_started_at=minutes(60.1), cluster_ended_at=minutes(61.63), train_started_at=minutes(60.5),
            train_ended_at=minutes(61.235), usd_per_chip_hour=2.7, settings={**SETTINGS, "capacity": "on-demand"},
            billed_spans=billed(60.1, 61.63, 8),
        ),
        metrics=[MetricRecord("pre", 0, "mean_reward", 0.1), MetricRecord("post", 0, "mean_reward", 0.2)],
    )  # fmt: skip
    ledger.record(
        RunRecord(
            GKE, "success", model, "success", started_at=minutes(70), ended_at=minutes(71.45), chips=32,
            cluster_started_at=minutes(70), cluster_ended_at=minutes(71), settings=SETTINGS,
            usd_per_chip_hour=2.7, billed_spans=billed(70, 71, 32),
        ),
        metrics=[MetricRecord("pre", 0, "mean_reward", 0.0884), MetricRecord("post", 0, "mean_reward", 0.245)],
        artifacts=[ArtifactRecord("curves", CURVES), ArtifactRecord("hf_export", "gs://bkt/qwen/hf-trained/rl/")],
    )  # fmt: skip
    ledger.record(RunRecord(GKE, "abandoned", model, "running", started_at=minutes(20), chips=32))
    ledger.close_run(
        RunClosing(f"{GKE}/abandoned", "abandoned", minutes(45), ABANDONED_REASON, billed(22, 45, 32), 2.7)
    )
    return ledger
