"""Both pipelines' trigger forms and the runs dashboard, in a real browser, on one services stack.

Chromium (Debian's ``/usr/bin/chromium``, driven by Playwright; ``make chromium`` installs it) logs
in to the stack's UI as the admin user, as a person would, and:

- opens each pipeline's trigger form (Airflow 3: the DAG page's "Trigger" modal; Airflow 2:
  ``/dags/<dag_id>/trigger``) and presses "Trigger" without changing a field. The sandbox's
  ``[tpu_rl] default_*`` options (``SANDBOX_FORM_DEFAULTS``) prefill the forms, so what a user sees
  first must validate and run: both runs, in flight at once, are followed to their end;
- while they run, submits each form again with capacity ``spot`` and the reservation cleared (the
  TPU VM form could not: its reservation was a required field). Both are validated, then fail in
  one line: the cluster and the VM they name are held by the first runs (a run never touches what
  another holds). A third run, triggered through the REST API with the form's example project, is
  refused at ``validate``;
- opens the runs dashboard while the first runs are in flight and once every run has ended (a
  refused, two failed, two successful runs) and every run's page, then follows the *Run Curves*
  link from ``record_run`` in Airflow's UI and the run page's link back to the DAG run.

With ``TPU_RL_SCREENSHOTS=<folder>`` (``make screenshots``) the same browser saves the pictures of
the docs there: both forms, the dashboard and a run page.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from playwright.sync_api import Browser, Locator, Page, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from airflow_provider_tpu_rl.dashboard.pages import Airflow3Ui
from airflow_provider_tpu_rl.links import DASHBOARD_PREFIX, run_page_path
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, TPU_VM_DAG_ID
from tests.services.airflow_stack import (
    ADMIN_USER,
    FINISHED_RUN_STATES,
    FLAVOR,
    RunWatch,
    StackError,
    wait_for,
    watch_run,
)
from tests.services.conftest import PIPELINE_DAG_IDS, ServicesWorld
from tpu_rl_sandbox.commands.lifecycle import sandbox_form_defaults

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
RUN_TIMEOUT = 900.0  # each run, up to five at once on two cores beside the other leg (one alone takes about two minutes)
HOLD_TIMEOUT = 420.0  # below the simulated job's own limit on a hold (conftest.HOLD_SECONDS)
PIPELINE_KINDS = {GKE_DAG_ID: "gke", TPU_VM_DAG_ID: "tpu_vm"}
# Where each spot run fails, and why: the first runs hold the cluster and the VM of the forms' names.
SPOT_FAILS_AT = {GKE_DAG_ID: "preflight", TPU_VM_DAG_ID: "create_cpu_vm"}
VIEWPORT = {"width": 1440, "height": 900}
FORM_SHOT_HEIGHT = 1700  # the form's open section, down to its capacity and reservation
SCREENSHOTS = os.environ.get("TPU_RL_SCREENSHOTS")  # make screenshots: the docs' pictures go there


@dataclass(frozen=True)
class FormRun:
    """A run started from a trigger form (or the REST API), and what was seen until it ended."""

    conf: dict[str, Any]
    watch: RunWatch

    @property
    def run_id(self) -> str:
        return self.watch.run_id


@dataclass
class BrowserRuns:
    """Every run of the module and what the browser saw of the dashboard while some still ran."""

    untouched: dict[str, FormRun]
    spot: dict[str, FormRun]
    refused: FormRun
    running_dashboard: str = ""  # the front page's text while the untouched runs were in flight

    def all(self) -> dict[str, FormRun]:
        """Every run by a name: ``untouched-<dag>``, ``spot-<dag>``, ``refused``."""
        runs = {f"untouched-{d}": r for d, r in self.untouched.items()}
        runs.update({f"spot-{d}": r for d, r in self.spot.items()})
        runs["refused"] = self.refused
        return runs


def _runs(world: ServicesWorld, dag_id: str) -> list[dict[str, Any]]:
    return list(world.api.get(f"{FLAVOR.api_prefix}/dags/{dag_id}/dagRuns")["dag_runs"])


def _run_ids(world: ServicesWorld, dag_id: str) -> set[str]:
    return {str(run["dag_run_id"]) for run in _runs(world, dag_id)}


def screenshot(page: Page, name: str, height: int | None = None) -> None:
    """Save the page as ``<name>.png`` in the docs' screenshot folder, when one is asked for;
    ``height``: a taller window for it (a dialog scrolls inside the window, not the page)."""
    if not SCREENSHOTS:
        return
    Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
    if height is not None:
        page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
    page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)
    page.set_viewport_size(VIEWPORT)


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


def choose_spot_without_reservation(page: Page, form: Locator) -> None:
    """Set the form's capacity to spot and clear its reservation, as a user would."""
    if FLAVOR.v3:  # a searchable dropdown (react-select): type the choice, take it with Enter
        choice = form.locator("#element_capacity input:not([type=hidden])")
        choice.click()
        choice.fill("spot")
        page.keyboard.press("Enter")
    else:  # Airflow 2's native <select>
        form.locator("#element_capacity").select_option("spot")
    reservation = form.locator("#element_reservation")
    reservation.fill("")
    reservation.blur()


