"""The runs of the services folder: both trigger forms submitted in Chromium, and what is seen of them.

One set of runs on the folder's one stack (tests/services/conftest.py), asserted on by both of its
modules (the browser's forms and dashboard, the REST API's view of a run under a triggerer restart):

- each pipeline's trigger form (Airflow 3: the DAG page's "Trigger" modal; Airflow 2:
  ``/dags/<dag_id>/trigger``) is submitted without changing a field. The sandbox's ``[tpu_rl]
  default_*`` options prefill the forms, so what a user sees first must validate and run: both
  runs, in flight at once, are followed to their end;
- while they run, each form is submitted again with capacity ``spot``, the reservation cleared and
  an ordered fallback typed into the capacity fallback field, one kind a line (``FALLBACK_LINES``).
  Both are validated into the ordered capacity, then fail in one line: the cluster and the VM they
  name are held by the first runs (a run never touches what another holds). These spot runs are
  what the spot checks and the fallback checks both read: a spot choice with no reservation is the
  fallback's first kind (one run a form, not two that differ only in the fallback field, whose
  empty default every untouched run submits). A third run, triggered through the REST API with the
  form's example project, is refused at ``validate``;
- the untouched GKE run's training is held (the sandbox's hold file) from the end of its conversion
  until the spot runs are turned away; then, once the triggerer has relayed the job's lines up to the
  held checkpoint, the triggerer is restarted (SIGTERM, exit, a new process) and the hold released
  once the new one follows the job, so the rest is printed while the new triggerer follows it
  (nothing is printed while no triggerer runs: no timing decides what the tests see).

With ``TPU_RL_SCREENSHOTS=<folder>`` (``make screenshots``) the browser saves the docs' pictures
there: both forms, the dashboard and a run page.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Locator, Page, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from airflow_provider_tpu_rl.links import DASHBOARD_PREFIX
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, TPU_VM_DAG_ID, GkePipelineSpec, gke_pipeline_from_conf
from airflow_provider_tpu_rl.spec.workloads import DEFAULT_CHECKPOINT_PERIOD
from tests.services.airflow_stack import (
    ADMIN_USER,
    FINISHED_RUN_STATES,
    FLAVOR,
    RunWatch,
    StackError,
    wait_for,
    watch_run,
)

if TYPE_CHECKING:
    from tests.services.conftest import ServicesWorld

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
# Both pipelines, unpaused once parsed (neither has a schedule: only a trigger starts a run).
PIPELINE_DAG_IDS = (GKE_DAG_ID, TPU_VM_DAG_ID)
# Bounds against a hang, each over five times what it takes on a quiet two-core machine.
UI_TIMEOUT_MS = 120_000.0  # a page or a control to appear
SUBMIT_TIMEOUT = 180.0  # the submitted form's run to be listed by the REST API
RUN_TIMEOUT = 1800.0  # each run, up to five at once beside the other leg (one alone: about two minutes)
HOLD_TIMEOUT = 1200.0  # below the simulated job's own limit on a hold (conftest.HOLD_SECONDS)
PIPELINE_KINDS = {GKE_DAG_ID: "gke", TPU_VM_DAG_ID: "tpu_vm"}
# Where each spot run fails, and why: the first runs hold the cluster and the VM of the forms' names.
SPOT_FAILS_AT = {GKE_DAG_ID: "preflight", TPU_VM_DAG_ID: "create_cpu_vm"}
# What the fallback runs type into the capacity fallback field, one kind a line, after capacity spot:
# an order the form must keep (on the TPU VM not the choices' order; on GKE flex-start only last).
FALLBACK_LINES = {GKE_DAG_ID: ["on-demand", "flex-start"], TPU_VM_DAG_ID: ["flex-start", "on-demand"]}
VIEWPORT = {"width": 1440, "height": 900}
FORM_SHOT_HEIGHT = 1700  # the form's open section, down to its capacity and reservation
SCREENSHOTS = os.environ.get("TPU_RL_SCREENSHOTS")  # make screenshots: the docs' pictures go there
_ABSL_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} ")


# ============================================================================ the jobs' logs
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


def trigger_logs_of(world: ServicesWorld, dag_id: str, run_id: str, task_id: str) -> list[Path]:
    """The triggerer's log files of a task instance (``<task log>.trigger.<triggerer id>.log``)."""
    return sorted(world.stack.task_log_dir(dag_id, run_id, task_id).glob("attempt=*.log.trigger.*.log"))


