"""The dashboard's pages for every row the ledger can hold (refused, failed, running, no metrics, no
picture, success): each renders, with columns in words and units, Airflow's duration and time
formats, and links back to Airflow by the URLs of the line that serves it."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape
from html.parser import HTMLParser

import pytest

from airflow_provider_tpu_rl.dashboard.pages import (
    COLUMNS,
    Airflow2Ui,
    Airflow3Ui,
    format_chip_hours,
    format_clock,
    format_time,
    run_page,
    runs_page,
)
from airflow_provider_tpu_rl.dashboard.reads import DashboardReader
from airflow_provider_tpu_rl.ledger.hook import RunLedger
from tests.dashboard.conftest import ABANDONED_REASON, EVERY_STATE, GKE, REFUSAL
from tests.support.ledger_fakes import minutes

NOW = minutes(55)  # the running run started at minute 50
UI = Airflow3Ui("")


class Table(HTMLParser):
    """The cells of a page's first table: rows of (tag, attributes, text)."""

    def __init__(self, css_class: str) -> None:
        super().__init__()
        self.css_class = css_class
        self.inside = False
        self.rows: list[list[tuple[str, dict[str, str], str]]] = []
        self._cell: tuple[str, dict[str, str]] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {name: value or "" for name, value in attrs}
        if tag == "table" and found.get("class") == self.css_class:
            self.inside = True
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self._cell, self._text = (tag, found), []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.inside = False
        elif self.inside and tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append((*self._cell, "".join(self._text).strip()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._text.append(data)


def table(page: str, css_class: str) -> list[list[tuple[str, dict[str, str], str]]]:
    parser = Table(css_class)
    parser.feed(page)
    return parser.rows


def runs_rows(every_state: RunLedger) -> dict[str, list[tuple[str, dict[str, str], str]]]:
    page = runs_page("/tpu-rl", DashboardReader().runs({GKE}), now=NOW)
    head, *rows = table(page, "runs")
    assert [text for _, _, text in head] == [column.heading for column in COLUMNS]
    return {row[0][2].split("/", 1)[1]: row for row in rows}


def test_the_runs_page_renders_a_row_for_every_kind_of_run(every_state: RunLedger) -> None:
    rows = runs_rows(every_state)
    assert set(rows) == set(EVERY_STATE)
    full = len(COLUMNS)
    for name, row in rows.items():
        spans = sum(int(attrs.get("colspan", "1")) for _, attrs, _ in row)
        assert spans == full, (name, row)  # every row fills the table, the refused one too


def test_a_refused_run_shows_its_reason_across_the_columns_it_has_no_value_for(
    every_state: RunLedger,
) -> None:
    """The front page once answered a bare 500 to a ledger holding one refused run (its shortened
    row was zipped, strictly, with the full columns): then no earlier run could be reached either."""
    row = runs_rows(every_state)["refused"]
    assert [text for _, _, text in row[:4]] == [
        f"{GKE}/refused",
        "qwen3-30b-a3b",
        "failed",
        format_time(minutes(0)),
    ]
    (_, attrs, text) = row[4]
    assert (attrs["colspan"], attrs["class"], text) == (str(len(COLUMNS) - 4), "refusal", REFUSAL)


def test_a_failed_run_without_metrics_shows_dashes_where_nothing_is_known(every_state: RunLedger) -> None:
    cells = {COLUMNS[i].heading: text for i, (_, _, text) in enumerate(runs_rows(every_state)["failed"])}
    assert cells["State"] == "failed"
    assert cells["Duration (hh:mm:ss)"] == "00:30:00"
    assert cells["Mean reward (before → after)"] == "-"
    assert cells["TPU billed (chip-hours)"] == "10.7"  # 32 chips x 20 minutes
    assert cells["TPU trained (chip-hours)"] == "-"
    assert cells["Est. cost (USD)"] == "28.80"


def test_a_running_run_is_listed_with_its_time_so_far(every_state: RunLedger) -> None:
    cells = {COLUMNS[i].heading: text for i, (_, _, text) in enumerate(runs_rows(every_state)["running"])}
    assert (cells["State"], cells["Duration (hh:mm:ss)"]) == ("running", "00:05:00 so far")
    assert cells["Started (UTC)"] == format_time(minutes(50)) == "2026-03-01 08:50:00"


def test_a_row_the_janitor_closed_shows_abandoned_and_why_on_both_pages(every_state: RunLedger) -> None:
    row = runs_rows(every_state)["abandoned"]
    cells = {COLUMNS[i].heading: (attrs, text) for i, (_, attrs, text) in enumerate(row)}
    attrs, text = cells["State"]
    assert text == f"abandoned{ABANDONED_REASON}"  # the state, and why beneath it
    assert (attrs["class"], attrs["title"]) == ("state state-abandoned", ABANDONED_REASON)
    assert cells["Duration (hh:mm:ss)"][1] == "00:25:00"  # to the janitor's close, not "so far"
    assert cells["TPU billed (chip-hours)"][1] == "12.3"  # 32 chips x 23 minutes, up to the destroy
    view = DashboardReader().run(GKE, "abandoned")
    page = run_page("/tpu-rl", view.run, view.artifacts, view.steps, ui=UI, now=NOW)
    facts = {row[0][2]: row[1][2] for row in table(page, "facts") if len(row) == 2}
    assert (facts["State"], facts["Why it ended"]) == ("abandoned", ABANDONED_REASON)
    assert facts["Ended (UTC)"] == format_time(minutes(45))
    running = DashboardReader().run(GKE, "running")
    assert "Why it ended" not in run_page("/tpu-rl", running.run, [], ui=UI, now=NOW)


def test_the_idle_share_reads_right_beside_its_inputs(every_state: RunLedger) -> None:
    """IDLE 52% beside "0.1" and "0.2" looked wrong: the chip-hours have the digits that explain it,
    and the cell's tooltip does the sum."""
    row = runs_rows(every_state)["no-picture"]
    cells = {COLUMNS[i].heading: (attrs, text) for i, (_, attrs, text) in enumerate(row)}
    assert cells["TPU billed (chip-hours)"][1] == "0.204"
    assert cells["TPU trained (chip-hours)"][1] == "0.0980"
    assert cells["TPU idle (% of billed chip-hours)"][1] == "52%"
    assert cells["TPU idle (% of billed chip-hours)"][0]["title"] == (
        "1 - 0.0980 trained / 0.204 billed chip-hours = 52% idle"
    )
    assert cells["Duration (hh:mm:ss)"][1] == "00:01:27"  # Airflow's format, not 1m27s
    assert "0.204 billed chip-hours x $2.70 per chip-hour" in cells["Est. cost (USD)"][0]["title"]


def test_every_column_is_headed_in_words_with_a_tooltip_and_numbers_align_right(
    every_state: RunLedger,
) -> None:
    page = runs_page("/tpu-rl", DashboardReader().runs({GKE}), now=NOW)
    head, *rows = table(page, "runs")
    for _, attrs, text in head:
        assert attrs["title"], text
        assert not re.fullmatch(r"[A-Z $-]+", text), text  # not the CLI's capitals
    numeric = {column.heading for column in COLUMNS if column.numeric}
    assert {
        "Duration (hh:mm:ss)",
        "Training resumes",
        "Est. cost (USD)",
        "TPU idle (% of billed chip-hours)",
    } <= numeric
    for _, attrs, text in head:
        assert ("num" in attrs.get("class", "")) is (text in numeric), text
    for row in rows:
        if len(row) == len(COLUMNS):
            for column, (_, attrs, _) in zip(COLUMNS, row, strict=True):
                assert ("num" in attrs.get("class", "")) is column.numeric, column.heading


@pytest.mark.parametrize("name", list(EVERY_STATE))
def test_every_kind_of_run_has_a_page(every_state: RunLedger, name: str) -> None:
    view = DashboardReader().run(GKE, name)
    page = run_page("/tpu-rl", view.run, view.artifacts, view.steps, ui=UI, now=NOW)
    facts = {row[0][2]: row[1][2] for row in table(page, "facts") if len(row) == 2}
    assert facts["State"] == view.run.state
    assert f"<h1>{GKE}/{name}</h1>" in page
    # back to Airflow from every page
    assert f"data-airflow href='/dags/{GKE}/runs/{name}'" in page
    assert f"data-airflow href='/dags/{GKE}'" in page
    curves = "alt='run curves'" in page
    assert curves is (name == "success")
    if name == "refused":
        assert facts["Refused"] == REFUSAL
        assert "the run was refused before its settings were resolved" in page
    if name == "running":
        assert facts["Duration (hh:mm:ss)"] == "00:05:00 so far"
        assert "The curves are drawn when the run ends" in page
    if name in ("failed", "no-picture", "abandoned"):
        assert "No curves were recorded for this run" in page


def test_the_run_page_lists_the_runs_settings(every_state: RunLedger) -> None:
    view = DashboardReader().run(GKE, "running")
    page = run_page("/tpu-rl", view.run, view.artifacts, view.steps, ui=UI, now=NOW)
    settings = {row[0][2]: unescape(row[1][2]) for row in table(page, "facts") if len(row) == 2}
    assert {key: settings[key] for key in ("Model", "TPU capacity", "Training steps", "Learning rate")} == {
        "Model": "qwen3-30b-a3b",
        "TPU capacity": "spot",
        "Training steps": "50",
        "Learning rate": "2e-5",
    }
    assert settings["Run name (MaxText run_name)"] == "rl-abc123"
    assert settings["MaxText overrides"] == '{"num_test_batches": 2}'


def test_each_stage_links_its_log_in_airflow(every_state: RunLedger) -> None:
    view = DashboardReader().run(GKE, "failed")
    page = run_page("/tpu-rl", view.run, view.artifacts, view.steps, ui=UI, now=NOW)
    head, *rows = table(page, "stages")
    assert [text for _, _, text in head] == [
        "Task",
        "State",
        "Try",
        "Started (UTC)",
        "Duration (hh:mm:ss)",
        "Log",
    ]
    assert [[text for _, _, text in row[:5]] for row in rows] == [
        ["deploy_tpu_pool", "success", "1", format_time(minutes(15)), "00:05:00"],
        ["train", "failed", "2", format_time(minutes(20)), "00:13:00"],
    ]
    assert f"data-airflow href='/dags/{GKE}/runs/failed/tasks/train?try_number=2'" in page


@pytest.mark.parametrize("name", ["success", "running"])
def test_a_link_back_to_airflow_is_never_shown_before_its_click_listener(
    every_state: RunLedger, name: str
) -> None:
    """Inside Airflow 3's frame a link back is followed by the page's script: the script comes
    before the body, or a link clicked while the page is still parsed opens Airflow in the frame."""
    view = DashboardReader().run(GKE, name)
    pages = [
        run_page("/tpu-rl", view.run, view.artifacts, view.steps, ui=UI, now=NOW),
        runs_page("/tpu-rl", DashboardReader().runs({GKE}), now=NOW),
    ]
    for page in pages:
        assert page.index("a[data-airflow]") < page.index("</head>") < page.index("<a ")


def test_the_links_back_are_each_airflow_lines_own() -> None:
    """Airflow 3: the UI's routes (the run, the DAG, a task instance whose first tab is its log);
    Airflow 2: the grid view with the run, the task and its log tab selected."""
    three, two = Airflow3Ui("/base"), Airflow2Ui("")
    assert three.dag_run("d", "manual__1+2") == "/base/dags/d/runs/manual__1%2B2"
    assert three.grid("d") == "/base/dags/d"
    assert three.task_log("d", "r", "train", 3) == "/base/dags/d/runs/r/tasks/train?try_number=3"
    assert two.dag_run("d", "manual__1+2") == "/dags/d/grid?dag_run_id=manual__1%2B2"
    assert two.grid("d") == "/dags/d/grid"
    assert two.task_log("d", "r", "train", 3) == "/dags/d/grid?dag_run_id=r&task_id=train&tab=logs"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "-"),
        (0.4, "00:00:00"),
        (87, "00:01:27"),
        (3600 * 5 + 61, "05:01:01"),
        (86400 + 3723, "1d01:02:03"),
    ],
)
def test_durations_read_as_airflow_shows_them(seconds: float | None, shown: str) -> None:
    assert format_clock(seconds) == shown


