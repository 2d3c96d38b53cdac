"""Both pipelines' trigger forms and the runs dashboard, in a real browser, on the folder's stack.

Chromium (Debian's ``/usr/bin/chromium``, driven by Playwright; ``make chromium`` installs it) logs
in to the stack's UI as the admin user, as a person would; the runs it starts from the forms (both
untouched, both with spot, no reservation and an ordered fallback, and a refused one) are the folder's
(tests/services/form_runs.py). This module checks what the forms submitted, how each run ended,
the runs dashboard while they ran and after, every run's page, and the links between the
dashboard and Airflow's UI.
"""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest
from playwright.sync_api import Page

from airflow_provider_tpu_rl.dashboard.pages import Airflow3Ui
from airflow_provider_tpu_rl.links import DASHBOARD_PREFIX, run_page_path
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, TPU_VM_DAG_ID
from tests.services.airflow_stack import FLAVOR
from tests.services.conftest import ServicesWorld
from tests.services.form_runs import (
    FALLBACK_LINES,
    PIPELINE_DAG_IDS,
    PIPELINE_KINDS,
    SPOT_FAILS_AT,
    UI_TIMEOUT_MS,
    BrowserRuns,
    screenshot,
    task_state,
)
from tpu_rl_sandbox.commands.lifecycle import sandbox_form_defaults

pytestmark = [pytest.mark.services, pytest.mark.browser]


# ================================================================================ the forms
@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_the_untouched_form_submitted_the_sandbox_defaults(runs: BrowserRuns, dag_id: str) -> None:
    """The run's conf holds the values the sandbox's ``[tpu_rl]`` options prefilled."""
    prefilled = sandbox_form_defaults(PIPELINE_KINDS[dag_id])
    assert prefilled
    conf = runs.untouched[dag_id].conf
    assert {key: conf.get(key) for key in prefilled} == prefilled, conf
    # a reservation for this Airflow is what its runs consume; without one, on-demand
    assert conf["capacity"] == ("reservation" if prefilled.get("reservation") else "on-demand"), conf


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_the_untouched_form_runs_to_success(runs: BrowserRuns, dag_id: str) -> None:
    watch = runs.untouched[dag_id].watch
    assert watch.state == "success", watch.describe()
    failed = {
        task_id: ti.get("state")
        for task_id, ti in watch.task_instances.items()
        if task_id != "watcher"
        and ti.get("state") != "success"
        # a model asset task of a preset the run did not train skips (no event)
        and not (task_id.startswith("publish_") and ti.get("state") == "skipped")
    }
    assert failed == {}, watch.describe()


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_spot_with_no_reservation_triggers_from_the_form(
    services: ServicesWorld, runs: BrowserRuns, dag_id: str
) -> None:
    """Spot chosen and the reservation cleared (then a fallback typed in: the run is the fallback
    check's too): the form submits (the TPU VM's could not), validate accepts it; the run then
    stops in one line where another run holds its cluster or VM."""
    spot = runs.spot[dag_id]
    assert spot.conf["capacity"] == "spot", spot.conf
    assert spot.conf.get("reservation") in (None, ""), spot.conf
    assert task_state(spot.watch, "validate") == "success", spot.watch.describe()
    task_id = SPOT_FAILS_AT[dag_id]
    assert (spot.watch.state, task_state(spot.watch, task_id)) == ("failed", "failed"), spot.watch.describe()
    log = " ".join(str(entry) for entry in services.api.task_log(dag_id, spot.run_id, task_id, 1))
    assert "is in use by run" in log, log[-2000:]  # the first run's: held, so never touched


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_an_ordered_capacity_fallback_triggers_from_the_form(
    services: ServicesWorld, runs: BrowserRuns, dag_id: str
) -> None:
    """Spot chosen, then kinds typed into the capacity fallback field one a line: the run's conf
    holds them in their order and validate's resolved capacity is capacity then the fallback (what
    the create tasks take); the run is then turned away where the spot run is."""
    run = runs.fallback[dag_id]
    assert run.conf["capacity"] == "spot", run.conf
    assert run.conf["capacity_fallback"] == FALLBACK_LINES[dag_id], run.conf
    assert task_state(run.watch, "validate") == "success", run.watch.describe()
    resolved = services.api.xcom_value(dag_id, run.run_id, "validate")
    assert resolved["capacity"] == ["spot", *FALLBACK_LINES[dag_id]], resolved
    task_id = SPOT_FAILS_AT[dag_id]
    assert (run.watch.state, task_state(run.watch, task_id)) == ("failed", "failed"), run.watch.describe()
    log = " ".join(str(entry) for entry in services.api.task_log(dag_id, run.run_id, task_id, 1))
    assert "is in use by run" in log, log[-2000:]


# ============================================================================= the dashboard
def _dashboard_rows(page: Page) -> dict[str, dict[str, str]]:
    """The front page's runs table: run id -> {column heading: cell text}."""
    headings = [text.strip() for text in page.locator("table.runs thead th").all_inner_texts()]
    rows = {}
    for row in page.locator("table.runs tbody tr").all():
        cells = [text.strip() for text in row.locator("td").all_inner_texts()]
        rows[cells[0]] = dict(zip(headings, cells, strict=False))
    return rows


def test_the_dashboard_listed_the_runs_while_they_ran(runs: BrowserRuns) -> None:
    text = runs.running_dashboard
    assert "Internal Server Error" not in text
    for dag_id, run in runs.untouched.items():
        line = next((line for line in text.splitlines() if f"{dag_id}/{run.run_id}" in line), "")
        assert "running" in line, text[:3000]
        assert "so far" in line, text[:3000]


