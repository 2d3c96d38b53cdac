"""``tpu_rl_gke_pipeline`` under real Airflow services: a run under a triggerer restart, through the REST API.

The API server (Airflow 3's api-server, Airflow 2's webserver), scheduler, dag-processor and
triggerer run as processes (LocalExecutor, PostgreSQL metadata database) against the sandbox. The
run is the folder's untouched GKE run (tests/services/form_runs.py: its form submitted in
Chromium, which posts it to the REST API as a user's browser does); its triggerer is restarted
(SIGTERM, exit, a new process) while ``train`` is deferred and its job is held at its first
checkpoint. Everything is read back from the outside: the REST API (run and task states, tries,
the task log), the sandbox's job logs (what the simulated MaxText printed) and the run ledger's
PostgreSQL database. The same run shows the plain path: every task succeeds in one try, ``train``
waits in the triggerer, the rewards reach the ledger.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest

from airflow_provider_tpu_rl.ledger.cli import format_reward
from airflow_provider_tpu_rl.links import DASHBOARD_PREFIX, run_page_path
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, GkePipelineSpec, gke_pipeline_from_conf
from tests.services.airflow_stack import FINISHED_RUN_STATES as FINISHED
from tests.services.airflow_stack import FLAVOR, HTTP_TIMEOUT, RunWatch, wait_for, watch_run
from tests.services.conftest import ServicesWorld
from tests.services.form_runs import RUN_TIMEOUT, BrowserRuns, train_job_log, workload_lines
from tests.support.dags import CONSUMER_DAG_ID
from tests.support.harness import printed_rewards
from tests.support.png import decoded_png

pytestmark = pytest.mark.services


@dataclass
class ServicesRun:
    """The folder's untouched GKE run, and what was seen while it ran."""

    conf: dict[str, Any]
    watch: RunWatch
    train_log: list[dict[str, Any]]
    job_log: str

    @property
    def run_id(self) -> str:
        return self.watch.run_id

    @property
    def spec(self) -> GkePipelineSpec:
        return gke_pipeline_from_conf(self.conf, dag_id=GKE_DAG_ID, run_id=self.run_id)

    @property
    def ledger_run_id(self) -> str:
        return f"{GKE_DAG_ID}/{self.run_id}"

    def describe(self) -> str:
        return self.watch.describe()


def log_events(entries: list[dict[str, Any]]) -> list[str]:
    return [str(entry.get("event", "")) for entry in entries]


@pytest.fixture(scope="module")
def restarted_run(services: ServicesWorld, runs: BrowserRuns) -> ServicesRun:
    """The untouched GKE run (restarted triggerer), with train's log of every try (REST) and the
    training job's log (sandbox)."""
    world = services
    run = runs.untouched[GKE_DAG_ID]
    watch = run.watch
    # Every try's log: a spurious retry must not hide what the first try relayed. (Airflow's
    # retry race can leave a try without a history row; its log is then a 404, kept as an entry.)
    current = int(watch.task_instances.get("train", {}).get("try_number") or 1)
    listed = {int(t["try_number"]) for t in world.api.tries(GKE_DAG_ID, watch.run_id, "train")}
    train_log: list[dict[str, Any]] = []
    for try_number in sorted(listed | set(range(1, current + 1))):
        train_log += world.api.task_log(GKE_DAG_ID, watch.run_id, "train", try_number)
    spec = gke_pipeline_from_conf(run.conf, dag_id=GKE_DAG_ID, run_id=watch.run_id)
    return ServicesRun(run.conf, watch, train_log, train_job_log(world, spec))


# =================================================================================== tests
def test_run_triggered_through_the_rest_api_succeeds(restarted_run: ServicesRun) -> None:
    assert restarted_run.watch.state == "success", restarted_run.describe()
    failed = {
        task_id: ti.get("state")
        for task_id, ti in restarted_run.watch.task_instances.items()
        if task_id != "watcher"
        and ti.get("state") != "success"
        # a model asset task of a preset the run did not train skips (no event)
        and not (task_id.startswith("publish_") and ti.get("state") == "skipped")
    }
    assert failed == {}, restarted_run.describe()


