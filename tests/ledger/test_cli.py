"""``tpu-rl runs``: the table of recent runs."""

from __future__ import annotations

import argparse
import io
from datetime import UTC, datetime, timedelta

import pytest

from airflow_provider_tpu_rl.ledger.billing import BilledSpan
from airflow_provider_tpu_rl.ledger.cli import (
    add_runs_subcommand,
    format_duration,
    format_reward,
    format_runs_table,
    format_tpu_time,
    run_runs_command,
)
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


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tpu-rl")
    add_runs_subcommand(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(list(argv))


def summary(run_id: str, **fields: object) -> RunSummary:
    values: dict[str, object] = {
        "run_id": run_id,
        "dag_id": run_id.split("/")[0],
        "airflow_run_id": run_id.split("/")[1],
        "model": "qwen3-30b-a3b",
        "state": "success",
        "started_at": T0,
        "ended_at": None,
        "duration_seconds": None,
        "chips": None,
        "chip_hours": None,
        "pre_mean_reward": None,
        "post_mean_reward": None,
        "export_uri": None,
    }
    values.update(fields)
    return RunSummary(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0, "0s"), (45.4, "45s"), (750, "12m30s"), (3600, "1h00m"), (3 * 3600 + 65, "3h01m")],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_reward() -> None:
    assert format_reward(0.1234, 0.3399) == "0.12→0.34"
    assert format_reward(None, 0.5) == "-→0.50"
    assert format_reward(0.5, None) == "0.50→-"
    assert format_reward(None, None) == "-"
    # A run that evaluated nothing says so; one that evaluated keeps its dashes.
    assert format_reward(None, None, 0.0) == "- (num_test_batches=0, evaluation off)"
    assert format_reward(None, None, 2.0) == "-"
    assert format_reward(0.1, 0.2, 2.0) == "0.10→0.20"


def test_table_is_aligned_with_dashes_for_unknowns() -> None:
    table = format_runs_table(
        [
            summary(
                "gke/manual__1",
                duration_seconds=7325,
                chip_hours=61.33,
                busy_chip_hours=18.4,
                estimated_cost_usd=165.591,
                resumes=1,
                steps_lost=2,
                seconds_lost=250.4,
                pre_mean_reward=0.12,
                post_mean_reward=0.34,
                export_uri="gs://b/qwen3-30b-a3b/hf-trained/",
                promotion="promoted: no gate (min_reward_gain not set); mean reward 0.12 -> 0.34",
            ),
            summary("vm/scheduled__2", model="llama3.1-8b-Instruct", state="failed"),
        ]
    )
    assert table.splitlines() == [
        "RUN              MODEL                 STATE    DURATION  MEAN REWARD  PROMOTED  BILLED CHIP-H  TRAINED  IDLE  RESUMES                  COST $  EXPORT",
        "gke/manual__1    qwen3-30b-a3b         success     2h02m  0.12→0.34    yes                61.3     18.4   70%  1 (2 steps, 4m10s lost)  165.59  gs://b/qwen3-30b-a3b/hf-trained/",
        "vm/scheduled__2  llama3.1-8b-Instruct  failed          -  -            -                     -        -     -  -                             -  -",
    ]


def test_a_run_that_baked_shows_its_bake_vms_billed_cpu_minutes() -> None:
    table = format_runs_table(
        [
            summary("vm/manual__1", model="llama3.1-8b-Instruct", bake_billed_seconds=450.0),
            summary("gke/manual__2", bake_billed_seconds=None, export_uri="gs://b/x/"),
        ]
    )
    header, baked, gke = table.splitlines()
    assert header.endswith("COST $  BAKE CPU-MIN  EXPORT")
    column = header.index("EXPORT")
    assert baked[:column].rstrip().endswith("-           7.5")  # COST $ unknown, 7.5 billed minutes
    assert gke[:column].rstrip().endswith("-             -")
    assert gke[column:] == "gs://b/x/"
    # no listed run baked: no column
    assert "BAKE" not in format_runs_table([summary("gke/manual__2", bake_billed_seconds=0.0)])


def test_a_row_the_janitor_closed_shows_its_state_and_why() -> None:
    reason = (
        "janitor: deleted VM vm-1 (orphaned: its DAG run vm/manual__1 is running but none of its tasks ...)"
    )
    table = format_runs_table(
        [
            summary("vm/manual__1", state="abandoned", chip_hours=0.5, end_reason=reason),
            summary("gke/manual__2", export_uri="gs://b/x/"),
        ]
    )
    header, closed, recorded = table.splitlines()
    assert header.endswith("EXPORT     REASON")
    assert closed.split()[2] == "abandoned"
    assert closed.endswith(f"-          {reason}")
    assert recorded.endswith("gs://b/x/  -")
    # no listed row was closed by the janitor: no column
    assert "REASON" not in format_runs_table([summary("gke/manual__2")])


