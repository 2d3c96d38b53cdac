"""Pictures of the ledger: one run's curves, and the reward trend across runs (matplotlib, optional).

matplotlib is the optional extra ``plot`` (``pip install 'airflow-provider-tpu-rl[plot]'``); this
module imports it only inside the functions that draw, so the ledger works without it:
:func:`matplotlib_available` says whether it can draw. Figures are built with the object API
(``matplotlib.figure.Figure``, no pyplot state), so drawing is safe in a worker thread.
"""

from __future__ import annotations

import importlib.util
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow_provider_tpu_rl.ledger.records import (
    NUM_TEST_BATCHES_METRIC,
    MetricRecord,
    ResumeLoss,
    RunRecord,
    StepRecord,
    as_utc,
    idle_share,
    no_reward_reason,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

REWARD_METRIC = "mean_reward"
LOSS_METRIC = "loss"
PLOT_EXTRA_HINT = "pip install 'airflow-provider-tpu-rl[plot]'"
_DPI = 100


def matplotlib_available() -> bool:
    """Whether matplotlib is installed (the optional extra ``plot``)."""
    return importlib.util.find_spec("matplotlib") is not None


def load_matplotlib() -> bool:
    """Import what drawing a PNG needs (about half a second), ahead of the drawing, e.g. in a thread;
    False when it cannot be imported (the drawing imports it again and says why)."""
    try:
        import matplotlib.backends.backend_agg
        import matplotlib.figure  # noqa: F401
        from PIL import Image
    except ImportError:
        return False
    Image.preinit()  # the image plugins Pillow imports on its first save
    return True


@dataclass(frozen=True)
class RunCurves:
    """The points of one run's curves: mean reward before, at each evaluation, after; loss per step.

    ``before`` is drawn at step 0 and ``after`` at ``final_step``.
    """

    run_id: str
    before: float | None = None
    evaluations: tuple[tuple[int, float], ...] = ()
    after: float | None = None
    loss: tuple[tuple[int, float], ...] = ()
    final_step: int = 1
    num_test_batches: float | None = None  # the evaluation's size (0 = off), when recorded

    @property
    def reward_points(self) -> list[tuple[int, float]]:
        """``(step, mean reward)`` in step order: before at 0, the evaluations, after at the final step."""
        points = [(0, self.before)] if self.before is not None else []
        points.extend(self.evaluations)
        if self.after is not None:
            points.append((self.final_step, self.after))
        return points

    @property
    def no_reward_reason(self) -> str | None:
        """Why the run has no mean reward before or after training, when the ledger knows."""
        return no_reward_reason(self.num_test_batches, self.before, self.after)

    @property
    def empty(self) -> bool:
        """Nothing to draw."""
        return not self.reward_points and not self.loss


def run_curves(run_id: str, metrics: Iterable[MetricRecord], final_step: int | None = None) -> RunCurves:
    """The curves of a run from its ledger metrics (``RunLedger.run_metrics``).

    ``final_step`` places the "after" point; by default the last step any metric was recorded at.
    """
    before = after = num_test_batches = None
    evaluations: dict[int, float] = {}
    loss: dict[int, float] = {}
    for metric in metrics:
        if metric.value is None or math.isnan(metric.value):
            continue
        if metric.name == REWARD_METRIC:
            if metric.phase == "pre":
                before = metric.value
            elif metric.phase == "post":
                after = metric.value
            elif metric.phase == "intermediate":
                evaluations[metric.step] = metric.value
        elif metric.phase == "train" and metric.name == LOSS_METRIC:
            loss[metric.step] = metric.value
        elif metric.phase == "train" and metric.name == NUM_TEST_BATCHES_METRIC:
            num_test_batches = metric.value
    last = max([*evaluations, *loss, 1])
    return RunCurves(
        run_id=run_id,
        before=before,
        evaluations=tuple(sorted(evaluations.items())),
        after=after,
        loss=tuple(sorted(loss.items())),
        final_step=max(final_step, last) if final_step is not None else last,
        num_test_batches=num_test_batches,
    )


@dataclass(frozen=True)
class RunTimeline:
    """A run's stages in time, with the TPU's spans (minutes from the start): billed (when any TPU
    machine ran, by its own clock), held (the capacity's create task to its delete task) and
    training."""

    stages: tuple[tuple[str, float, float, str], ...]  # task id, start, end, state
    billed: tuple[tuple[float, float], ...] = ()
    trained: tuple[float, float] | None = None
    held: tuple[float, float] | None = None
    idle_share: float | None = None
    resume_loss: ResumeLoss | None = None

    @property
    def empty(self) -> bool:
        """No stage with a known span."""
        return not self.stages


def run_timeline(run: RunRecord, steps: Iterable[StepRecord], ignored: Iterable[str] = ()) -> RunTimeline:
    """The timeline of a run from its ledger row and steps (those with a start and an end, but
    the ``ignored`` tasks: the one drawing it)."""
    left_out = set(ignored)
    spans = [
        (step.task_id, as_utc(step.started_at), as_utc(step.ended_at), step.state or "")
        for step in steps
        if step.started_at is not None and step.ended_at is not None and step.task_id not in left_out
    ]
    known = [when for _, start, end, _ in spans for when in (start, end) if when is not None]
    if not known:
        return RunTimeline(stages=())
    origin = min(known)

    def minutes(when: datetime | None) -> float:
        assert when is not None
        return (when - origin).total_seconds() / 60.0

    def span(start: datetime | None, end: datetime | None) -> tuple[float, float] | None:
        start, end = as_utc(start), as_utc(end)
        return (minutes(start), minutes(end)) if start is not None and end is not None else None

    stages = tuple(
        sorted(
            ((task, minutes(start), minutes(end), state) for task, start, end, state in spans),
            key=lambda s: s[1],
        )
    )
    billed = [
        (minutes(piece.started_at), minutes(piece.ended_at or piece.started_at))
        for piece in run.billed_spans or ()
    ]
    return RunTimeline(
        stages=stages,
        billed=union(billed),
        held=span(run.cluster_started_at, run.cluster_ended_at),
        trained=span(run.train_started_at, run.train_ended_at),
        idle_share=idle_share(run.chip_hours, run.busy_chip_hours),
        resume_loss=run.resume_loss,
    )


def union(spans: Iterable[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Overlapping spans joined (when any of the machines ran), in order."""
    joined: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if joined and start <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(joined[-1][1], end))
        else:
            joined.append((start, end))
    return tuple(joined)


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=_DPI, layout="constrained")


def run_curves_figure(curves: RunCurves, timeline: RunTimeline | None = None) -> Figure:
    """Two panels: mean reward by step (before, evaluations, after) and train loss by step; with a
    timeline, a third below them: the stages, the TPU's billed spans (its machines' clocks), the
    capacity held, and the part that trained."""
    with_timeline = timeline is not None and not timeline.empty
    figure = _figure(10, 8 if with_timeline else 4)
    if with_timeline:
        grid = figure.add_gridspec(2, 2)
        reward_axes, loss_axes = figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1])
        assert timeline is not None
        _draw_timeline(figure.add_subplot(grid[1, :]), timeline)
    else:
        reward_axes, loss_axes = figure.subplots(1, 2)
    figure.suptitle(curves.run_id, fontsize="medium")

    reward_axes.set_title("Mean reward")
    reward_axes.set_xlabel("step")
    points = curves.reward_points
    if points:
        steps, values = zip(*points, strict=True)
        reward_axes.plot(steps, values, marker="o", color="tab:green", label=REWARD_METRIC)
        for step, value, label in _reward_labels(curves):
            # "before" sits at the left edge and "after" at the right: each label runs inwards, and
            # the margins keep it inside the axes (clear of the y ticks and of the title).
            inwards = "left" if label == "before" else "right"
            reward_axes.annotate(
                f"{label} {value:.3g}",
                (step, value),
                textcoords="offset points",
                xytext=(4 if inwards == "left" else -4, 6),
                ha=inwards,
            )
        reward_axes.margins(x=0.05, y=0.3)
    else:
        reward_axes.text(
            0.5,
            0.5,
            (curves.no_reward_reason or "no reward recorded").replace(": ", ":\n", 1),
            ha="center",
            va="center",
            wrap=True,
            transform=reward_axes.transAxes,
        )
    reward_axes.grid(True, alpha=0.3)

    loss_axes.set_title("Train loss")
    loss_axes.set_xlabel("step")
    if curves.loss:
        steps, values = zip(*curves.loss, strict=True)
        loss_axes.plot(steps, values, color="tab:blue", label=LOSS_METRIC)
    else:
        loss_axes.text(0.5, 0.5, "no loss recorded", ha="center", va="center", transform=loss_axes.transAxes)
    loss_axes.grid(True, alpha=0.3)
    return figure


def _draw_timeline(axes: Any, timeline: RunTimeline) -> None:
    share = "-" if timeline.idle_share is None else f"{timeline.idle_share:.0%}"
    title = f"Stages and TPU time (idle {share} of the billed time"
    loss = timeline.resume_loss
    if loss is not None and loss.resumes:
        lost = "" if loss.seconds_lost is None else f", {loss.seconds_lost / 60:.1f} min"
        title += f"; training resumed {loss.resumes}x, {loss.steps_lost} steps{lost} lost"
    axes.set_title(title + ")")
    axes.set_xlabel("minutes from the first stage's start")
    if timeline.held is not None:
        axes.axvspan(*timeline.held, facecolor="none", edgecolor="tab:red", hatch="//", alpha=0.3,
                     label="TPU capacity held (its tasks)")  # fmt: skip
    for index, (start, end) in enumerate(timeline.billed):
        label = "TPU billed (machines' clocks)" if index == 0 else None
        axes.axvspan(start, end, color="tab:red", alpha=0.15, label=label)
    if timeline.trained is not None:
        axes.axvspan(*timeline.trained, color="tab:green", alpha=0.3, label="TPU training")
    colours = {"success": "tab:blue", "failed": "tab:red", "upstream_failed": "tab:orange"}
    for row, (_task, start, end, state) in enumerate(timeline.stages):
        axes.barh(row, max(end - start, 0.01), left=start, color=colours.get(state, "tab:gray"), height=0.6)
    axes.set_yticks(range(len(timeline.stages)), [task for task, *_ in timeline.stages], fontsize="small")
    axes.invert_yaxis()
    if timeline.billed or timeline.held is not None or timeline.trained is not None:
        # outside the data, right of the bars (the last stages end at the right edge, where a legend
        # inside would cover them); the constrained layout makes room for it
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", borderaxespad=0.0)
    axes.grid(True, axis="x", alpha=0.3)


def _reward_labels(curves: RunCurves) -> list[tuple[int, float, str]]:
    labels = []
    if curves.before is not None:
        labels.append((0, curves.before, "before"))
    if curves.after is not None:
        labels.append((curves.final_step, curves.after, "after"))
    return labels


@dataclass(frozen=True)
class TrendSeries:
    """One model's runs, oldest first: mean reward before and after training (None when missing)."""

    model: str
    run_ids: tuple[str, ...] = ()
    started_at: tuple[datetime | None, ...] = ()
    before: tuple[float | None, ...] = ()
    after: tuple[float | None, ...] = ()

    @property
    def runs(self) -> int:
        """How many runs the series holds."""
        return len(self.run_ids)


def reward_trend_series(rows: Iterable[Mapping[str, Any]]) -> list[TrendSeries]:
    """Group ``RunLedger.reward_trend`` rows (ordered by model, then oldest first) by model."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(str(row["model"]), []).append(row)
    return [
        TrendSeries(
            model=model,
            run_ids=tuple(str(row["run_id"]) for row in runs),
            started_at=tuple(row.get("started_at") for row in runs),
            before=tuple(_maybe_float(row.get("pre_mean_reward")) for row in runs),
            after=tuple(_maybe_float(row.get("post_mean_reward")) for row in runs),
        )
        for model, runs in grouped.items()
    ]


def _maybe_float(value: Any) -> float | None:
    return None if value is None else float(value)


# The time axis of the reward trend: the runs' span and a margin of 8% of it each side, at least
# TREND_MIN_MARGIN (one run, or runs started together, would otherwise get matplotlib's default
# span of a singular date range: years).
TREND_MARGIN_SHARE = 0.08
TREND_MIN_MARGIN = timedelta(minutes=30)


def trend_time_limits(times: Sequence[float]) -> tuple[float, float]:
    """The x-axis limits (matplotlib date numbers, in days) that hold ``times`` with a margin."""
    first, last = min(times), max(times)
    margin = max((last - first) * TREND_MARGIN_SHARE, TREND_MIN_MARGIN / timedelta(days=1))
    return first - margin, last + margin


def reward_trend_figure(series: Sequence[TrendSeries], title: str | None = None) -> Figure:
    """Mean reward before (hollow marker) and after (filled) training of every run, at the run's
    start time, one colour per model; a line joins each run's before to its after, so the gain shows
    with a single run too. Runs without a start time are left out; a missing value is no marker.

    The time axis spans the runs (:func:`trend_time_limits`). ``title``: none by default (a page
    shows the picture under its own heading); ``tpu-rl runs --plot`` names its PNG."""
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num
    from matplotlib.lines import Line2D

    figure = _figure(10, 4.5)
    axes = figure.subplots()
    if title:
        axes.set_title(title)
    axes.set_xlabel("run start (UTC)")
    axes.set_ylabel("mean reward")
    drawn: list[tuple[str, str]] = []  # (model, colour)
    every_time: list[float] = []
    for index, one in enumerate(series):
        colour = f"C{index % 10}"
        when = [as_utc(moment) for moment in one.started_at]
        runs = [
            (float(date2num(moment)), before, after)
            for moment, before, after in zip(when, one.before, one.after, strict=True)
            if moment is not None
        ]
        if not runs:
            continue
        drawn.append((one.model, colour))
        times = [moment for moment, _, _ in runs]
        every_time.extend(times)
        axes.plot(
            times, _nan([b for _, b, _ in runs]), linestyle="none", marker="o", markersize=7,
            markerfacecolor="white", markeredgecolor=colour, label=f"{one.model} before",
        )  # fmt: skip
        axes.plot(
            times, _nan([a for _, _, a in runs]), linestyle="none", marker="o", markersize=7,
            color=colour, label=f"{one.model} after",
        )  # fmt: skip
        for moment, before, after in runs:
            if before is not None and after is not None:
                axes.annotate(
                    "", (moment, after), (moment, before),
                    arrowprops={"arrowstyle": "->", "color": colour, "lw": 1.2},
                )  # fmt: skip
    if not drawn:
        axes.text(
            0.5, 0.5, "no run with a reward in the ledger", ha="center", va="center", transform=axes.transAxes
        )
    else:
        locator = AutoDateLocator()
        axes.xaxis.set_major_locator(locator)
        axes.xaxis.set_major_formatter(ConciseDateFormatter(locator))
        axes.margins(y=0.15)
        axes.set_xlim(*trend_time_limits(every_time))
        models = [
            Line2D([], [], color=colour, marker="o", linestyle="-", label=model) for model, colour in drawn
        ]
        sides = [
            Line2D(
                [], [], color="black", marker="o", markerfacecolor="white", linestyle="none", label="before"
            ),
            Line2D([], [], color="black", marker="o", linestyle="none", label="after"),
        ]
        axes.legend(handles=[*models, *sides], loc="best", fontsize="small")
    axes.grid(True, alpha=0.3)
    return figure


def _nan(values: Sequence[float | None]) -> list[float]:
    return [math.nan if value is None else value for value in values]


def figure_png(figure: Figure) -> bytes:
    """The figure as PNG bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=_DPI, facecolor="white")
    return buffer.getvalue()
