"""The dashboard's HTML pages, from the ledger's rows (no Airflow import; every value escaped).

Every row the ledger can hold renders: a run refused at ``validate`` (its reason spans the columns
it has no value for), a failed one, one still running (listed from its ``validate`` on), one with
no metrics or no picture. Numbers read as Airflow's own pages show them: durations as
``HH:MM:SS``, times as ``YYYY-MM-DD HH:MM:SS`` (UTC here), right-aligned, each column headed in
words with its unit and a tooltip. The run page links back to Airflow (the DAG run, its grid, each
task's log) by the URLs of the Airflow line that serves it (:class:`AirflowUi`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from typing import Any, Protocol
from urllib.parse import quote, urlencode

from airflow_provider_tpu_rl.ledger.cli import (
    UNKNOWN,
    format_cost,
    format_promoted,
    format_resumes,
    format_reward,
)
from airflow_provider_tpu_rl.ledger.records import ArtifactRecord, RunSummary, StepRecord, capacity_text

TITLE = "TPU RL runs"
# Airflow 3's look (Chakra UI's system font stack and its gray and state colours), kept plain.
_STYLE = """
:root { color-scheme: light; }
body { font-family: Inter, -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, Helvetica, Arial,
  sans-serif; margin: 1rem 1.5rem; color: #1a202c; font-size: 14px; }
h1 { font-size: 1.4rem; margin: 0.4rem 0 0.8rem; } h2 { font-size: 1.1rem; margin: 1.4rem 0 0.5rem; }
nav.crumbs { font-size: 0.85rem; color: #4a5568; margin-bottom: 0.4rem; }
nav.crumbs a, nav.back a { margin-right: 0.2rem; }
nav.back { margin: 0.3rem 0 0.8rem; display: flex; gap: 0.5rem; flex-wrap: wrap; }
nav.back a { border: 1px solid #cbd5e0; border-radius: 6px; padding: 0.2rem 0.6rem; text-decoration: none;
  color: #2b6cb0; background: #f7fafc; }
a { color: #2b6cb0; }
table { border-collapse: collapse; font-size: 0.88rem; }
th, td { border-bottom: 1px solid #e2e8f0; padding: 0.35rem 0.6rem; text-align: left; vertical-align: top; }
thead th { background: #f7fafc; font-weight: 600; white-space: nowrap; cursor: help; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.word { white-space: nowrap; }
td.refusal { color: #9b2c2c; }
table.facts th { font-weight: 600; width: 14rem; }
.state { font-weight: 600; }
.state-success { color: #2f855a; } .state-failed { color: #c53030; } .state-running { color: #00a3c4; }
.state-upstream_failed { color: #dd6b20; } .state-skipped { color: #d53f8c; }
.state-abandoned { color: #718096; }
.end-reason { font-weight: 400; font-size: 0.8rem; color: #4a5568; max-width: 24rem; }
.note { color: #4a5568; }
img { max-width: 100%; border: 1px solid #edf2f7; }
"""
# Inside Airflow 3's frame (the dashboard in its navigation is an iframe sandboxed without
# allow-top-navigation) a link to an Airflow page would open Airflow inside the frame: it is
# followed from the page around the frame instead, which replaces the whole tab as Airflow's own
# links do. Outside a frame (the *Run Curves* link opens the page in Airflow's tab) it is a plain link.
# The listener is the document's, set in the head: a link is followed so from the moment it shows,
# not only once the parser has reached the end of the body.
_SCRIPT = """
document.addEventListener("click", function (event) {
  var link = event.target.closest ? event.target.closest("a[data-airflow]") : null;
  if (!link || window.top === window.self) { return; }
  try {
    var page = window.top.document, anchor = page.createElement("a");
    anchor.href = link.href;
    page.body.appendChild(anchor);
    anchor.click();
    anchor.remove();
    event.preventDefault();
  } catch (error) { /* a frame of another origin: the link opens in the frame */ }
});
"""


def _path(value: str) -> str:
    return quote(value, safe="")


def run_href(root: str, dag_id: str, run_id: str) -> str:
    """The run's page under the dashboard's root path."""
    return f"{root}/runs/{_path(dag_id)}/{_path(run_id)}"


def curves_href(root: str, dag_id: str, run_id: str) -> str:
    """The run's curves PNG under the dashboard's root path."""
    return f"{root}/curves/{_path(dag_id)}/{_path(run_id)}"


class AirflowUi(Protocol):
    """The URLs of the Airflow UI that serves the dashboard: each line has its own."""

    def dag_run(self, dag_id: str, run_id: str) -> str: ...

    def grid(self, dag_id: str) -> str: ...

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int | None) -> str: ...


@dataclass(frozen=True)
class Airflow3Ui:
    """Airflow 3's UI routes (airflow-core ``ui/src/router.tsx``): the run's page (its grid and
    graph beside it), the DAG's page (the grid of its runs) and a task instance's page, whose
    first tab is its log (``?try_number=``)."""

    root: str = ""

    def dag_run(self, dag_id: str, run_id: str) -> str:
        return f"{self.root}/dags/{_path(dag_id)}/runs/{_path(run_id)}"

    def grid(self, dag_id: str) -> str:
        return f"{self.root}/dags/{_path(dag_id)}"

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int | None) -> str:
        page = f"{self.dag_run(dag_id, run_id)}/tasks/{_path(task_id)}"
        return page if try_number is None else f"{page}?{urlencode({'try_number': try_number})}"


@dataclass(frozen=True)
class Airflow2Ui:
    """Airflow 2's grid view (``/dags/<dag_id>/grid``) with its query parameters: ``dag_run_id``
    selects the run, ``task_id`` the task and ``tab=logs`` its log (``www/static/js/dag/``)."""

    root: str = ""

    def dag_run(self, dag_id: str, run_id: str) -> str:
        return f"{self.grid(dag_id)}?{urlencode({'dag_run_id': run_id})}"

    def grid(self, dag_id: str) -> str:
        return f"{self.root}/dags/{_path(dag_id)}/grid"

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int | None) -> str:
        query = {"dag_run_id": run_id, "task_id": task_id, "tab": "logs"}
        return f"{self.grid(dag_id)}?{urlencode(query)}"


# ------------------------------------------------------------------------------------ values
def format_clock(seconds: float | None) -> str:
    """A duration as Airflow shows one: ``00:01:27``, ``1d02:03:04``; ``-`` when unknown."""
    if seconds is None:
        return UNKNOWN
    total = max(0, round(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}d{clock}" if days else clock


def format_time(value: datetime | None) -> str:
    """``2026-01-01 12:00:00`` in UTC; ``-`` when unknown."""
    return UNKNOWN if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def format_chip_hours(value: float | None) -> str:
    """Chip-hours with three significant digits (``0.0980``, ``4.31``, ``123``), so that a small
    run's billed and trained hours explain its idle share; ``-`` when unknown."""
    if value is None:
        return UNKNOWN
    if value == 0:
        return "0"
    digits = max(0, 2 - int(f"{abs(value):e}".split("e")[1]))
    return f"{value:,.{digits}f}"


def format_idle(run: RunSummary) -> str:
    """The idle share as a whole percentage (``52%``); ``-`` when unknown. Beside the billed and
    trained chip-hours at three digits (0.204, 0.0980) it reads right; its tooltip does the sum."""
    share = run.idle_share
    return UNKNOWN if share is None else f"{share * 100:.0f}%"


def idle_inputs(run: RunSummary) -> str:
    """How the idle share is computed, in the run's own numbers."""
    if run.idle_share is None:
        return "unknown: the billed or the trained chip-hours are not known"
    trained, billed = format_chip_hours(run.busy_chip_hours), format_chip_hours(run.chip_hours)
    return f"1 - {trained} trained / {billed} billed chip-hours = {run.idle_share * 100:.0f}% idle"


def cost_basis(run: RunSummary) -> str:
    """``4.31 chip-h x $2.70 per chip-hour``: what the estimate multiplies."""
    if run.usd_per_chip_hour is None:
        return "no price was recorded with this run"
    return (
        f"{format_chip_hours(run.chip_hours)} billed chip-hours x ${run.usd_per_chip_hour:,.2f} per "
        "chip-hour ([tpu_rl] usd_per_chip_hour when it ran): an estimate, not your bill"
    )


def _duration_seconds(run: RunSummary, now: datetime) -> tuple[float | None, bool]:
    """The run's duration, and whether it is still counting (a running run: since its start)."""
    if run.state == "running" and run.started_at is not None:
        return (now - run.started_at).total_seconds(), True
    return run.duration_seconds, False


# ----------------------------------------------------------------------------------- columns
@dataclass(frozen=True)
class Column:
    """One column of the runs table: its heading (words and unit), its tooltip, its cell."""

    heading: str
    tooltip: str
    cell: Callable[[RunSummary, datetime], str]
    numeric: bool = False
    cell_tooltip: Callable[[RunSummary], str] | None = None
    nowrap: bool = False  # one word or one time: never broken over lines


def _duration_cell(run: RunSummary, now: datetime) -> str:
    seconds, counting = _duration_seconds(run, now)
    return f"{format_clock(seconds)} so far" if counting else format_clock(seconds)


BILLED_TOOLTIP = (
    "Chips x hours the TPU machines ran, by their own clocks: each from its start to its stop or "
    "delete, at least a minute each (waiting for capacity, provisioning and shutting down bill nothing)"
)
HELD_TOOLTIP = (
    "Chips x hours from the start of the task creating the TPU capacity to the end of the one deleting it"
)
TRAINED_TOOLTIP = "Chips x hours the training job ran, never more than billed"
COLUMNS: tuple[Column, ...] = (
    Column("Run", "The DAG and its run id; opens the run's page", lambda r, _: r.run_id),
    Column("Model", "The MaxText model preset", lambda r, _: r.model or UNKNOWN, nowrap=True),
    Column(
        "State",
        "success, failed, or running (listed from its validate on); abandoned: the janitor ended the "
        "resources of a run nobody finished. A row the janitor closed says why beneath",
        lambda r, _: r.state,
        cell_tooltip=lambda r: r.end_reason or "",
    ),
    Column(
        "Started (UTC)",
        "When the DAG run started, in UTC",
        lambda r, _: format_time(r.started_at),
        nowrap=True,
    ),
    Column(
        "Duration (hh:mm:ss)",
        "From the DAG run's start to its end, as Airflow shows it; a running run's so far",
        _duration_cell,
        numeric=True,
    ),
    Column(
        "Mean reward (before → after)",
        "Mean reward on the test prompts before and after training; why it is missing when it is",
        lambda r, _: format_reward(r.pre_mean_reward, r.post_mean_reward, r.num_test_batches),
        numeric=True,
    ),
    Column(
        "TPU billed (chip-hours)", BILLED_TOOLTIP, lambda r, _: format_chip_hours(r.chip_hours), numeric=True
    ),
    Column(
        "TPU trained (chip-hours)",
        TRAINED_TOOLTIP,
        lambda r, _: format_chip_hours(r.busy_chip_hours),
        numeric=True,
    ),
    Column(
        "TPU idle (% of billed chip-hours)",
        "1 - trained / billed: the share of the billed TPU time that did not train",
        lambda r, _: format_idle(r),
        numeric=True,
        cell_tooltip=idle_inputs,
    ),
    Column(
        "Training resumes",
        "How many times training resumed after an earlier attempt, and the steps and time that lost",
        lambda r, _: format_resumes(r.resumes, r.steps_lost, r.seconds_lost),
        numeric=True,
    ),
    Column(
        "Est. cost (USD)",
        "Billed chip-hours x the price per chip-hour the run was recorded with ([tpu_rl] "
        "usd_per_chip_hour, default the v6e on-demand list price): an estimate, not your bill",
        lambda r, _: format_cost(r.estimated_cost_usd),
        numeric=True,
        cell_tooltip=cost_basis,
    ),
    Column(
        "Hugging Face export",
        "Where the trained model was exported",
        lambda r, _: r.export_uri or UNKNOWN,
    ),
    Column(
        "Promoted",
        "The promotion gate: yes (the model asset's event was emitted), not promoted (its reward "
        "gain was below min_reward_gain: no event), - (the gate never ran)",
        lambda r, _: format_promoted(r.promoted),
        cell_tooltip=lambda r: r.promotion or "",
    ),
)
# A refused run has values up to here; its reason spans the other columns.
_REFUSED_FROM = 4


def _th(column: Column) -> str:
    css = " class='num'" if column.numeric else ""
    return f"<th{css} title='{escape(column.tooltip)}'>{escape(column.heading)}</th>"


def _td(column: Column, run: RunSummary, now: datetime, root: str) -> str:
    value = column.cell(run, now)
    title = column.cell_tooltip(run) if column.cell_tooltip else ""
    attributes = f" title='{escape(title)}'" if title else ""
    if column.heading == "Run":
        href = run_href(root, run.dag_id, run.airflow_run_id)
        return f"<td><a href='{escape(href)}'>{escape(value)}</a></td>"
    if column.heading == "State":
        reason = f"<div class='end-reason'>{escape(run.end_reason)}</div>" if run.end_reason else ""
        return f"<td class='state state-{escape(value)}'{attributes}>{escape(value)}{reason}</td>"
    css = " class='num'" if column.numeric else " class='word'" if column.nowrap else ""
    return f"<td{css}{attributes}>{escape(value)}</td>"


def _runs_table(root: str, runs: Sequence[RunSummary], now: datetime) -> str:
    head = "".join(_th(column) for column in COLUMNS)
    lines = []
    for run in runs:
        if run.refusal:
            cells = [_td(column, run, now, root) for column in COLUMNS[:_REFUSED_FROM]]
            span = len(COLUMNS) - _REFUSED_FROM
            cells.append(f"<td class='refusal' colspan='{span}'>{escape(run.refusal)}</td>")
        else:
            cells = [_td(column, run, now, root) for column in COLUMNS]
        lines.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f"<table class='runs'>\n<thead><tr>{head}</tr></thead>\n<tbody>\n"
        + "\n".join(lines)
        + "\n</tbody></table>"
    )


def _document(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{_STYLE}</style><script>{_SCRIPT}</script></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )


def _airflow_link(href: str, text: str, title: str = "") -> str:
    """A link to a page of Airflow itself (``data-airflow``: followed in the whole tab)."""
    hint = f" title='{escape(title)}'" if title else ""
    return f"<a data-airflow href='{escape(href)}'{hint}>{escape(text)}</a>"


def runs_page(root: str, runs: Sequence[RunSummary], now: datetime | None = None) -> str:
    """The dashboard's front page: the reward trend across runs and the table of the newest runs."""
    now = now or datetime.now(UTC)
    if runs:
        table = _runs_table(root, runs, now)
        trend = (
            "<h2>Mean reward across runs</h2>\n<p class='note'>Before (hollow) and after (filled) "
            "training, at each run's start; one colour per model.</p>\n"
            f"<img src='{escape(root)}/trend.png' alt='reward trend'>"
        )
    else:
        table, trend = "<p>The run ledger holds no run of a DAG you can read.</p>", ""
    body = f"<h1>{TITLE}</h1>\n{trend}\n<h2>Newest runs</h2>\n{table}"
    return _document(TITLE, body)


# ------------------------------------------------------------------------------- the run page
def _facts(rows: Sequence[tuple[str, str, str]]) -> str:
    """A two-column table of (name, value, tooltip) rows; the values are escaped here."""
    lines = []
    for name, value, tooltip in rows:
        title = f" title='{escape(tooltip)}'" if tooltip else ""
        lines.append(f"<tr><th>{escape(name)}</th><td{title}>{escape(value)}</td></tr>")
    return "<table class='facts'>" + "".join(lines) + "</table>"


def _summary(run: RunSummary, now: datetime) -> str:
    seconds, counting = _duration_seconds(run, now)
    rows = [
        ("State", run.state, ""),
        *(
            [("Why it ended", run.end_reason, "Closed by the janitor: its run never recorded its end")]
            if run.end_reason
            else []
        ),
        ("Started (UTC)", format_time(run.started_at), ""),
        ("Ended (UTC)", format_time(run.ended_at) if run.state != "running" else UNKNOWN, ""),
        ("Duration (hh:mm:ss)", format_clock(seconds) + (" so far" if counting else ""), ""),
        *([("GKE cluster", run.cluster_text, CLUSTER_TOOLTIP)] if run.cluster_text else []),
    ]
    if run.refusal:
        return _facts([*rows, ("Refused", run.refusal, "")])
    return _facts(
        [
            *rows,
            (
                "Mean reward (before → after)",
                format_reward(run.pre_mean_reward, run.post_mean_reward, run.num_test_batches),
                run.no_reward_reason or "",
            ),
            ("TPU chips", UNKNOWN if run.chips is None else str(run.chips), ""),
            ("TPU billed (chip-hours)", format_chip_hours(run.chip_hours), BILLED_TOOLTIP),
            ("TPU trained (chip-hours)", format_chip_hours(run.busy_chip_hours), TRAINED_TOOLTIP),
            ("TPU capacity held (chip-hours)", format_chip_hours(run.held_chip_hours), HELD_TOOLTIP),
            ("TPU idle", idle_inputs(run), ""),
            ("Training resumes", format_resumes(run.resumes, run.steps_lost, run.seconds_lost), ""),
            ("Est. cost (USD)", format_cost(run.estimated_cost_usd), cost_basis(run)),
            ("Hugging Face export", run.export_uri or UNKNOWN, ""),
            ("Promotion", run.promotion or UNKNOWN, "The promotion gate's decision (min_reward_gain)"),
        ]
    )


CLUSTER_TOOLTIP = (
    "PROJECT/LOCATION/NAME and where the cluster came from: created (deployed by this run), kept (an "
    "earlier run's, handed over with keep_cluster) or existing (cluster_mode existing: the run added "
    "only its own node pools). The run is billed its own TPU pool's nodes; a kept or existing "
    "cluster's control plane and system pool are not charged to it"
)
CAPACITY_TOOLTIP = (
    "The capacity kind that served the TPUs; an ordered capacity tries its kinds in turn and names "
    "the ones refused before it (stockout, quota, a full reservation)"
)
SETTING_NAMES: tuple[tuple[str, str], ...] = (
    ("model", "Model"),
    ("capacity", "TPU capacity"),
    ("reservation", "Reservation"),
    ("steps", "Training steps"),
    ("learning_rate", "Learning rate"),
    ("run_name", "Run name (MaxText run_name)"),
    ("compute_type", "TPU machine type"),
    ("topology", "Slice topology"),
    ("num_slices", "Slices"),
    ("runtime", "TPU VM runtime"),
    ("train_overrides", "MaxText overrides"),
)


def _setting_value(key: str, value: Any) -> str:
    if key == "learning_rate" and value is None:
        return "MaxText's default"
    if isinstance(value, Mapping):
        return json.dumps(dict(value), sort_keys=True) if value else "none"
    return str(value)


def _settings(run: RunSummary) -> str:
    settings = run.settings
    if not settings:
        why = (
            "the run was refused before its settings were resolved"
            if run.refusal
            else "not recorded (a run recorded before the ledger kept its settings)"
        )
        return f"<p class='note'>Settings: {escape(why)}.</p>"
    rows = [
        (name, _setting_value(key, settings.get(key)), "")
        if key != "capacity"
        else (name, capacity_text(settings) or UNKNOWN, CAPACITY_TOOLTIP)
        for key, name in SETTING_NAMES
        if key in settings or key == "learning_rate"
    ]
    attempts = [a for a in settings.get("capacity_attempts") or () if isinstance(a, Mapping)]
    rows += [
        (f"Refused: {a.get('capacity')}", str(a.get("error") or UNKNOWN), "create_vm's attempt of this kind")
        for a in attempts
    ]
    return _facts(rows)


def _stages(ui: AirflowUi, run: RunSummary, steps: Sequence[StepRecord]) -> str:
    if not steps:
        return "<p class='note'>No stage of this run is in the ledger yet.</p>"
    ordered = sorted(steps, key=lambda s: (s.started_at or datetime.max.replace(tzinfo=UTC), s.task_id))
    head = (
        "<thead><tr><th>Task</th><th>State</th><th class='num'>Try</th><th>Started (UTC)</th>"
        "<th class='num'>Duration (hh:mm:ss)</th><th>Log</th></tr></thead>"
    )
    lines = []
    for step in ordered:
        state = step.state or UNKNOWN
        log = _airflow_link(
            ui.task_log(run.dag_id, run.airflow_run_id, step.task_id, step.try_number),
            "log",
            f"{step.task_id}'s log in Airflow",
        )
        lines.append(
            f"<tr><td>{escape(step.task_id)}</td><td class='state state-{escape(state)}'>{escape(state)}</td>"
            f"<td class='num'>{UNKNOWN if step.try_number is None else step.try_number}</td>"
            f"<td>{escape(format_time(step.started_at))}</td>"
            f"<td class='num'>{escape(format_clock(step.duration_seconds))}</td><td>{log}</td></tr>"
        )
    return "<table class='stages'>" + head + "<tbody>" + "".join(lines) + "</tbody></table>"


# The Cloud console's page of one GCS object (what the model card's link opens).
GCS_OBJECT_CONSOLE = "https://console.cloud.google.com/storage/browser/_details/"


def _output(artifact: ArtifactRecord) -> str:
    """An output's URI; the model card's a link to it in the Cloud console."""
    if artifact.kind == "model_card" and artifact.uri.startswith("gs://"):
        href = GCS_OBJECT_CONSOLE + artifact.uri.removeprefix("gs://")
        return f"<a href='{escape(href)}' title='the model card (README.md)'>{escape(artifact.uri)}</a>"
    return escape(artifact.uri)


def run_page(
    root: str,
    run: RunSummary,
    artifacts: Sequence[ArtifactRecord],
    steps: Sequence[StepRecord] = (),
    *,
    ui: AirflowUi,
    now: datetime | None = None,
) -> str:
    """One run: links back to Airflow (``ui``: the serving line's URLs), what it did, what it was
    asked to do, its stages (each with its log), its curves and where its outputs are."""
    now = now or datetime.now(UTC)
    dag_run = ui.dag_run(run.dag_id, run.airflow_run_id)
    crumbs = (
        f"<nav class='crumbs'><a href='{escape(root)}/'>{TITLE}</a> &rsaquo; {escape(run.dag_id)} &rsaquo; "
        f"{escape(run.airflow_run_id)}</nav>"
    )
    back = (
        "<nav class='back'>"
        + _airflow_link(dag_run, "DAG run in Airflow", "this run's page in Airflow")
        + _airflow_link(ui.grid(run.dag_id), "Grid of all runs", f"the grid of {run.dag_id}'s runs")
        + f"<a href='{escape(root)}/'>All TPU RL runs</a></nav>"
    )
    outputs = "".join(
        f"<tr><th>{escape(a.kind)}</th><td>{_output(a)}"
        f"{'' if a.step is None else f' (step {a.step})'}</td></tr>"
        for a in artifacts
    )
    has_curves = any(a.kind == "curves" for a in artifacts)
    if has_curves:
        curves = f"<img src='{escape(curves_href(root, run.dag_id, run.airflow_run_id))}' alt='run curves'>"
    elif run.state == "running":
        curves = "<p class='note'>The curves are drawn when the run ends (its record_run task).</p>"
    else:
        curves = (
            "<p class='note'>No curves were recorded for this run (it did not train, or matplotlib "
            "is missing where record_run ran).</p>"
        )
    body = (
        f"{crumbs}\n<h1>{escape(run.run_id)}</h1>\n{back}\n{_summary(run, now)}\n"
        f"<h2>Settings</h2>\n{_settings(run)}\n"
        f"<h2>Stages</h2>\n{_stages(ui, run, steps)}\n<h2>Curves</h2>\n{curves}\n"
        f"<h2>Outputs</h2>\n<table class='facts'>{outputs or f'<tr><td>{UNKNOWN}</td></tr>'}</table>"
    )
    return _document(f"{run.run_id} - {TITLE}", body)


def message_page(message: str) -> str:
    """A page of one line (a run that is not in the ledger, a ledger that cannot be read)."""
    return _document(TITLE, f"<h1>{TITLE}</h1>\n<p>{escape(message)}</p>")