def test_the_dashboard_shows_every_run_in_its_state(
    services: ServicesWorld, runs: BrowserRuns, user_page: Page
) -> None:
    """A refused run (the form's example project) once made this page a bare 500."""
    response = user_page.goto(services.stack.api_url + f"{DASHBOARD_PREFIX}/")
    assert response is not None
    assert response.status == 200
    screenshot(user_page, "dashboard")
    rows = _dashboard_rows(user_page)
    states = {name: rows[f"{run.watch.dag_id}/{run.run_id}"]["State"] for name, run in runs.all().items()}
    assert states == {
        f"untouched-{GKE_DAG_ID}": "success",
        f"untouched-{TPU_VM_DAG_ID}": "success",
        f"spot-{GKE_DAG_ID}": "failed",
        f"spot-{TPU_VM_DAG_ID}": "failed",
        "refused": "failed",
    }, rows
    refused = rows[f"{GKE_DAG_ID}/{runs.refused.run_id}"]
    assert "refused at validate: project" in " ".join(refused.values()), refused
    success = rows[f"{GKE_DAG_ID}/{runs.untouched[GKE_DAG_ID].run_id}"]
    assert re.fullmatch(r"\d\d:\d\d:\d\d", success["Duration (hh:mm:ss)"]), success
    assert "→" in success["Mean reward (before → after)"], success


@pytest.mark.parametrize("name", ["untouched-gke", "untouched-vm", "spot-gke", "spot-vm", "refused"])
def test_every_runs_page_renders(
    services: ServicesWorld, runs: BrowserRuns, user_page: Page, name: str
) -> None:
    kind = {"gke": GKE_DAG_ID, "vm": TPU_VM_DAG_ID}
    group, _, which = name.partition("-")
    run = runs.refused if name == "refused" else getattr(runs, group)[kind[which]]
    response = user_page.goto(services.stack.api_url + run_page_path(run.watch.dag_id, run.run_id))
    assert response is not None, name
    assert response.status == 200, name
    assert user_page.locator("h1").inner_text() == f"{run.watch.dag_id}/{run.run_id}"
    assert user_page.get_by_role("link", name="DAG run in Airflow").count() == 1
    if name == "untouched-gke":
        assert user_page.locator("img[alt='run curves']").evaluate("img => img.naturalWidth") > 0
        screenshot(user_page, "run-page")
    if name.startswith("spot"):
        settings = user_page.locator("table.facts").nth(1).inner_text()
        assert "TPU capacity\tspot" in settings, settings


def test_run_curves_and_back_to_the_dag_run(
    services: ServicesWorld, runs: BrowserRuns, user_page: Page
) -> None:
    """From record_run's *Run Curves* link in Airflow's UI to the run's page, and from there back to
    the DAG run in Airflow, as Airflow's own links go (Airflow 3: the same tab for its own origin;
    Airflow 2: a new tab for an absolute URL); then the browser's Back returns to the run page."""
    run = runs.untouched[GKE_DAG_ID]
    base = services.stack.api_url
    page = user_page
    if FLAVOR.v3:
        page.goto(f"{base}/dags/{GKE_DAG_ID}/runs/{run.run_id}/tasks/record_run/details")
        page.get_by_role("link", name="Run Curves").click()
    else:
        selected = urlencode({"dag_run_id": run.run_id, "task_id": "record_run"})
        page.goto(f"{base}/dags/{GKE_DAG_ID}/grid?{selected}")
        with page.context.expect_page() as opened:
            page.get_by_role("link", name="Run Curves").click()
        page = opened.value
        page.set_default_timeout(UI_TIMEOUT_MS)
    run_page = base + run_page_path(GKE_DAG_ID, run.run_id)
    page.wait_for_url(run_page)
    assert page.locator("h1").inner_text() == f"{GKE_DAG_ID}/{run.run_id}"

    page.get_by_role("link", name="DAG run in Airflow").click()
    if FLAVOR.v3:
        page.wait_for_url(Airflow3Ui(base).dag_run(GKE_DAG_ID, run.run_id))
    else:
        page.wait_for_url(re.compile(rf"/dags/{GKE_DAG_ID}/grid\?dag_run_id="))
    page.get_by_text(run.run_id).first.wait_for()  # Airflow's page of that run
    page.go_back()
    page.wait_for_url(run_page)
    if page is not user_page:
        page.close()


@pytest.mark.skipif(not FLAVOR.v3, reason="Airflow 3 shows the dashboard in a frame of its UI")
def test_inside_airflows_frame_a_link_back_opens_airflow_in_the_whole_tab(
    services: ServicesWorld, runs: BrowserRuns, user_page: Page
) -> None:
    """The dashboard in Airflow 3's navigation is a sandboxed frame: a link back to Airflow must not
    open Airflow inside it (nor be blocked), it replaces the page around it."""
    run = runs.untouched[TPU_VM_DAG_ID]
    base = services.stack.api_url
    user_page.goto(f"{base}/plugin/tpu-rl-runs")
    frame = user_page.frame_locator("iframe[title='TPU RL runs']")
    frame.get_by_role("link", name=f"{TPU_VM_DAG_ID}/{run.run_id}").click()
    frame.get_by_role("link", name="DAG run in Airflow").click()
    user_page.wait_for_url(Airflow3Ui(base).dag_run(TPU_VM_DAG_ID, run.run_id))
    assert user_page.locator("iframe[title='TPU RL runs']").count() == 0
