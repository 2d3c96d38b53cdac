"""The run's curves, checked on a pipeline module's successful run: ``record_run`` draws the ledger's
numbers into a PNG in the bucket and links it from the task; ``tpu-rl runs --plot`` draws the trend."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS
from airflow_provider_tpu_rl.ledger.billing import spans_from_json
from airflow_provider_tpu_rl.ledger.hook import RunLedger, sqlite_connection_uri
from airflow_provider_tpu_rl.ledger.plots import figure_png, run_curves, run_curves_figure, run_timeline
from airflow_provider_tpu_rl.ledger.records import RunRecord, as_utc
from airflow_provider_tpu_rl.links import RunDashboardLink
from airflow_provider_tpu_rl.spec import gke_pipeline_from_conf, tpu_vm_pipeline_from_conf
from tests.support.harness import GKE_DAG_ID, DagRunResult, E2EWorld
from tests.support.png import decoded_png


def resolved_values(run: DagRunResult) -> dict[str, Any]:
    """validate's values for the run (the same pure functions the DAG calls)."""
    build = gke_pipeline_from_conf if run.dag_id == GKE_DAG_ID else tpu_vm_pipeline_from_conf
    return build(run.conf, dag_id=run.dag_id, run_id=run.run_id).resolved()


def check_curves_next_to_the_checkpoints(
    world: E2EWorld, run: DagRunResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's PNG is in the bucket, is the drawing of the ledger's numbers, and is linked."""
    assert run.state == "success", run.describe()
    assert run.task_state("record_run") == "success"
    resolved = resolved_values(run)
    folder = resolved["actor_root"].removesuffix("checkpoints/actor/")
    uri = f"{folder}tpu-rl-curves-{resolved['suffix']}.png"
    assert f"run curves: {uri}" in run.output, run.describe()

    bucket, _, name = uri.removeprefix("gs://").partition("/")
    uploaded = world.gcs.download(bucket, name)
    assert decoded_png(uploaded).size == (1000, 800)  # the curves and the timeline of the stages

    # The picture is exactly the drawing of what the ledger holds for this run.
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_connection_uri(world.home / "tpu_rl_ledger.db"))
    metrics = RunLedger().run_metrics(run.ledger_run_id)
    assert {(m.phase, m.name) for m in metrics} >= {("pre", "mean_reward"), ("post", "mean_reward")}
    curves = run_curves(run.ledger_run_id, metrics, final_step=resolved["final_step"])
    ((chips, cluster_started, cluster_ended, train_started, train_ended, billed),) = world.ledger(
        "SELECT chips, cluster_started_at, cluster_ended_at, train_started_at, train_ended_at, billed_spans_json "
        "FROM runs WHERE run_id = ?",
        (run.ledger_run_id,),
    )
    recorded = RunRecord(
        run.dag_id, run.run_id, "m", "success", chips=chips,
        cluster_started_at=as_utc(cluster_started), cluster_ended_at=as_utc(cluster_ended),
        train_started_at=as_utc(train_started), train_ended_at=as_utc(train_ended),
        billed_spans=spans_from_json(json.loads(billed)) if billed else None,
    )  # fmt: skip
    steps = RunLedger().recorded_steps(run.ledger_run_id).values()
    timeline = run_timeline(recorded, steps, ignored=("record_run",))  # the task drawing it
    assert "train" in {task for task, *_ in timeline.stages}
    assert timeline.billed  # the TPU machines' spans, by their clocks
    assert timeline.held is not None
    assert timeline.trained is not None
    assert uploaded == figure_png(run_curves_figure(curves, timeline))

    # The PNG is listed among the run's artifacts, which the dashboard's run page reads.
    ((listed,),) = world.ledger(
        "SELECT uri FROM run_artifacts WHERE run_id = ? AND kind = 'curves'", (run.ledger_run_id,)
    )
    assert listed == uri

    # The task's "Run Curves" link opens the run's page on the dashboard: Airflow 3 stores the
    # formatted URL when the task ends; Airflow 2 stores the format arguments, formatted on display.
    ((value,),) = world.metadata(
        "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = 'record_run' AND key = ?",
        (run.dag_id, run.run_id, RunDashboardLink.key),
    )
    stored = json.loads(value) if isinstance(value, str | bytes) else value
    if not AIRFLOW_V_3_0_PLUS:
        assert stored == {"dag_id": run.dag_id, "run_id": run.run_id}
        stored = RunDashboardLink.format_url(**stored)
    assert stored.endswith(f"/tpu-rl/runs/{run.dag_id}/{quote(run.run_id, safe='')}"), stored


def check_runs_plot_draws_the_trend(world: E2EWorld, run: DagRunResult) -> None:
    """``tpu-rl runs --plot`` over the module's ledger: every rewarded run of the model, one PNG."""
    assert run.state == "success", run.describe()
    model = resolved_values(run)["model"]

    done = world.tpu_rl("runs", "--plot", "--model", model, "--output", "trend.png")

    assert done.returncode == 0, done.stderr
    drawn = re.search(
        rf"Wrote the reward trend of (\d+) run\(s\) \({re.escape(model)}\) to trend.png", done.stdout
    )
    assert drawn is not None, done.stdout
    assert int(drawn.group(1)) >= 1
    decoded_png((Path(world.root) / "trend.png").read_bytes())
