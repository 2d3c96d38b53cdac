"""The run's curves and the reward trend: drawn from what the ledger holds, saved as real PNGs."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import date2num
from matplotlib.lines import Line2D

from airflow_provider_tpu_rl.ledger.hook import RunLedger, record_run_from_context
from airflow_provider_tpu_rl.ledger.plots import (
    figure_png,
    reward_trend_figure,
    reward_trend_series,
    run_curves,
    run_curves_figure,
    run_timeline,
)
from airflow_provider_tpu_rl.ledger.records import ArtifactRecord, MetricRecord, ResumeLoss, RunRecord
from airflow_provider_tpu_rl.operators import ledger as ledger_operator
from airflow_provider_tpu_rl.operators.ledger import RecordRunOperator, curves_uri, run_output_folder
from tests.ledger.rows import count_rows
from tests.support.ledger_fakes import (
    BILLED_MINUTES,
    SUCCESS_XCOMS,
    FakeDagRun,
    FakeLedgerTaskInstance,
    context_for,
    gke_task_instances,
    minutes,
)
from tests.support.png import decoded_png

MODEL = "qwen3-30b-a3b"
ACTOR_ROOT = f"gs://bucket/{MODEL}/trained/rl/checkpoints/actor/"
VALIDATED = {
    "model": MODEL,
    "chips": 32,
    "final_step": 50,
    "actor_root": ACTOR_ROOT,
    "suffix": "ab12cd",
    "project": "my-proj",
}


@pytest.fixture
def ledger(sqlite_uri: str, monkeypatch: pytest.MonkeyPatch) -> RunLedger:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_uri)
    return RunLedger()


def line_points(line: Line2D) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in line.get_xydata()]


def test_run_curves_plot_the_ledgers_values(ledger: RunLedger) -> None:
    context = context_for(FakeDagRun(gke_task_instances(), run_id="good"), SUCCESS_XCOMS)
    run = record_run_from_context(context, model=MODEL, chips=32)

    metrics = ledger.run_metrics(run.run_id)
    by_key = {(m.phase, m.step, m.name): m.value for m in metrics}
    figure = run_curves_figure(run_curves(run.run_id, metrics, final_step=50))
    reward_axes, loss_axes = figure.axes

    (reward_line,) = reward_axes.get_lines()
    assert line_points(reward_line) == [
        (0.0, by_key[("pre", 0, "mean_reward")]),
        (25.0, by_key[("intermediate", 25, "mean_reward")]),
        (50.0, by_key[("post", 0, "mean_reward")]),
    ]
    assert [y for _, y in line_points(reward_line)] == [0.12, 0.2, 0.34]
    (loss_line,) = loss_axes.get_lines()
    assert line_points(loss_line) == [
        (float(m.step), m.value) for m in metrics if m.phase == "train" and m.name == "loss"
    ]
    assert line_points(loss_line) == [(1.0, 2.5), (2.0, 2.25)]
    assert run.run_id in figure.get_suptitle()

    image = decoded_png(figure_png(figure))
    assert image.size == (1000, 400)


def test_the_timeline_marks_the_stages_the_tpu_billed_span_and_its_training(ledger: RunLedger) -> None:
    ran = {"started_at": minutes(50).isoformat(), "ended_at": minutes(110).isoformat()}
    xcoms = {**SUCCESS_XCOMS, "train": {**SUCCESS_XCOMS["train"], "ran": ran}}
    run = record_run_from_context(
        context_for(FakeDagRun(gke_task_instances(), run_id="t"), xcoms), model=MODEL, chips=32
    )
    timeline = run_timeline(run, ledger.recorded_steps(run.run_id).values())

    assert timeline.stages[0][:3] == ("deploy_cluster", 0.0, 20.0)
    assert [task for task, *_ in timeline.stages][-1] == "destroy_cluster"
    # billed: when the TPU node VMs ran by their clocks; held: the node pool's deploy start to its
    # destroy's end; neither the cluster's lifetime
    assert (timeline.billed, timeline.held, timeline.trained) == (
        ((38.0, 124.0),),
        (36.0, 126.0),
        (50.0, 110.0),
    )
    assert timeline.idle_share == pytest.approx(1 - 60 / BILLED_MINUTES)
    figure = run_curves_figure(run_curves(run.run_id, ledger.run_metrics(run.run_id)), timeline)
    _, _, stage_axes = figure.axes
    bars = [
        (patch.get_x(), patch.get_x() + patch.get_width())
        for patch in stage_axes.patches
        if patch.get_height() == pytest.approx(0.6)
    ]
    assert bars == [(start, end) for _, start, end, _ in timeline.stages]
    assert [text.get_text() for text in stage_axes.get_legend().get_texts()] == [
        "TPU capacity held (its tasks)",
        "TPU billed (machines' clocks)",
        "TPU training",
    ]
    assert "idle 30%" in stage_axes.get_title()
    assert decoded_png(figure_png(figure)).size == (1000, 800)
    assert run_timeline(run, []).empty
    assert "resumed" not in stage_axes.get_title()

    resumed = replace(run, resume_loss=ResumeLoss(1, 3, 150.0))
    figure = run_curves_figure(
        run_curves(run.run_id, []), run_timeline(resumed, ledger.recorded_steps(run.run_id).values())
    )
    assert "training resumed 1x, 3 steps, 2.5 min lost" in figure.axes[-1].get_title()


def test_the_timelines_legend_sits_outside_the_stage_bars(ledger: RunLedger) -> None:
    """The last stages (wait_hf_export, destroy_cluster) end at the right edge, low in the panel,
    where a legend inside the axes covered them: no legend box overlaps a bar's box."""
    run = record_run_from_context(
        context_for(FakeDagRun(gke_task_instances(), run_id="l"), SUCCESS_XCOMS), model=MODEL, chips=32
    )
    timeline = run_timeline(run, ledger.recorded_steps(run.run_id).values())
    figure = run_curves_figure(run_curves(run.run_id, ledger.run_metrics(run.run_id)), timeline)
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    stage_axes = figure.axes[-1]
    legend = stage_axes.get_legend().get_window_extent(renderer)
    bars = [
        patch.get_window_extent(renderer)
        for patch in stage_axes.patches
        if patch.get_height() == pytest.approx(0.6)
    ]
    assert len(bars) == len(timeline.stages) > 2
    assert [box for box in bars if box.overlaps(legend)] == []
    # and the whole legend is on the picture (the layout made room for it)
    assert legend.x0 >= 0
    assert legend.x1 <= figure.bbox.x1


