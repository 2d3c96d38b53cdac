"""Both pipelines' trigger forms, submitted untouched in a real browser, run to success.

Chromium (Debian's ``/usr/bin/chromium``, driven by Playwright; ``make chromium`` installs it)
logs in to the services stack's UI as the admin user, opens each pipeline's trigger form (Airflow
3: the DAG page's "Trigger" modal; Airflow 2: ``/dags/<dag_id>/trigger``) and presses its
"Trigger" button without changing a field. The sandbox's ``[tpu_rl] default_*`` options
(``SANDBOX_FORM_DEFAULTS``) prefill the forms, so what a user sees first must validate and run:
both runs, in flight at once, are then followed through the REST API until they end.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from airflow_provider_tpu_rl.spec import GKE_DAG_ID, TPU_VM_DAG_ID
from tests.services.airflow_stack import ADMIN_USER, FLAVOR, RunWatch, StackError, wait_for, watch_run
from tests.services.conftest import PIPELINE_DAG_IDS, ServicesWorld
from tpu_rl_sandbox.control import sandbox_form_defaults

pytestmark = [pytest.mark.services, pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
# As root Chromium needs --no-sandbox; the machine has no internet, so nothing may call home.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
UI_TIMEOUT_MS = 60_000.0  # a page or a control to appear (two busy cores)
SUBMIT_TIMEOUT = 30.0  # the submitted form's run to be listed by the REST API
RUN_TIMEOUT = 420.0  # each run, both at once on two cores (one alone takes about two minutes)
PIPELINE_KINDS = {GKE_DAG_ID: "gke", TPU_VM_DAG_ID: "tpu_vm"}


@dataclass(frozen=True)
class FormRun:
    """A run started by an untouched trigger form, and what was seen until it ended."""

    conf: dict[str, Any]
    watch: RunWatch


def _runs(world: ServicesWorld, dag_id: str) -> list[dict[str, Any]]:
    return list(world.api.get(f"{FLAVOR.api_prefix}/dags/{dag_id}/dagRuns")["dag_runs"])


def log_in(page: Page, world: ServicesWorld) -> None:
    """Sign in on the UI's login page as the admin user, as a person would."""
    page.goto(world.stack.api_url + FLAVOR.ui_login_path)
    page.get_by_label("Username").fill(ADMIN_USER)
    page.get_by_label("Password").fill(world.stack.admin_password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: FLAVOR.ui_login_path not in url)


def open_trigger_form(page: Page, world: ServicesWorld, dag_id: str) -> Locator:
    """Open ``dag_id``'s trigger form; the part of the page that holds it and its submit button."""
    if FLAVOR.v3:  # the DAG page's "Trigger" button (labelled "Trigger Dag") opens it in a modal dialog
        page.goto(f"{world.stack.api_url}/dags/{dag_id}")
        page.get_by_role("button", name="Trigger Dag", exact=True).click()
        return page.get_by_role("dialog")
    page.goto(f"{world.stack.api_url}/dags/{dag_id}/trigger")
    return page.locator("#trigger_form")


def submit_untouched_form(browser: Browser, world: ServicesWorld, dag_id: str, screenshots: Path) -> str:
    """Log in, open the form, press "Trigger" without changing a field; the run id it started.

    On any failure (no run started: the form's refusal is on the page) the error holds the page's
    text, and a screenshot is kept.
    """
    page = browser.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    try:
        log_in(page, world)
        form = open_trigger_form(page, world, dag_id)
        form.get_by_role("button", name="Trigger", exact=True).click()
        runs = wait_for(
            f"a run of {dag_id} after its form was submitted", lambda: _runs(world, dag_id), SUBMIT_TIMEOUT
        )
    except (PlaywrightError, StackError) as error:
        shot = screenshots / f"{dag_id}.png"
        page.screenshot(path=str(shot), full_page=True)
        raise AssertionError(
            f"{error}\nat {page.url} (screenshot {shot}); the page says:\n{page.inner_text('body')[:3000]}"
        ) from None
    finally:
        page.close()
    assert len(runs) == 1, runs
    return str(runs[0]["dag_run_id"])


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless, through Playwright (which never downloads a browser here)."""
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} not found: make chromium (apt-get install chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def form_runs(
    services: ServicesWorld, browser: Browser, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, FormRun]:
    """Both forms submitted untouched (both runs in flight at once), then each run followed to its end."""
    screenshots = tmp_path_factory.mktemp("screenshots")
    for dag_id in PIPELINE_DAG_IDS:
        assert _runs(services, dag_id) == [], f"{dag_id} has runs before its form was submitted"
    run_ids = {
        dag_id: submit_untouched_form(browser, services, dag_id, screenshots) for dag_id in PIPELINE_DAG_IDS
    }
    runs = {}
    for dag_id, run_id in run_ids.items():
        watch = watch_run(services.stack, services.api, dag_id, run_id, RUN_TIMEOUT)
        runs[dag_id] = FormRun(dict(services.api.dag_run(dag_id, run_id)["conf"]), watch)
    return runs


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_the_untouched_form_submitted_the_sandbox_defaults(
    form_runs: dict[str, FormRun], dag_id: str
) -> None:
    """The run's conf holds the values the sandbox's ``[tpu_rl]`` options prefilled."""
    prefilled = sandbox_form_defaults(PIPELINE_KINDS[dag_id])
    assert prefilled
    conf = form_runs[dag_id].conf
    assert {key: conf.get(key) for key in prefilled} == prefilled, conf


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_the_untouched_form_runs_to_success(form_runs: dict[str, FormRun], dag_id: str) -> None:
    watch = form_runs[dag_id].watch
    assert watch.state == "success", watch.describe()
    failed = {
        task_id: ti.get("state")
        for task_id, ti in watch.task_instances.items()
        if task_id != "watcher" and ti.get("state") != "success"
    }
    assert failed == {}, watch.describe()