def submit_form(
    browser: Browser,
    world: ServicesWorld,
    dag_id: str,
    failures: Path,
    change: Callable[[Page, Locator], None] | None = None,
    shot: str | None = None,
) -> str:
    """Log in, open the form, apply ``change`` (none: untouched), press "Trigger"; the run id it
    started (the one run of ``dag_id`` that was not there before).

    On any failure (no run started: the form's refusal is on the page) the error holds the page's
    text, and a screenshot is kept.
    """
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(UI_TIMEOUT_MS)
    before = _run_ids(world, dag_id)
    try:
        log_in(page, world)
        form = open_trigger_form(page, world, dag_id)
        if change is not None:
            change(page, form)
        if shot:
            screenshot(page, shot, height=FORM_SHOT_HEIGHT)
        trigger = form.get_by_role("button", name="Trigger", exact=True)
        trigger.click()
        started = wait_for(
            f"a new run of {dag_id} after its form was submitted",
            lambda: _run_ids(world, dag_id) - before,
            SUBMIT_TIMEOUT,
        )
    except (PlaywrightError, StackError) as error:
        kept = failures / f"{dag_id}-{'changed' if change else 'untouched'}.png"
        page.screenshot(path=str(kept), full_page=True)
        raise AssertionError(
            f"{error}\nat {page.url} (screenshot {kept}); the page says:\n{page.inner_text('body')[:3000]}"
        ) from None
    finally:
        page.close()
    assert len(started) == 1, started
    return started.pop()


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
def user_page(browser: Browser, services: ServicesWorld) -> Iterator[Page]:
    """One logged-in tab for the dashboard checks (the session's cookie is the UI's own)."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    log_in(page, services)
    try:
        yield page
    finally:
        context.close()


def _state(watch: RunWatch, task_id: str) -> str | None:
    state = watch.task_instances.get(task_id, {}).get("state")
    return None if state is None else str(state)


def _follow(world: ServicesWorld, watch: RunWatch, until: Callable[[RunWatch], bool]) -> None:
    watch_run(world.stack, world.api, watch.dag_id, watch.run_id, RUN_TIMEOUT, until=until, watch=watch)


@pytest.fixture(scope="module")
def runs(
    services: ServicesWorld, browser: Browser, user_page: Page, tmp_path_factory: pytest.TempPathFactory
) -> BrowserRuns:
    """The untouched forms, then (while those runs hold their cluster and VM) the spot forms and a
    refused run; the dashboard while they run; every run followed to its end."""
    failures = tmp_path_factory.mktemp("screenshots")
    world = services
    for dag_id in PIPELINE_DAG_IDS:
        assert _runs(world, dag_id) == [], f"{dag_id} has runs before its form was submitted"
    untouched_ids = {
        dag_id: submit_form(browser, world, dag_id, failures, shot=f"form-{PIPELINE_KINDS[dag_id]}")
        for dag_id in PIPELINE_DAG_IDS
    }
    # The form's example project, through the REST API: refused at validate, in one line.
    refused_id = f"services_refused_{int(time.time())}"
    world.api.trigger(GKE_DAG_ID, refused_id, {"project": "my-tpu-project"})
    watches = {dag_id: RunWatch(dag_id, run_id) for dag_id, run_id in untouched_ids.items()}

    def gke_converted(w: RunWatch) -> bool:
        if w.state in FINISHED_RUN_STATES:
            raise StackError(f"the untouched GKE run ended before its training\n{w.describe()}")
        return _state(w, "convert_to_maxtext") in {"success", "skipped"}

    def vm_created(w: RunWatch) -> bool:
        if w.state in FINISHED_RUN_STATES:
            raise StackError(f"the untouched TPU VM run ended early\n{w.describe()}")
        return _state(w, "create_cpu_vm") == "success"

    spot_ids: dict[str, str] = {}
    running_dashboard = ""
    try:
        _follow(world, watches[GKE_DAG_ID], gke_converted)
        # The GKE run's training holds (the hold file) until the spot runs have been turned away:
        # its cluster's lease stays taken whatever the load.
        world.hold_file.write_text("held by test_browser_trigger\n")
        _follow(world, watches[TPU_VM_DAG_ID], vm_created)
        user_page.goto(world.stack.api_url + f"{DASHBOARD_PREFIX}/")
        running_dashboard = user_page.inner_text("body")
        for dag_id in PIPELINE_DAG_IDS:
            spot_ids[dag_id] = submit_form(
                browser, world, dag_id, failures, change=choose_spot_without_reservation
            )
        spot_watches = {dag_id: RunWatch(dag_id, run_id) for dag_id, run_id in spot_ids.items()}

        def turned_away(dag_id: str) -> Callable[[RunWatch], bool]:
            task_id = SPOT_FAILS_AT[dag_id]
            return lambda w: w.state in FINISHED_RUN_STATES or _state(w, task_id) in {"failed", "success"}

        started = time.monotonic()
        for dag_id, watch in spot_watches.items():
            left = max(5.0, HOLD_TIMEOUT - (time.monotonic() - started))
            watch_run(
                world.stack, world.api, dag_id, watch.run_id, left, until=turned_away(dag_id), watch=watch
            )
    finally:
        world.hold_file.unlink(missing_ok=True)
    ended = {}
    for name, (dag_id, run_id) in {
        **{f"u-{d}": (d, r) for d, r in untouched_ids.items()},
        **{f"s-{d}": (d, r) for d, r in spot_ids.items()},
        "refused": (GKE_DAG_ID, refused_id),
    }.items():
        watch = watches.get(dag_id) if name.startswith("u-") else None
        watch = watch_run(world.stack, world.api, dag_id, run_id, RUN_TIMEOUT, watch=watch)
        ended[name] = FormRun(dict(world.api.dag_run(dag_id, run_id)["conf"]), watch)
    return BrowserRuns(
        untouched={d: ended[f"u-{d}"] for d in PIPELINE_DAG_IDS},
        spot={d: ended[f"s-{d}"] for d in PIPELINE_DAG_IDS},
        refused=ended["refused"],
        running_dashboard=running_dashboard,
    )


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
    """Spot chosen and the reservation cleared: the form submits (the TPU VM's could not), validate
    accepts it; the run then stops in one line where another run holds its cluster or VM."""
    spot = runs.spot[dag_id]
    assert spot.conf["capacity"] == "spot", spot.conf
    assert spot.conf.get("reservation") in (None, ""), spot.conf
    assert _state(spot.watch, "validate") == "success", spot.watch.describe()
    task_id = SPOT_FAILS_AT[dag_id]
    assert (spot.watch.state, _state(spot.watch, task_id)) == ("failed", "failed"), spot.watch.describe()
    log = " ".join(str(entry) for entry in services.api.task_log(dag_id, spot.run_id, task_id, 1))
    assert "is in use by run" in log, log[-2000:]  # the first run's: held, so never touched


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
