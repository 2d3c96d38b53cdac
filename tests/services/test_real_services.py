"""``tpu_rl_gke_pipeline`` under real Airflow services, triggered through the REST API.

The API server (Airflow 3's api-server, Airflow 2's webserver), scheduler, dag-processor and
triggerer run as processes (LocalExecutor, PostgreSQL metadata database) against the sandbox;
runs are triggered with ``POST /api/v2/dags/{dag_id}/dagRuns`` (Airflow 2: ``/api/v1``) as a user
would, and everything is read back from the outside:
the REST API (run and task states, tries, the task log), the sandbox's job logs (what the
simulated MaxText printed) and the run ledger's PostgreSQL database.

One run (a module fixture): its triggerer is restarted (SIGTERM, exit, a new process) while
``train`` is deferred and its job is held mid-training. The same run shows the plain path: every
task succeeds in one try, ``train`` waits in the triggerer, the rewards reach the ledger.
"""

from __future__ import annotations

import html
import re
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from airflow_provider_tpu_rl.ledger.cli import format_reward
from airflow_provider_tpu_rl.links import DASHBOARD_PREFIX, run_page_path
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, GkePipelineSpec, gke_pipeline_from_conf
from tests.services.airflow_stack import FINISHED_RUN_STATES as FINISHED
from tests.services.airflow_stack import FLAVOR, RunWatch, StackError, wait_for, watch_run
from tests.services.conftest import ServicesWorld
from tests.support.dags import CONSUMER_DAG_ID
from tests.support.harness import printed_rewards
from tests.support.png import decoded_png

pytestmark = pytest.mark.services

RUN_TIMEOUT = 900.0  # one run beside the other leg's services on two cores (alone: about two minutes)
HOLD_TIMEOUT = 420.0  # below the simulated job's own limit on a hold (conftest.HOLD_SECONDS)
PROJECT = "tpu-rl-services"
BUCKET = "tpu-rl-services-gke"
# 4 steps, an evaluation every 2 (so "Intermediate Eval" lines print) and a checkpoint every 2:
# the restart scenario holds the job at step 2's checkpoint, mid-training.
TRAIN_OVERRIDES = {"num_test_batches": 2, "eval_interval": 2, "checkpoint_period": 2}
NUM_BATCHES = 4
_ABSL_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} ")


@dataclass
class ServicesRun:
    """One DAG run triggered through the REST API, and what was seen while it ran."""

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


def run_conf(name: str) -> dict[str, Any]:
    return {
        "project": PROJECT,
        "cluster_name": f"svc-{name}",
        "bucket": BUCKET,
        "run_name": f"rl-svc-{name}",
        "num_batches": NUM_BATCHES,
        "train_overrides": TRAIN_OVERRIDES,
    }


def train_job_log(world: ServicesWorld, spec: GkePipelineSpec) -> str:
    """What the simulated training pod printed: the sandbox's attempt log of this run's train job.

    The training job's log is the one that saves checkpoints under this run's actor folder (the
    export job's log names that folder too, but only to load from it).
    """
    saves = re.compile(
        rf"Saving checkpoint for step \d+ to {re.escape(spec.training.actor_checkpoint_root)}\d"
    )
    texts = [text for text in _job_logs(world) if saves.search(text)]
    return "".join(texts)


def _job_logs(world: ServicesWorld) -> list[str]:
    return [
        path.read_text(errors="replace") for path in sorted(world.layout.jobs_dir.glob("*/attempt-*.log"))
    ]


def workload_lines(job_log: str) -> list[str]:
    """The MaxText lines of a job log (absl-formatted; each holds a microsecond time stamp)."""
    return [line for line in job_log.splitlines() if _ABSL_LINE.match(line)]


def log_events(entries: list[dict[str, Any]]) -> list[str]:
    return [str(entry.get("event", "")) for entry in entries]


def trigger_logs_of(world: ServicesWorld, run_id: str, task_id: str) -> list[Path]:
    """The triggerer's log files of a task instance (``<task log>.trigger.<triggerer id>.log``)."""
    logs = world.stack.home / "logs"
    return sorted(
        logs.glob(f"dag_id={GKE_DAG_ID}/run_id={run_id}/task_id={task_id}/attempt=*.log.trigger.*.log")
    )


def trigger(world: ServicesWorld, name: str) -> tuple[dict[str, Any], str]:
    conf = run_conf(name)
    run_id = f"services_{name}_{uuid.uuid4().hex[:8]}"
    world.api.trigger(GKE_DAG_ID, run_id, conf)
    return conf, run_id