@pytest.mark.parametrize(
    ("hours", "shown"),
    [(None, "-"), (0, "0"), (0.09804, "0.0980"), (0.2040, "0.204"), (4.312, "4.31"), (1234.5, "1,234")],
)
def test_chip_hours_keep_three_significant_digits(hours: float | None, shown: str) -> None:
    assert format_chip_hours(hours) == shown


def test_a_running_runs_duration_counts_from_its_start(every_state: RunLedger) -> None:
    later = NOW + timedelta(hours=2)
    page = runs_page("/tpu-rl", DashboardReader().runs({GKE}), now=later)
    assert "02:05:00 so far" in page


def test_a_model_the_gate_held_back_reads_not_promoted_on_both_pages(every_state: RunLedger) -> None:
    from airflow_provider_tpu_rl.ledger.records import RunRecord

    line = "not promoted: reward gain +0.01 < min_reward_gain 0.05 (mean reward 0.3 -> 0.31)"
    every_state.record(
        RunRecord(GKE, "held", "qwen3-30b-a3b", "success", started_at=minutes(52), promotion=line)
    )
    row = runs_rows(every_state)["held"]
    cells = {COLUMNS[i].heading: (attrs, text) for i, (_, attrs, text) in enumerate(row)}
    assert cells["Promoted"] == ({"title": line}, "not promoted")
    assert {COLUMNS[i].heading: text for i, (_, _, text) in enumerate(runs_rows(every_state)["success"])}[
        "Promoted"
    ] == "-"  # a run the gate never saw
    view = DashboardReader().run(GKE, "held")
    page = run_page("/tpu-rl", view.run, view.artifacts, view.steps, ui=UI, now=NOW)
    facts = {row[0][2]: row[1][2] for row in table(page, "facts") if len(row) == 2}
    assert facts["Promotion"] == line