def test_runs_command_prints_a_row_the_janitor_closed(
    sqlite_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_uri)
    ledger = RunLedger()
    ledger.record(RunRecord("tpu_rl_gke_pipeline", "crashed", "qwen3-30b-a3b", "running", T0, chips=32))
    reason = "janitor: destroyed cluster c1 (the lease of run tpu_rl_gke_pipeline/crashed expired at ...)"
    ledger.close_run(RunClosing("tpu_rl_gke_pipeline/crashed", "abandoned", T0 + timedelta(hours=2), reason))
    out = io.StringIO()
    assert run_runs_command(parse("runs"), out=out) == 0
    header, row = out.getvalue().splitlines()
    assert row.split()[2:4] == ["abandoned", "2h00m"]
    assert header.rstrip().endswith("REASON")
    assert row.endswith(reason)


def test_a_model_the_gate_held_back_says_not_promoted() -> None:
    line = "not promoted: reward gain +0.01 < min_reward_gain 0.05 (mean reward 0.3 -> 0.31)"
    table = format_runs_table(
        [summary("gke/manual__1", pre_mean_reward=0.3, post_mean_reward=0.31, promotion=line)]
    )
    header, row = table.splitlines()
    column = header.index("PROMOTED")
    assert row[column:].startswith("not promoted")


def test_a_refused_run_says_why_in_place_of_the_dashes() -> None:
    refusal = "refused at validate: cluster_name: GKE cluster name must start with a lowercase letter"
    table = format_runs_table(
        [
            summary("gke/manual__1", duration_seconds=60, chip_hours=1.0, export_uri="gs://b/x/"),
            summary("gke/manual__2", state="failed", refusal=refusal),
        ]
    )
    lines = table.splitlines()
    assert lines[2] == f"gke/manual__2  qwen3-30b-a3b  failed   {refusal}"
    # the other rows keep their own widths: the refusal spans the columns, it does not widen them
    assert lines[0].startswith("RUN            MODEL          STATE    DURATION  MEAN REWARD")


def test_tpu_time_line_says_billed_trained_idle_and_cost() -> None:
    assert format_tpu_time(4.0, 1.0, 10.8) == "billed 4.0 TPU chip-hours, trained 1.0 (idle 75%), est. $10.80"
    assert format_tpu_time(None, None, None) == "billed - TPU chip-hours, trained - (idle -), est. $-"