def test_the_promoted_models_event_runs_the_downstream_example_dag(
    services: ServicesWorld, restarted_run: ServicesRun
) -> None:
    """The real scheduler turns the model asset's event into a run of the example DAG, which checks
    the export and its card."""
    assert restarted_run.watch.task_instances["publish_qwen3-30b-a3b"]["state"] == "success"
    kind = "asset_triggered" if FLAVOR.v3 else "dataset_triggered"

    def triggered() -> list[dict[str, Any]]:
        body = services.api.get(f"{FLAVOR.api_prefix}/dags/{CONSUMER_DAG_ID}/dagRuns", limit=20)
        return [run for run in body["dag_runs"] if run["run_type"] == kind]

    wait_for("the example DAG's asset-triggered run", triggered, RUN_TIMEOUT, interval=1.0)
    run_id = triggered()[0]["dag_run_id"]
    watch = watch_run(services.stack, services.api, CONSUMER_DAG_ID, run_id, RUN_TIMEOUT)
    assert watch.state == "success", watch.describe()


def test_train_waited_in_the_triggerer(restarted_run: ServicesRun) -> None:
    """REST showed ``train`` deferred, and its log (REST) has a triggerer section with the job's lines."""
    assert "deferred" in restarted_run.watch.seen_states.get("train", []), restarted_run.describe()
    events = log_events(restarted_run.train_log)
    # The API server lists the files it read: a triggerer's is `<task log>.trigger.<triggerer id>.log`.
    assert any(".log.trigger." in event for event in events), events[:20]
    printed = workload_lines(restarted_run.job_log)
    assert printed, restarted_run.job_log[-2000:]
    relayed = [line for line in printed if any(line in event for event in events)]
    assert relayed, f"none of the {len(printed)} lines the job printed is in train's log: {events[-20:]}"


def test_no_task_has_a_second_try(services: ServicesWorld, restarted_run: ServicesRun) -> None:
    tries = {
        task_id: int(ti.get("try_number") or 0) for task_id, ti in restarted_run.watch.task_instances.items()
    }
    assert {task_id: n for task_id, n in tries.items() if n > 1} == {}, restarted_run.describe()
    history = services.api.tries(GKE_DAG_ID, restarted_run.run_id, "train")
    assert [t["try_number"] for t in history] == [1], history


def test_ledger_holds_the_pre_and_post_reward(services: ServicesWorld, restarted_run: ServicesRun) -> None:
    printed = printed_rewards(restarted_run.job_log)
    assert set(printed) == {"pre", "post"}, restarted_run.job_log[-2000:]
    with psycopg.connect(services.stack.ledger_dsn, connect_timeout=int(HTTP_TIMEOUT)) as connection:
        rows = connection.execute(
            "SELECT phase, metric_value FROM run_metrics WHERE run_id = %s AND metric_name = 'mean_reward' "
            "AND phase IN ('pre', 'post')",
            (restarted_run.ledger_run_id,),
        ).fetchall()
        everything = connection.execute(
            "SELECT run_id, phase, metric_name, metric_value FROM run_metrics ORDER BY run_id"
        ).fetchall()
    assert dict(rows) == pytest.approx(printed, abs=1e-9), (
        f"ledger rows: {everything}\n{restarted_run.describe()}"
    )


def test_triggerer_restart_loses_and_repeats_no_log_line(
    services: ServicesWorld, restarted_run: ServicesRun
) -> None:
    """Every line the training pod printed is in train's log (REST) exactly once, although two
    triggerers followed it (the first one's SIGTERM mid-training)."""
    assert any("the old triggerer exited" in note for note in restarted_run.watch.notes), (
        restarted_run.describe()
    )
    expected = workload_lines(restarted_run.job_log)
    assert any("Pre RL Training" in line for line in expected), restarted_run.job_log[-2000:]
    assert any("Post RL Training" in line for line in expected), restarted_run.job_log[-2000:]
    events = log_events(restarted_run.train_log)
    counts = {line: sum(line in event for event in events) for line in expected}
    lost = [line for line, count in counts.items() if count == 0]
    repeated = {line: count for line, count in counts.items() if count > 1}
    # A line lost from the task log may be in a triggerer's own log (one that had dropped the
    # trigger's log file before writing it: JobSetTrigger's LOG_SETTLE_SECONDS).
    own_logs = "".join(
        path.read_text(errors="replace") for path in services.stack.log_dir.glob("triggerer-*.log")
    )
    in_own_logs = sum(line in own_logs for line in lost)
    assert (lost, repeated) == ([], {}), (
        f"{len(lost)} of {len(expected)} lines lost ({in_own_logs} of them in a triggerer's own log), "
        f"{len(repeated)} repeated\n{restarted_run.describe()}"
    )
    assert Counter(expected).most_common(1)[0][1] == 1  # the expected lines are distinct