# ================================================================================ the runs
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
    spot: dict[str, FormRun]  # spot, no reservation, an ordered fallback typed in (FALLBACK_LINES)
    refused: FormRun
    running_dashboard: str = ""  # the front page's text while the untouched runs were in flight

    @property
    def fallback(self) -> dict[str, FormRun]:
        """The runs whose form had an ordered capacity fallback typed in: the spot runs."""
        return self.spot

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


def spot_then_fallback(dag_id: str) -> Callable[[Page, Locator], None]:
    """Spot without reservation, then ``FALLBACK_LINES[dag_id]`` typed into the capacity fallback
    field one kind a line (both Airflow lines render it as a textarea)."""

    def change(page: Page, form: Locator) -> None:
        choose_spot_without_reservation(page, form)
        fallback = form.locator("#element_capacity_fallback")
        fallback.fill("\n".join(FALLBACK_LINES[dag_id]))
        fallback.blur()

    return change


def submit_form(
    session: BrowserContext,
    world: ServicesWorld,
    dag_id: str,
    failures: Path,
    change: Callable[[Page, Locator], None] | None = None,
    shot: str | None = None,
) -> str:
    """In a new tab of ``session`` (the logged-in user's browser session, as a person triggers one run
    after another), open the form, apply ``change`` (none: untouched), press "Trigger"; the run id it
    started (the one run of ``dag_id`` that was not there before). The tabs share the session's
    cache, so the UI's scripts are loaded once, not once per form.

    On any failure (no run started: the form's refusal is on the page) the error holds the page's
    text, and a screenshot is kept.
    """
    page = session.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    before = _run_ids(world, dag_id)
    try:
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
        kept = failures / f"{dag_id}-{getattr(change, '__name__', 'untouched')}.png"
        page.screenshot(path=str(kept), full_page=True)
        raise AssertionError(
            f"{error}\nat {page.url} (screenshot {kept}); the page says:\n{page.inner_text('body')[:3000]}"
        ) from None
    finally:
        page.close()
    assert len(started) == 1, started
    return started.pop()


def task_state(watch: RunWatch, task_id: str) -> str | None:
    state = watch.task_instances.get(task_id, {}).get("state")
    return None if state is None else str(state)


def _follow(world: ServicesWorld, watch: RunWatch, until: Callable[[RunWatch], bool]) -> None:
    watch_run(world.stack, world.api, watch.dag_id, watch.run_id, RUN_TIMEOUT, until=until, watch=watch)


def run_forms(world: ServicesWorld, user_page: Page, failures: Path) -> BrowserRuns:
    """The untouched forms, then (while those runs hold their cluster and VM) the spot forms and a
    refused run; the dashboard while they run; every run followed to its end."""
    # The stack is the folder's (tests/services/conftest.py): another module's runs may be listed,
    # but none of them is running, so none holds what this module's runs use.
    for dag_id in PIPELINE_DAG_IDS:
        active = [
            run["dag_run_id"] for run in _runs(world, dag_id) if run["state"] not in FINISHED_RUN_STATES
        ]
        assert active == [], f"{dag_id} has runs in flight before its form was submitted: {active}"
    session = user_page.context  # the logged-in user's: every form is submitted in a tab of it
    untouched_ids = {
        dag_id: submit_form(session, world, dag_id, failures, shot=f"form-{PIPELINE_KINDS[dag_id]}")
        for dag_id in PIPELINE_DAG_IDS
    }
    # The form's example project, through the REST API: refused at validate, in one line.
    refused_id = f"services_refused_{int(time.time())}"
    world.api.trigger(GKE_DAG_ID, refused_id, {"project": "my-tpu-project"})
    watches = {dag_id: RunWatch(dag_id, run_id) for dag_id, run_id in untouched_ids.items()}

    def gke_converted(w: RunWatch) -> bool:
        if w.state in FINISHED_RUN_STATES:
            raise StackError(f"the untouched GKE run ended before its training\n{w.describe()}")
        return task_state(w, "convert_to_maxtext") in {"success", "skipped"}

    def vm_created(w: RunWatch) -> bool:
        if w.state in FINISHED_RUN_STATES:
            raise StackError(f"the untouched TPU VM run ended early\n{w.describe()}")
        return task_state(w, "create_cpu_vm") == "success"

    spot_ids: dict[str, str] = {}
    running_dashboard = ""
    try:
        _follow(world, watches[GKE_DAG_ID], gke_converted)
        # The GKE run's training holds (the hold file) until the spot runs have been turned away:
        # its cluster's lease stays taken whatever the load.
        world.hold_file.write_text("held by tests/services/form_runs.py\n")
        _follow(world, watches[TPU_VM_DAG_ID], vm_created)
        user_page.goto(world.stack.api_url + f"{DASHBOARD_PREFIX}/")
        running_dashboard = user_page.inner_text("body")
        for dag_id in PIPELINE_DAG_IDS:
            spot_ids[dag_id] = submit_form(
                session, world, dag_id, failures, change=spot_then_fallback(dag_id)
            )
        spot_watches = {dag_id: RunWatch(dag_id, run_id) for dag_id, run_id in spot_ids.items()}

        def turned_away(dag_id: str) -> Callable[[RunWatch], bool]:
            task_id = SPOT_FAILS_AT[dag_id]
            return lambda w: w.state in FINISHED_RUN_STATES or task_state(w, task_id) in {"failed", "success"}

        started = time.monotonic()
        for watch in spot_watches.values():
            left = max(5.0, HOLD_TIMEOUT - (time.monotonic() - started))
            watch_run(
                world.stack,
                world.api,
                watch.dag_id,
                watch.run_id,
                left,
                until=turned_away(watch.dag_id),
                watch=watch,
            )
        restart_triggerer_while_held(world, watches[GKE_DAG_ID])
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