def test_runs_command_prints_the_ledger(sqlite_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_uri)
    ledger = RunLedger()
    for index, model in enumerate(["qwen3-30b-a3b", "gemma4-26b", "qwen3-30b-a3b"]):
        start = T0 + timedelta(days=index)
        ledger.record(
            RunRecord(
                "tpu_rl_gke_pipeline",
                f"run{index}",
                model,
                "success",
                start,
                start + timedelta(hours=1),
                32,
                start,
                start + timedelta(minutes=30),
                train_started_at=start + timedelta(minutes=10),
                train_ended_at=start + timedelta(minutes=25),
                usd_per_chip_hour=2.7,
                billed_spans=(BilledSpan("tpu-vm", "1", 32, start, start + timedelta(minutes=30)),),
            ),
            [],
            [MetricRecord("pre", 0, "mean_reward", 0.1 * index), MetricRecord("post", 0, "mean_reward", 0.5)],
            [ArtifactRecord("hf_export", f"gs://b/{model}/hf-trained/")],
        )
    out = io.StringIO()
    assert run_runs_command(parse("runs", "--model", "qwen3-30b-a3b", "--limit", "5"), out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("RUN")
    assert [line.split()[0] for line in lines[1:]] == ["tpu_rl_gke_pipeline/run2", "tpu_rl_gke_pipeline/run0"]
    assert "0.20→0.50" in lines[1]
    assert lines[1].split()[6:11] == [
        "16.0",
        "8.0",
        "50%",
        "-",
        "43.20",
    ]  # billed, trained, idle, resumes, cost (after PROMOTED, "-": no gate ran)
    assert "1h00m" in lines[1]
    assert lines[1].rstrip().endswith("gs://b/qwen3-30b-a3b/hf-trained/")

    out = io.StringIO()
    assert run_runs_command(parse("runs", "--limit", "1"), out=out) == 0
    assert len(out.getvalue().splitlines()) == 2


def test_runs_command_on_an_empty_ledger(sqlite_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_uri)
    out = io.StringIO()
    assert run_runs_command(parse("runs", "--model", "gemma4-26b"), out=out) == 0
    assert out.getvalue().startswith("No runs of model gemma4-26b in the ledger (")


def test_runs_command_reports_an_unreadable_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", "mysql://user@localhost/db")
    out, err = io.StringIO(), io.StringIO()
    assert run_runs_command(parse("runs"), out=out, err=err) == 1
    assert "cannot read the run ledger" in err.getvalue()
    assert out.getvalue() == ""


def test_limit_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("runs", "--limit", "0")
    assert "must be >= 1" in capsys.readouterr().err
    args = parse("runs")
    assert (args.model, args.limit, args.conn_id, args.func) == (None, 20, "tpu_rl_ledger", run_runs_command)


def test_failed_lists_the_failed_tasks_of_the_newest_runs(
    sqlite_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_uri)
    ledger = RunLedger()
    for index, model in enumerate(["qwen3-30b-a3b", "gemma4-26b"]):
        start = T0 + timedelta(days=index)
        ledger.record(
            RunRecord(
                "tpu_rl_gke_pipeline", f"run{index}", model, "failed", start, start + timedelta(hours=1)
            ),
            [
                StepRecord("train", "failed", 2, start, start + timedelta(minutes=20), f"rl-{index}"),
                StepRecord("export_to_huggingface", "upstream_failed"),
                StepRecord("deploy_cluster", "success", 1, start, start + timedelta(minutes=10)),
            ],
        )

    out = io.StringIO()
    assert run_runs_command(parse("runs", "--failed"), out=out) == 0
    assert out.getvalue().splitlines() == [
        "RUN                       MODEL          TASK                   STATE            TRY  JOB   ENDED",
        "tpu_rl_gke_pipeline/run1  gemma4-26b     export_to_huggingface  upstream_failed    -  -     -",
        "tpu_rl_gke_pipeline/run1  gemma4-26b     train                  failed             2  rl-1  2026-03-02 08:20:00Z",
        "tpu_rl_gke_pipeline/run0  qwen3-30b-a3b  export_to_huggingface  upstream_failed    -  -     -",
        "tpu_rl_gke_pipeline/run0  qwen3-30b-a3b  train                  failed             2  rl-0  2026-03-01 08:20:00Z",
    ]

    out = io.StringIO()
    assert (
        run_runs_command(parse("runs", "--failed", "--model", "qwen3-30b-a3b", "--limit", "1"), out=out) == 0
    )
    assert [line.split()[:3] for line in out.getvalue().splitlines()[1:]] == [
        ["tpu_rl_gke_pipeline/run0", "qwen3-30b-a3b", "export_to_huggingface"]
    ]


def test_failed_on_a_ledger_without_failures(sqlite_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_uri)
    RunLedger().record(
        RunRecord("tpu_rl_gke_pipeline", "ok", "gemma4-26b", "success", T0, T0),
        [StepRecord("train", "success", 1, T0, T0)],
    )
    out = io.StringIO()
    assert run_runs_command(parse("runs", "--failed", "--model", "gemma4-26b"), out=out) == 0
    assert out.getvalue().startswith("No failed tasks in the runs of model gemma4-26b in the ledger (")


def test_failed_reports_an_unreadable_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", "mysql://user@localhost/db")
    out, err = io.StringIO(), io.StringIO()
    assert run_runs_command(parse("runs", "--failed"), out=out, err=err) == 1
    assert "cannot read the run ledger" in err.getvalue()
    assert out.getvalue() == ""


def test_failed_does_not_go_with_plot(sqlite_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_uri)
    out, err = io.StringIO(), io.StringIO()
    assert run_runs_command(parse("runs", "--failed", "--plot"), out=out, err=err) == 2
    assert "--failed and --plot cannot go together" in err.getvalue()


def test_a_run_whose_capacity_fell_through_adds_the_capacity_column() -> None:
    """The kind that served and how many were refused; the column only when a listed run fell back."""
    from airflow_provider_tpu_rl.ledger.cli import format_runs_table

    plain = summary("d/plain", settings_json='{"capacity": "spot"}')
    assert "CAPACITY" not in format_runs_table([plain])
    fell = summary(
        "d/fell",
        settings_json=(
            '{"capacity": ["reservation", "flex-start", "spot"], "capacity_served": "spot", '
            '"capacity_attempts": [{"capacity": "reservation", "error": "e"}, {"capacity": "flex-start", "error": "e"}]}'
        ),
    )
    header, *rows = format_runs_table([fell, plain]).splitlines()
    assert header.split()[:4] == ["RUN", "MODEL", "STATE", "CAPACITY"]
    assert rows[0].split()[3:6] == ["spot", "(2", "refused)"]
    assert rows[1].split()[3] == "spot"


def test_a_run_on_a_gke_cluster_adds_the_cluster_column() -> None:
    """PROJECT/LOCATION/NAME and where it came from, after STATE; only when a listed run has one."""
    from airflow_provider_tpu_rl.ledger.cli import format_runs_table

    vm = summary("tpu_rl_tpu_vm_pipeline/vm")
    assert "CLUSTER" not in format_runs_table([vm])
    shared = summary("d/shared", gke_cluster="p-1/us-east5/team-gke", gke_cluster_origin="existing")
    made = summary("d/made", gke_cluster="p-1/us-east5/tpu-rl", gke_cluster_origin="created")
    header, *rows = format_runs_table([shared, made, vm]).splitlines()
    assert header.split()[:4] == ["RUN", "MODEL", "STATE", "CLUSTER"]
    assert rows[0].split()[3:5] == ["p-1/us-east5/team-gke", "(existing)"]
    assert rows[1].split()[3:5] == ["p-1/us-east5/tpu-rl", "(created)"]
    assert rows[2].split()[3] == "-"
