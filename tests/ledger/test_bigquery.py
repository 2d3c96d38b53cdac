"""The BigQuery ledger's jobs, against a fake BigQuery client (no BigQuery here: SQL and parameters only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlfluff

from airflow_provider_tpu_rl.ledger.dialects import Dialect
from airflow_provider_tpu_rl.ledger.hook import RunLedger
from airflow_provider_tpu_rl.ledger.records import MetricRecord, RunRecord, StepRecord

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


@dataclass
class FakeRow:
    values: dict[str, Any]

    def items(self) -> Any:
        return self.values.items()


@dataclass
class FakeJob:
    rows: list[FakeRow]

    def result(self) -> list[FakeRow]:
        return self.rows


@dataclass
class FakeClient:
    applied_versions: list[int] = field(default_factory=list)
    jobs: list[tuple[str, Any]] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)

    def query(self, sql: str, job_config: Any) -> FakeJob:
        self.jobs.append((sql, job_config))
        if sql.startswith("SELECT version FROM schema_migrations"):
            return FakeJob([FakeRow({"version": version}) for version in self.applied_versions])
        return FakeJob([])

    def create_dataset(self, dataset: str, exists_ok: bool) -> None:
        assert exists_ok
        self.datasets.append(dataset)


@dataclass
class FakeBigQueryHook:
    client: FakeClient
    project_id: str = "my-project"

    def get_client(self, project_id: str) -> FakeClient:
        assert project_id == self.project_id
        return self.client


@pytest.fixture
def bigquery_ledger(monkeypatch: pytest.MonkeyPatch) -> tuple[RunLedger, FakeClient]:
    monkeypatch.setenv(
        "AIRFLOW_CONN_TPU_RL_LEDGER", '{"conn_type": "gcpbigquery", "extra": {"dataset": "rl_results"}}'
    )
    ledger = RunLedger()
    client = FakeClient()
    ledger.__dict__["hook"] = FakeBigQueryHook(client)  # stands in for BigQueryHook(gcp_conn_id=...)
    return ledger, client


def parameters(job_config: Any) -> dict[str, tuple[str, Any]]:
    return {parameter.name: (parameter.type_, parameter.value) for parameter in job_config.query_parameters}


def test_connection_type_selects_bigquery_and_its_dataset(
    bigquery_ledger: tuple[RunLedger, FakeClient],
) -> None:
    ledger, _ = bigquery_ledger
    assert ledger.dialect is Dialect.BIGQUERY
    assert ledger.bigquery_dataset == "my-project.rl_results"


def test_migrations_create_the_dataset_and_run_each_bigquery_file(
    bigquery_ledger: tuple[RunLedger, FakeClient],
) -> None:
    ledger, client = bigquery_ledger
    client.applied_versions = [1]
    assert ledger.apply_migrations() == [2, 3, 4]
    assert client.datasets == ["my-project.rl_results"]
    sqls = [sql for sql, _ in client.jobs]
    assert sqls[0].startswith("CREATE TABLE IF NOT EXISTS schema_migrations")
    assert sqls[1] == "SELECT version FROM schema_migrations"
    assert "CLUSTER BY model, run_id" in sqls[2]  # 0002 from sql/bigquery/, as one script job
    assert sqls[3] == "INSERT INTO schema_migrations (version, applied_at) VALUES (@version, @applied_at)"
    version_type, version = parameters(client.jobs[3][1])["version"]
    assert (version_type, version) == ("INT64", 2)
    assert sqls[4].splitlines()[2:4] == [
        "ALTER TABLE runs",
        "ADD COLUMN IF NOT EXISTS train_started_at TIMESTAMP,",
    ]
    assert parameters(client.jobs[5][1])["version"] == ("INT64", 3)
    assert sqls[6].splitlines()[1:] == ["ALTER TABLE runs", "ADD COLUMN IF NOT EXISTS refusal STRING;"]
    assert parameters(client.jobs[7][1])["version"] == ("INT64", 4)
    for _, job_config in client.jobs:
        assert str(job_config.default_dataset) == "my-project.rl_results"


def test_record_is_one_merge_script_with_typed_parameters(
    bigquery_ledger: tuple[RunLedger, FakeClient],
) -> None:
    ledger, client = bigquery_ledger
    client.applied_versions = [1, 2]
    run = RunRecord("dag", "run", "gemma4-26b", "failed", T0, T0, 32, T0, T0)
    ledger.record(
        run, [StepRecord("train", "failed", 2, T0, None)], [MetricRecord("pre", 0, "mean_reward", 0.4)]
    )
    script, job_config = client.jobs[-1]
    assert script.startswith("BEGIN TRANSACTION;\nMERGE runs AS target")
    assert script.count("MERGE ") == 3  # runs, run_steps, run_metrics; no artifacts
    sqlfluff.parse(script, dialect="bigquery")
    values = parameters(job_config)
    assert values["runs_r0_state"] == ("STRING", "failed")
    assert values["runs_r0_chip_hours"] == ("FLOAT64", 0.0)
    assert values["run_steps_r0_try_number"] == ("INT64", 2)
    assert values["run_steps_r0_ended_at"] == ("TIMESTAMP", None)
    assert values["run_metrics_r0_metric_value"] == ("FLOAT64", 0.4)


def test_queries_use_at_parameters(bigquery_ledger: tuple[RunLedger, FakeClient]) -> None:
    ledger, client = bigquery_ledger
    client.applied_versions = [1, 2]
    assert ledger.latest_runs(model="gemma4-26b", limit=5) == []
    sql, job_config = client.jobs[-1]
    assert "WHERE (@any_model = 1 OR r.model = @model) AND (@any_run = 1 OR r.run_id = @run_id)" in " ".join(
        sql.split()
    )
    assert sql.rstrip().endswith("LIMIT @row_limit")
    assert parameters(job_config) == {
        "any_model": ("INT64", 0),
        "model": ("STRING", "gemma4-26b"),
        "any_run": ("INT64", 1),
        "run_id": ("STRING", None),
        "row_limit": ("INT64", 5),
    }
    sqlfluff.parse(sql, dialect="bigquery")