def test_after_is_drawn_at_the_last_recorded_step_when_the_final_step_is_unknown() -> None:
    metrics = [
        MetricRecord("pre", 0, "mean_reward", 0.1),
        MetricRecord("post", 0, "mean_reward", 0.3),
        MetricRecord("train", 7, "loss", 1.0),
        MetricRecord("intermediate", 5, "accuracy", 40.0),  # not a reward: not drawn
    ]

    curves = run_curves("r", metrics)

    assert curves.reward_points == [(0, 0.1), (7, 0.3)]
    assert curves.loss == ((7, 1.0),)


# A fresh interpreter: what load_matplotlib imported, then what drawing a run's PNG imported besides.
DRAW_AFTER_LOAD = """
import json, sys
from airflow_provider_tpu_rl.ledger.plots import figure_png, load_matplotlib, run_curves, run_curves_figure
from airflow_provider_tpu_rl.ledger.records import MetricRecord
before = set(sys.modules)
assert load_matplotlib()
loaded = set(sys.modules)
metrics = [MetricRecord("pre", 0, "mean_reward", 0.1), MetricRecord("train", 3, "loss", 1.0)]
png = figure_png(run_curves_figure(run_curves("r", metrics, final_step=3)))
print(json.dumps({"loaded": len(loaded - before), "drawing imported": sorted(set(sys.modules) - loaded),
                  "png": png[:8].hex()}))
"""