def test_the_run_page_links_the_model_card(every_state: RunLedger) -> None:
    from airflow_provider_tpu_rl.ledger.records import ArtifactRecord

    card = "gs://bkt/qwen/hf-trained/rl/README.md"
    run_id = f"{GKE}/success"
    every_state.record_artifacts(run_id, [ArtifactRecord("model_card", card)])
    view = DashboardReader().run(GKE, "success")
    page = run_page("/tpu-rl", view.run, view.artifacts, view.steps, ui=UI, now=NOW)
    assert (
        "<a href='https://console.cloud.google.com/storage/browser/_details/bkt/qwen/hf-trained/rl/README.md'"
        in page
    )


def test_the_run_page_names_the_capacity_that_served_and_each_refusal(every_state: RunLedger) -> None:
    import dataclasses
    import json

    view = DashboardReader().run(GKE, "running")
    settings = {
        **view.run.settings,
        "capacity": ["reservation", "flex-start", "spot"],
        "capacity_served": "spot",
        "capacity_attempts": [
            {"capacity": "reservation", "error": "ERROR: (gcloud.compute.instances.create) full"},
            {"capacity": "flex-start", "error": "ERROR: (gcloud.alpha.compute.instances.create) stockout"},
        ],
    }
    run = dataclasses.replace(view.run, settings_json=json.dumps(settings))
    page = run_page("/tpu-rl", run, view.artifacts, view.steps, ui=UI, now=NOW)
    facts = {row[0][2]: unescape(row[1][2]) for row in table(page, "facts") if len(row) == 2}
    assert facts["TPU capacity"] == "spot (after reservation, flex-start refused)"
    assert facts["Refused: reservation"] == "ERROR: (gcloud.compute.instances.create) full"
    assert facts["Refused: flex-start"] == "ERROR: (gcloud.alpha.compute.instances.create) stockout"


def test_the_run_page_names_the_gke_cluster_and_where_it_came_from(every_state: RunLedger) -> None:
    import dataclasses

    view = DashboardReader().run(GKE, "running")
    page = run_page("/tpu-rl", view.run, view.artifacts, view.steps, ui=UI, now=NOW)
    assert "GKE cluster" not in page  # none recorded
    run = dataclasses.replace(view.run, gke_cluster="p-1/us-east5/tpu-rl", gke_cluster_origin="kept")
    page = run_page("/tpu-rl", run, view.artifacts, view.steps, ui=UI, now=NOW)
    facts = {
        row[0][2]: (unescape(row[1][2]), row[1][1].get("title", ""))
        for row in table(page, "facts")
        if len(row) == 2
    }
    value, tooltip = facts["GKE cluster"]
    assert value == "p-1/us-east5/tpu-rl (kept)"
    assert "not charged to it" in unescape(tooltip)