def finish(world: ServicesWorld, conf: dict[str, Any], watch: RunWatch) -> ServicesRun:
    """Wait for the run's end, then read train's log of every try (REST) and the training job's log (sandbox)."""
    watch = watch_run(world.stack, world.api, GKE_DAG_ID, watch.run_id, RUN_TIMEOUT, watch=watch)
    # Every try's log: a spurious retry must not hide what the first try relayed. (Airflow's
    # retry race can leave a try without a history row; its log is then a 404, kept as an entry.)
    current = int(watch.task_instances.get("train", {}).get("try_number") or 1)
    listed = {int(t["try_number"]) for t in world.api.tries(GKE_DAG_ID, watch.run_id, "train")}
    train_log: list[dict[str, Any]] = []
    for try_number in sorted(listed | set(range(1, current + 1))):
        train_log += world.api.task_log(GKE_DAG_ID, watch.run_id, "train", try_number)
    spec = gke_pipeline_from_conf(conf, dag_id=GKE_DAG_ID, run_id=watch.run_id)
    return ServicesRun(conf, watch, train_log, train_job_log(world, spec))


# ==================================================================================== runs
def _converted(watch: RunWatch) -> bool:
    """Conversion is over (so a hold file created now holds only the training job)."""
    if watch.state in FINISHED:
        raise StackError(f"run ended before train started\n{watch.describe()}")
    return watch.task_instances.get("convert_to_maxtext", {}).get("state") in {"success", "skipped"}


def _train_state(watch: RunWatch) -> str | None:
    state = watch.task_instances.get("train", {}).get("state")
    return None if state is None else str(state)


@pytest.fixture(scope="module")
def restarted_run(services: ServicesWorld) -> ServicesRun:
    """The triggerer is restarted while ``train`` is deferred and its job holds at step 2.

    The hold file (``TPU_RL_SANDBOX_HOLD_FILE``) is created once conversion is over, so only the
    training job holds; it holds before committing step 2's checkpoint, after printing the pre
    reward, steps 1-2 and the first evaluation. Once the old triggerer has relayed step 2, it is
    stopped and a new one started; the hold is released once the new one runs the trigger, so
    the rest is printed while the new triggerer follows the job (nothing is printed while no
    triggerer runs: no timing decides what the test sees).
    """
    world = services
    conf, run_id = trigger(world, "restart")
    watch = RunWatch(GKE_DAG_ID, run_id)
    spec = gke_pipeline_from_conf(conf, dag_id=GKE_DAG_ID, run_id=run_id)

    def step_two_relayed(w: RunWatch) -> bool:
        if w.state in FINISHED:
            raise StackError(f"run ended while the job should hold\n{w.describe()}")
        if _train_state(w) != "deferred":
            return False
        printed = [line for line in workload_lines(train_job_log(world, spec)) if "Train step 2 " in line]
        relayed = "".join(
            path.read_text(errors="replace") for path in trigger_logs_of(world, run_id, "train")
        )
        return bool(printed) and printed[0] in relayed

    try:
        watch_run(world.stack, world.api, GKE_DAG_ID, run_id, RUN_TIMEOUT, until=_converted, watch=watch)
        world.hold_file.write_text("held by test_real_services\n")
        watch_run(
            world.stack, world.api, GKE_DAG_ID, run_id, HOLD_TIMEOUT, until=step_two_relayed, watch=watch
        )
        before = set(trigger_logs_of(world, run_id, "train"))
        code, seconds = world.stack.restart_triggerer()
        watch.notes.append(f"the old triggerer exited with {code} {seconds:.1f} s after SIGTERM")
        # The new triggerer has taken the trigger over when it writes its own trigger log file.
        wait_for(
            "the new triggerer to run train's trigger",
            lambda: set(trigger_logs_of(world, run_id, "train")) - before,
            HOLD_TIMEOUT,
            on_timeout=world.stack.diagnostics(),
        )
    finally:
        world.hold_file.unlink(missing_ok=True)
    return finish(world, conf, watch)


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
    with psycopg.connect(services.stack.ledger_dsn, connect_timeout=30) as connection:
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


def test_triggerer_restart_loses_and_repeats_no_log_line(restarted_run: ServicesRun) -> None:
    """Every line the training pod printed is in train's log (REST) exactly once."""
    expected = workload_lines(restarted_run.job_log)
    assert any("Pre RL Training" in line for line in expected), restarted_run.job_log[-2000:]
    assert any("Post RL Training" in line for line in expected), restarted_run.job_log[-2000:]
    events = log_events(restarted_run.train_log)
    counts = {line: sum(line in event for event in events) for line in expected}
    lost = [line for line, count in counts.items() if count == 0]
    repeated = {line: count for line, count in counts.items() if count > 1}
    assert (lost, repeated) == ([], {}), (
        f"{len(lost)} of {len(expected)} lines lost, {len(repeated)} repeated\n{restarted_run.describe()}"
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
    with psycopg.connect(services.stack.ledger_dsn, connect_timeout=30) as connection:
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
    with httpx.Client(base_url=services.stack.api_url, timeout=30) as anonymous:
        for path in (f"{DASHBOARD_PREFIX}/", run_path, curves_path, f"{DASHBOARD_PREFIX}/trend.png"):
            response = anonymous.get(path)
            if FLAVOR.v3:
                assert response.status_code == 401, (path, response.status_code, response.text[:500])
            else:
                assert response.status_code == 302, (path, response.status_code, response.text[:500])
                assert "/login/" in response.headers["location"], response.headers
            assert html.escape(before_after) not in response.text
            assert response.headers.get("content-type") != "image/png"