# ========================================================================== the runs dashboard
def test_the_runs_dashboard_shows_the_finished_run_to_a_logged_in_user(
    services: ServicesWorld, restarted_run: ServicesRun
) -> None:
    """The provider's plugin on the real API server (Airflow 2: webserver): the runs table lists the
    run with its rewards before→after, the run's page shows its curves (a PNG read from GCS), and
    the record_run task's "Run Curves" link opens that page."""
    assert restarted_run.watch.state in FINISHED, restarted_run.describe()
    with psycopg.connect(services.stack.ledger_dsn, connect_timeout=int(HTTP_TIMEOUT)) as connection:
        rewards = dict(
            connection.execute(
                "SELECT phase, metric_value FROM run_metrics WHERE run_id = %s "
                "AND metric_name = 'mean_reward' AND phase IN ('pre', 'post')",
                (restarted_run.ledger_run_id,),
            ).fetchall()
        )
        curves = connection.execute(
            "SELECT uri FROM run_artifacts WHERE run_id = %s AND kind = 'curves'",
            (restarted_run.ledger_run_id,),
        ).fetchall()
    assert set(rewards) == {"pre", "post"}, rewards
    assert len(curves) == 1, curves  # the PNG is listed among the run's artifacts
    before_after = format_reward(rewards["pre"], rewards["post"])
    run_path = run_page_path(GKE_DAG_ID, restarted_run.run_id)
    links = services.api.task_links(GKE_DAG_ID, restarted_run.run_id, "record_run")
    links = links.get("extra_links", links)  # Airflow 3 wraps them; Airflow 2 does not
    assert links["Run Curves"] == services.stack.api_url + run_path, links

    with services.api.ui_client() as client:
        index = client.get(f"{DASHBOARD_PREFIX}/")
        assert index.status_code == 200, index.text[:2000]
        row = re.search(rf"<tr>.*?{re.escape(restarted_run.ledger_run_id)}.*?</tr>", index.text)
        assert row is not None, index.text[:3000]
        assert html.escape(before_after) in row.group(0), row.group(0)

        page = client.get(links["Run Curves"])
        assert page.status_code == 200, page.text[:2000]
        assert html.escape(before_after) in page.text
        image = re.search(r"<img src='([^']+)' alt='run curves'>", page.text)
        assert image is not None, page.text[:3000]
        png = client.get(html.unescape(image.group(1)))
        assert png.status_code == 200, png.text[:2000]
        assert png.headers["content-type"] == "image/png"
        assert decoded_png(png.content).size == (1000, 800)

        trend = client.get(f"{DASHBOARD_PREFIX}/trend.png")
        assert trend.status_code == 200, trend.text[:2000]
        assert decoded_png(trend.content).size == (1000, 450)

    # Anonymous: refused (Airflow 3: 401; Airflow 2: sent to the login page, whose link names the
    # page asked for), nothing of the run shown.
    curves_path = f"{DASHBOARD_PREFIX}/curves/{GKE_DAG_ID}/{restarted_run.run_id}"
    with httpx.Client(base_url=services.stack.api_url, timeout=HTTP_TIMEOUT) as anonymous:
        for path in (f"{DASHBOARD_PREFIX}/", run_path, curves_path, f"{DASHBOARD_PREFIX}/trend.png"):
            response = anonymous.get(path)
            if FLAVOR.v3:
                assert response.status_code == 401, (path, response.status_code, response.text[:500])
            else:
                assert response.status_code == 302, (path, response.status_code, response.text[:500])
                assert "/login/" in response.headers["location"], response.headers
            assert html.escape(before_after) not in response.text
            assert response.headers.get("content-type") != "image/png"
