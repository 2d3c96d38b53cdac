"""The BigQuery ledger's jobs, against a fake BigQuery client (no BigQuery here: SQL and parameters only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlfluff

from airflow_provider_tpu_rl.ledger.billing import BilledSpan, VmSpan
from airflow_provider_tpu_rl.ledger.dialects import Dialect
from airflow_provider_tpu_rl.ledger.hook import RunLedger
from airflow_provider_tpu_rl.ledger.records import (
    ArtifactRecord,
    MetricRecord,
    RunClosing,
    RunRecord,
    RunSummary,
    StepRecord,
)

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
    # (a text the query holds, the rows BigQuery answers it with); any other query answers no row
    answers: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)

    def query(self, sql: str, job_config: Any) -> FakeJob:
        self.jobs.append((sql, job_config))
        if sql.startswith("SELECT version FROM schema_migrations"):
            return FakeJob([FakeRow({"version": version}) for version in self.applied_versions])
        for marker, rows in self.answers:
            if marker in sql:
                return FakeJob([FakeRow(dict(row)) for row in rows])
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
    assert ledger.apply_migrations() == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]  # 7: billed_time, 8: model_promotion
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
    assert sqls[8].splitlines()[1:3] == ["ALTER TABLE runs", "ADD COLUMN IF NOT EXISTS resumes INT64,"]
    assert parameters(client.jobs[9][1])["version"] == ("INT64", 5)
    assert sqls[10].splitlines()[1:] == ["ALTER TABLE runs", "ADD COLUMN IF NOT EXISTS settings_json STRING;"]
    assert parameters(client.jobs[11][1])["version"] == ("INT64", 6)
    assert parameters(client.jobs[13][1])["version"] == ("INT64", 7)  # sqls[12]: 0007_billed_time (issue 46)
    assert sqls[14].splitlines()[1:] == ["ALTER TABLE runs", "ADD COLUMN IF NOT EXISTS promotion STRING;"]
    assert parameters(client.jobs[15][1])["version"] == ("INT64", 8)
    assert "CREATE TABLE IF NOT EXISTS run_vm_spans" in sqls[16]  # 0009_vm_spans: the bake VM's spans
    assert parameters(client.jobs[17][1])["version"] == ("INT64", 9)
    assert sqls[18].splitlines()[1:] == ["ALTER TABLE runs", "ADD COLUMN IF NOT EXISTS end_reason STRING;"]
    assert parameters(client.jobs[19][1])["version"] == ("INT64", 10)
    assert sqls[20].splitlines()[1:] == [
        "ALTER TABLE runs",
        "ADD COLUMN IF NOT EXISTS gke_cluster STRING,",
        "ADD COLUMN IF NOT EXISTS gke_cluster_origin STRING;",
    ]
    assert parameters(client.jobs[21][1])["version"] == ("INT64", 11)
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
    assert values["runs_r0_held_chip_hours"] == ("FLOAT64", 0.0)
    assert values["runs_r0_chip_hours"] == ("FLOAT64", None)  # no machine clocks read: not known
    assert values["run_steps_r0_try_number"] == ("INT64", 2)
    assert values["run_steps_r0_ended_at"] == ("TIMESTAMP", None)
    assert values["run_metrics_r0_metric_value"] == ("FLOAT64", 0.4)


def test_a_bake_vms_span_is_merged_on_its_vm_and_start(
    bigquery_ledger: tuple[RunLedger, FakeClient],
) -> None:
    ledger, client = bigquery_ledger
    client.applied_versions = list(range(1, 10))
    bake = VmSpan("bake", "tpu-rl-bake-0301", "us-east5-b", "n2-standard-8", T0, T0 + timedelta(seconds=20))
    ledger.record(RunRecord("dag", "run", "m", "success", T0, T0, vm_spans=(bake,)))
    script, job_config = client.jobs[-1]
    assert "MERGE run_vm_spans AS target" in script
    assert "target.vm_name = source.vm_name AND target.started_at = source.started_at" in script
    sqlfluff.parse(script, dialect="bigquery")
    values = parameters(job_config)
    assert values["run_vm_spans_r0_started_at"] == ("TIMESTAMP", T0)
    assert values["run_vm_spans_r0_billed_seconds"] == ("FLOAT64", 60.0)
    assert values["run_vm_spans_r0_machine_type"] == ("STRING", "n2-standard-8")


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


# The dashboard's two reads of one run (``RunLedger.run_summary``, ``RunLedger.run_artifacts``).
SUMMARY_ROW: dict[str, Any] = {
    "run_id": "tpu_rl_gke_pipeline/manual__a",
    "dag_id": "tpu_rl_gke_pipeline",
    "airflow_run_id": "manual__a",
    "model": "qwen3-30b-a3b",
    "state": "success",
    "started_at": T0,  # BigQuery's TIMESTAMP: an aware datetime
    "ended_at": datetime(2026, 3, 1, 9, 15, tzinfo=UTC),
    "duration_seconds": 4500.0,
    "chips": 32,
    "chip_hours": 40.0,
    "busy_chip_hours": 30.0,
    "estimated_cost_usd": 108.0,
    "refusal": None,
    "pre_mean_reward": 0.0884,
    "post_mean_reward": 0.245,
    "num_test_batches": 2.0,
    "export_uri": "gs://bkt/qwen3-30b-a3b/hf-trained/rl/",
}


def test_run_summary_is_the_latest_runs_query_for_one_run_id_with_at_parameters(
    bigquery_ledger: tuple[RunLedger, FakeClient],
) -> None:
    ledger, client = bigquery_ledger
    client.applied_versions = [1, 2, 3, 4]
    client.answers = [("FROM runs AS r", [SUMMARY_ROW])]

    summary = ledger.run_summary("tpu_rl_gke_pipeline/manual__a")

    assert summary == RunSummary(**SUMMARY_ROW)
    assert summary.idle_share == 0.25
    sql, job_config = client.jobs[-1]
    assert "AND (@any_run = 1 OR r.run_id = @run_id)" in " ".join(sql.split())
    assert ":run_id" not in sql
    assert sql.rstrip().endswith("LIMIT @row_limit")
    assert parameters(job_config) == {
        "any_model": ("INT64", 1),
        "model": ("STRING", None),
        "any_run": ("INT64", 0),
        "run_id": ("STRING", "tpu_rl_gke_pipeline/manual__a"),
        "row_limit": ("INT64", 1),
    }
    assert str(job_config.default_dataset) == "my-project.rl_results"
    sqlfluff.parse(sql, dialect="bigquery")
    client.answers = []
    assert ledger.run_summary("tpu_rl_gke_pipeline/never") is None


def test_run_artifacts_reads_one_runs_artifacts_with_an_at_parameter(
    bigquery_ledger: tuple[RunLedger, FakeClient],
) -> None:
    ledger, client = bigquery_ledger
    client.applied_versions = [1, 2, 3, 4]
    client.answers = [
        (
            "FROM run_artifacts",
            [
                {
                    "kind": "actor_checkpoint",
                    "uri": "gs://bkt/qwen3-30b-a3b/trained/rl/checkpoints/actor/",
                    "step": 50,
                },
                {
                    "kind": "curves",
                    "uri": "gs://bkt/qwen3-30b-a3b/trained/rl/tpu-rl-curves-ab.png",
                    "step": None,
                },
            ],
        )
    ]

    artifacts = ledger.run_artifacts("tpu_rl_gke_pipeline/manual__a")

    assert artifacts == [
        ArtifactRecord("actor_checkpoint", "gs://bkt/qwen3-30b-a3b/trained/rl/checkpoints/actor/", 50),
        ArtifactRecord("curves", "gs://bkt/qwen3-30b-a3b/trained/rl/tpu-rl-curves-ab.png", None),
    ]
    sql, job_config = client.jobs[-1]
    assert sql == "SELECT kind, uri, step FROM run_artifacts WHERE run_id = @run_id ORDER BY kind, uri"
    assert parameters(job_config) == {"run_id": ("STRING", "tpu_rl_gke_pipeline/manual__a")}
    assert str(job_config.default_dataset) == "my-project.rl_results"
    sqlfluff.parse(sql, dialect="bigquery")


def test_closing_a_running_row_is_a_guarded_update_with_typed_parameters_only(
    bigquery_ledger: tuple[RunLedger, FakeClient],
) -> None:
    """Only known values are set (a NULL parameter would be a STRING to BigQuery), and only on a row
    that still says running; a row already closed is never read as running, so nothing is written."""
    ledger, client = bigquery_ledger
    client.applied_versions = list(range(1, 11))
    client.answers = [("AND state = 'running'", [{"started_at": T0, "usd_per_chip_hour": None}])]
    end = T0 + timedelta(hours=1)
    span = BilledSpan("vm", "1", 8, T0, end, "janitor")

    assert ledger.close_run(RunClosing("dag/run", "abandoned", end, "janitor: lease expired", (span,), 2.5))

    select, update = client.jobs[-2][0], client.jobs[-1][0]
    assert select.startswith("SELECT started_at, usd_per_chip_hour FROM runs")
    assert update.startswith("UPDATE runs SET state = @state, ended_at = @ended_at, end_reason = @end_reason")
    assert update.endswith("WHERE run_id = @run_id AND state = 'running'")
    sqlfluff.parse(update, dialect="bigquery")
    values = parameters(client.jobs[-1][1])
    assert values["state"] == ("STRING", "abandoned")
    assert values["billed_chip_seconds"] == ("FLOAT64", 8 * 3600.0)
    assert values["estimated_cost_usd"] == ("FLOAT64", 8 * 2.5)
    assert values["duration_seconds"] == ("FLOAT64", 3600.0)
    assert all(value is not None for _, value in values.values())

    client.answers = []  # closed meanwhile: the read finds no running row
    jobs = len(client.jobs)
    assert ledger.close_run(RunClosing("dag/run", "failed", end, "janitor: x")) is False
    assert not [sql for sql, _ in client.jobs[jobs:] if sql.startswith("UPDATE")]