def restart_triggerer_while_held(world: ServicesWorld, watch: RunWatch) -> None:
    """Once the triggerer has relayed the held training job's last line (its first checkpoint's
    save: the job holds before committing it), SIGTERM it, start a new one and wait until the new
    one follows the job; the caller releases the hold."""
    conf = dict(world.api.dag_run(watch.dag_id, watch.run_id)["conf"])
    spec = gke_pipeline_from_conf(conf, dag_id=watch.dag_id, run_id=watch.run_id)
    overrides = dict(spec.training.overrides)
    first = min(int(overrides.get("checkpoint_period", DEFAULT_CHECKPOINT_PERIOD)), spec.training.num_batches)
    held = f"Saving checkpoint for step {first} to "

    def held_line_relayed(w: RunWatch) -> bool:
        if w.state in FINISHED_RUN_STATES:
            raise StackError(f"the untouched GKE run ended while its training should hold\n{w.describe()}")
        if task_state(w, "train") != "deferred":
            return False
        printed = [line for line in workload_lines(train_job_log(world, spec)) if held in line]
        relayed = "".join(
            path.read_text(errors="replace") for path in trigger_logs_of(world, w.dag_id, w.run_id, "train")
        )
        return bool(printed) and printed[0] in relayed

    watch_run(
        world.stack, world.api, watch.dag_id, watch.run_id, HOLD_TIMEOUT, until=held_line_relayed, watch=watch
    )
    before = set(trigger_logs_of(world, watch.dag_id, watch.run_id, "train"))
    code, seconds = world.stack.restart_triggerer()
    watch.notes.append(f"the old triggerer exited with {code} {seconds:.1f} s after SIGTERM")
    # The new triggerer has taken the trigger over when it writes its own trigger log file.
    wait_for(
        "the new triggerer to run train's trigger",
        lambda: set(trigger_logs_of(world, watch.dag_id, watch.run_id, "train")) - before,
        HOLD_TIMEOUT,
        on_timeout=world.stack.diagnostics(),
    )


@contextmanager
def chromium() -> Iterator[Browser]:
    """Debian's Chromium, headless, through Playwright (which never downloads a browser here)."""
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} not found: make chromium (apt-get install chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@contextmanager
def logged_in_page(browser: Browser, world: ServicesWorld) -> Iterator[Page]:
    """One logged-in tab (the session's cookie is the UI's own)."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    log_in(page, world)
    # Signed in, the tab waits on a blank page until a test opens one: Airflow 3's home page, where
    # the sign-in lands, asks the API server for its figures again every few seconds while it is open.
    page.wait_for_load_state()
    page.goto("about:blank")
    try:
        yield page
    finally:
        context.close()