def test_load_matplotlib_imports_all_that_drawing_a_png_needs() -> None:
    """record_run loads matplotlib in a thread while it records the run: the drawing then imports
    nothing (neither matplotlib's modules nor the plugins Pillow loads on its first save)."""
    out = subprocess.run([sys.executable, "-c", DRAW_AFTER_LOAD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["loaded"] > 0
    assert found["drawing imported"] == []
    assert found["png"] == "89504e470d0a1a0a"


@pytest.mark.parametrize(
    ("evaluated", "text"),
    [
        (0.0, "no reward:\nnum_test_batches=0, evaluation off"),
        (
            2.0,
            "no reward before and after training:\nevaluation was on (num_test_batches=2) but the training "
            "log held no such line",
        ),
        (None, "no reward recorded"),  # a run recorded before the evaluation's size was
    ],
)
def test_the_reward_panel_says_why_there_is_no_reward(evaluated: float | None, text: str) -> None:
    metrics = [MetricRecord("train", 1, "loss", 1.0)]
    if evaluated is not None:
        metrics.append(MetricRecord("train", 0, "num_test_batches", evaluated))
    figure = run_curves_figure(run_curves("r", metrics, final_step=1))

    reward_axes, _ = figure.axes
    assert reward_axes.get_lines() == []
    assert [t.get_text() for t in reward_axes.texts] == [text]
    decoded_png(figure_png(figure))


def test_a_run_without_loss_still_draws_its_rewards() -> None:
    figure = run_curves_figure(run_curves("r", [MetricRecord("pre", 0, "mean_reward", 0.5)], final_step=3))

    reward_axes, loss_axes = figure.axes
    assert [line_points(line) for line in reward_axes.get_lines()] == [[(0.0, 0.5)]]
    assert loss_axes.get_lines() == []
    assert [text.get_text() for text in loss_axes.texts] == ["no loss recorded"]
    decoded_png(figure_png(figure))


def test_reward_trend_plots_every_runs_rewards_per_model_at_its_start_time(ledger: RunLedger) -> None:
    rewards = {"r1": (0.1, 0.3), "r2": (0.2, 0.5), "r3": (0.15, None)}
    for index, (name, (pre, post)) in enumerate(rewards.items()):
        run = RunRecord("tpu_rl_gke_pipeline", name, MODEL, "success", started_at=minutes(60 * index))
        metrics = [MetricRecord("pre", 0, "mean_reward", pre)]
        if post is not None:
            metrics.append(MetricRecord("post", 0, "mean_reward", post))
        ledger.record(run, metrics=metrics)
    other = RunRecord("tpu_rl_tpu_vm_pipeline", "v1", "llama3.1-8b", "success", started_at=minutes(30))
    ledger.record(other, metrics=[MetricRecord("post", 0, "mean_reward", 0.7)])

    rows = ledger.reward_trend()
    series = reward_trend_series(rows)
    figure = reward_trend_figure(series)

    lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
    assert set(lines) == {f"{m} {side}" for m in (MODEL, "llama3.1-8b") for side in ("before", "after")}
    qwen_rows = [row for row in rows if row["model"] == MODEL]
    assert [row["run_id"].split("/")[1] for row in qwen_rows] == ["r1", "r2", "r3"]
    # x is the run's start time (not its rank among its model's runs): the models' runs interleave
    assert line_points(lines[f"{MODEL} before"]) == [
        (date2num(minutes(60 * i)), row["pre_mean_reward"]) for i, row in enumerate(qwen_rows)
    ]
    after = line_points(lines[f"{MODEL} after"])
    assert after[:2] == [(date2num(minutes(0)), 0.3), (date2num(minutes(60)), 0.5)]
    assert math.isnan(after[2][1])  # no "after" marker where the run has none
    assert line_points(lines["llama3.1-8b after"]) == [(date2num(minutes(30)), 0.7)]
    # before is a hollow marker, after a filled one, in the model's colour
    assert lines[f"{MODEL} before"].get_markerfacecolor() == "white"
    assert lines[f"{MODEL} after"].get_markerfacecolor() == lines[f"{MODEL} after"].get_color()

    image = decoded_png(figure_png(figure))
    assert image.size == (1000, 450)


def test_with_one_run_per_model_the_trend_still_tells_before_from_after() -> None:
    """Two models, one run each: each run's gain is drawn (an arrow from before to after), the
    runs sit at their own times, and the legend names the models and the two markers."""
    rows = [
        {
            "model": "a",
            "run_id": "d/1",
            "started_at": minutes(0),
            "pre_mean_reward": 0.1,
            "post_mean_reward": 0.3,
        },
        {
            "model": "b",
            "run_id": "d/2",
            "started_at": minutes(90),
            "pre_mean_reward": 0.2,
            "post_mean_reward": 0.25,
        },
    ]
    axes = reward_trend_figure(reward_trend_series(rows)).axes[0]

    arrows = [(a.xy, a.xyann) for a in axes.texts if getattr(a, "arrow_patch", None) is not None]
    assert arrows == [
        ((date2num(minutes(0)), 0.3), (date2num(minutes(0)), 0.1)),
        ((date2num(minutes(90)), 0.25), (date2num(minutes(90)), 0.2)),
    ]
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert legend == ["a", "b", "before", "after"]


def test_the_reward_labels_stay_inside_the_reward_panel() -> None:
    """ "before 0.0884" clears the y axis' tick labels and "after 0.245" the panel's title."""
    metrics = [
        MetricRecord("pre", 0, "mean_reward", 0.0884),
        MetricRecord("intermediate", 2, "mean_reward", 0.15),
        MetricRecord("post", 0, "mean_reward", 0.245),
        MetricRecord("train", 1, "loss", 1.0),
    ]
    figure = run_curves_figure(run_curves("d/r", metrics, final_step=4))
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    axes = figure.axes[0]
    inside = axes.get_window_extent(renderer)
    labels = {text.get_text(): text.get_window_extent(renderer) for text in axes.texts}

    assert set(labels) == {"before 0.0884", "after 0.245"}
    for text, box in labels.items():
        assert inside.x0 <= box.x0, text
        assert box.x1 <= inside.x1, text
        assert inside.y0 <= box.y0, text
        assert box.y1 <= inside.y1, text
    ticks = [label.get_window_extent(renderer) for label in axes.get_yticklabels() if label.get_text()]
    assert all(not box.overlaps(labels["before 0.0884"]) for box in ticks)
    assert not axes.title.get_window_extent(renderer).overlaps(labels["after 0.245"])


def _trend_row(name: str, started: Any, pre: float = 0.1, post: float = 0.3) -> dict[str, Any]:
    return {
        "model": MODEL,
        "run_id": f"d/{name}",
        "started_at": started,
        "pre_mean_reward": pre,
        "post_mean_reward": post,
    }


def test_the_trend_of_one_run_spans_an_hour_around_it_not_years() -> None:
    """One run: matplotlib's singular date range spans years (2025-2029 for a run of 2027); the
    axis is the run's time and half an hour each side, and the picture carries no title of its own
    (the dashboard's heading names it)."""
    axes = reward_trend_figure(reward_trend_series([_trend_row("1", minutes(0))])).axes[0]
    low, high = axes.get_xlim()
    assert low < date2num(minutes(0)) < high
    assert high - low == pytest.approx(1 / 24)
    assert axes.get_title() == ""


def test_the_trend_axis_spans_the_runs_with_a_margin() -> None:
    rows = [_trend_row("1", minutes(0)), _trend_row("2", minutes(3 * 24 * 60)), _trend_row("3", minutes(60))]
    axes = reward_trend_figure(reward_trend_series(rows), title="Mean reward across runs").axes[0]
    low, high = axes.get_xlim()
    first, last = date2num(minutes(0)), date2num(minutes(3 * 24 * 60))
    assert low == pytest.approx(first - 0.08 * 3)
    assert high == pytest.approx(last + 0.08 * 3)
    assert axes.get_title() == "Mean reward across runs"


def test_an_empty_trend_is_a_labelled_empty_picture() -> None:
    figure = reward_trend_figure([])

    assert figure.axes[0].get_lines() == []
    assert [text.get_text() for text in figure.axes[0].texts] == ["no run with a reward in the ledger"]


@pytest.mark.parametrize(
    ("actor_root", "folder"),
    [
        (ACTOR_ROOT, f"gs://bucket/{MODEL}/trained/rl/"),
        ("gs://b/llama/post-train/rl-1/checkpoints/actor", "gs://b/llama/post-train/rl-1/"),
        ("gs://b/elsewhere/", "gs://b/elsewhere/"),
        (None, None),
        ("/dev/shm/x/", None),
    ],
)
def test_the_run_output_folder(actor_root: str | None, folder: str | None) -> None:
    assert run_output_folder(actor_root) == folder


@dataclass
class RecordTaskInstance(FakeLedgerTaskInstance):
    """The record_run task's own instance: it pulls validate's XCom and pushes its link."""

    pushed: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def record_context(run_id: str, xcoms: dict[str, Any]) -> dict[str, Any]:
    context = context_for(FakeDagRun(gke_task_instances(), run_id=run_id), xcoms)
    context["ti"] = RecordTaskInstance(xcoms)
    context["params"] = {"model": MODEL}
    return context


def operator() -> RecordRunOperator:
    return RecordRunOperator(
        task_id="record_ledger", cluster_task_ids=("deploy_cluster", "destroy_cluster"), teardown_task_ids=()
    )


def test_record_run_uploads_the_curves_and_links_them(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    uploads: dict[str, bytes] = {}
    op = operator()
    monkeypatch.setattr(op, "upload", lambda uri, data: uploads.__setitem__(uri, data))
    context = record_context("good", {**SUCCESS_XCOMS, "validate": VALIDATED})

    result = op.execute(context)  # type: ignore[arg-type]

    uri = f"gs://bucket/{MODEL}/trained/rl/tpu-rl-curves-ab12cd.png"
    assert uri == curves_uri(f"gs://bucket/{MODEL}/trained/rl/", "ab12cd")
    assert result == {"run_id": "tpu_rl_gke_pipeline/good", "state": "success", "curves_uri": uri}
    assert list(uploads) == [uri]
    assert decoded_png(uploads[uri]).size == (1000, 800)  # the curves and the run's timeline
    # the "Run Curves" link opens the run's page on the dashboard; the ledger lists the PNG
    assert context["ti"].pushed == {"tpu_rl_run_curves": {"dag_id": "tpu_rl_gke_pipeline", "run_id": "good"}}
    assert count_rows(ledger, "runs") == 1
    assert ArtifactRecord("curves", uri) in ledger.run_artifacts("tpu_rl_gke_pipeline/good")


def test_without_matplotlib_the_run_is_recorded_and_one_line_says_why(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ledger_operator, "matplotlib_available", lambda: False)
    op = operator()
    monkeypatch.setattr(op, "upload", lambda uri, data: pytest.fail("nothing to upload"))
    context = record_context("good", {**SUCCESS_XCOMS, "validate": VALIDATED})

    with caplog.at_level(logging.INFO):
        result = op.execute(context)  # type: ignore[arg-type]

    assert result == {"run_id": "tpu_rl_gke_pipeline/good", "state": "success"}
    curve_lines = [r.getMessage() for r in caplog.records if "run curves" in r.getMessage()]
    assert len(curve_lines) == 1
    assert "matplotlib is not installed" in curve_lines[0]
    assert "[plot]" in curve_lines[0]
    assert context["ti"].pushed == {"tpu_rl_run_curves": {"dag_id": "tpu_rl_gke_pipeline", "run_id": "good"}}
    assert count_rows(ledger, "runs") == 1


def test_a_run_without_rewards_or_losses_is_recorded_without_a_picture_and_one_line_says_so(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``train`` left no result (marked successful, or failed before printing): nothing to draw."""
    op = operator()
    monkeypatch.setattr(op, "upload", lambda uri, data: pytest.fail("nothing to upload"))
    xcoms = {key: value for key, value in SUCCESS_XCOMS.items() if key != "train"}
    context = record_context("no-metrics", {**xcoms, "validate": VALIDATED})

    with caplog.at_level(logging.INFO):
        result = op.execute(context)  # type: ignore[arg-type]

    assert result == {"run_id": "tpu_rl_gke_pipeline/no-metrics", "state": "success"}
    curve_lines = [r.getMessage() for r in caplog.records if "run curves" in r.getMessage()]
    assert curve_lines == ["run curves: the ledger holds no reward or loss for this run; no picture"]
    assert context["ti"].pushed == {
        "tpu_rl_run_curves": {"dag_id": "tpu_rl_gke_pipeline", "run_id": "no-metrics"}
    }
    assert count_rows(ledger, "runs") == 1


def test_record_run_ends_only_after_its_matplotlib_import(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run with nothing to draw ends before the import would: the task still waits for it (an
    import left running as the task's process exits aborted the interpreter, exit -6)."""
    imported = threading.Event()

    def slow_load() -> bool:
        time.sleep(0.5)
        imported.set()
        return True

    monkeypatch.setattr(ledger_operator, "load_matplotlib", slow_load)
    op = operator()
    monkeypatch.setattr(op, "upload", lambda uri, data: pytest.fail("nothing to upload"))
    context = record_context("bad", {})

    assert op.execute(context)["state"] == "success"  # type: ignore[arg-type]

    assert imported.is_set()
    assert ledger_operator.PLOT_IMPORT_THREAD not in {t.name for t in threading.enumerate()}


def test_a_failed_upload_does_not_fail_the_ledger_task(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(uri: str, data: bytes) -> None:
        raise PermissionError("403 storage.objects.create denied")

    op = operator()
    monkeypatch.setattr(op, "upload", refuse)
    context = record_context("good", {**SUCCESS_XCOMS, "validate": VALIDATED})

    with caplog.at_level(logging.WARNING):
        result = op.execute(context)  # type: ignore[arg-type]

    assert "curves_uri" not in result
    assert any("could not upload" in r.getMessage() for r in caplog.records)
    assert count_rows(ledger, "runs") == 1
    assert "curves" not in {a.kind for a in ledger.run_artifacts("tpu_rl_gke_pipeline/good")}


def test_a_run_that_failed_at_validate_is_recorded_without_curves(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    op = operator()
    monkeypatch.setattr(op, "upload", lambda uri, data: pytest.fail("nothing to upload"))
    context = record_context("bad", {})

    result = op.execute(context)  # type: ignore[arg-type]

    assert result["state"] == "success"
    assert "curves_uri" not in result
    assert ledger.latest_runs()[0].model == MODEL
