"""Parse the log lines of MaxText's GRPO trainer (``maxtext.trainers.post_train.rl.train_rl``).

Formats, checked at the source (MaxText tag ``maxtext-v0.2.4``, tunix ``main`` of August 2026):

* ``train_rl.py`` (``max_logging.warning``, so absl level ``W``)::

      Pre RL Training: corr=12, total=40, accuracy=30.0%, partial_accuracy=35.0%,
          format_accuracy=90.0%, mean_reward=0.1234     (one line)
      Starting RL training...
      RL Training Completed Successfully!
      Post RL Training: corr=…, total=…, accuracy=…%, partial_accuracy=…%, format_accuracy=…%, mean_reward=…

  (the evaluation lines only when ``num_test_batches > 0``; ``mean_reward`` only since June 2026).
* ``rl/hooks.py`` every ``eval_interval`` outer steps::

      Intermediate Eval (step=10): corr=…, total=…, accuracy=…%, partial_accuracy=…%,
          format_accuracy=…%, mean_reward=…     (one line)

* tunix ``sft/peft_trainer.py`` (``logging.info``; steps are 1-based, printed one step late)::

      Train step 12 training loss: 0.012345  - training perplexity: 1.012422

* tunix ``rl/reshard.py``: ``Reshard finished in 3.21s``.

``corr`` is an int in the default ``eval_mode=pass`` and a float with ``eval_mode=pass_at_1``; the
percentages are Python float reprs (``33.33333333333333``) or ``0`` when nothing was evaluated.
Lines are matched anywhere, so absl headers (``W0822 10:00:00.123456 1401 train_rl.py:786]``),
``kubectl logs --timestamps`` / ``--prefix`` headers and Cloud Logging prefixes are all tolerated.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

EvalPhase = Literal["pre", "intermediate", "post"]

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?i:nan|inf)"


def _number(group: str) -> str:
    """A number, optionally wrapped the way numpy 2 reprs scalars (``np.float64(12.5)``)."""
    return rf"(?:np\.\w+\()?(?P<{group}>{_NUMBER})\)?"


_EVAL_RE = re.compile(
    r"(?P<label>Pre RL Training|Post RL Training|Intermediate Eval \(step=(?P<step>-?\d+)\)):\s*"
    rf"corr={_number('corr')},\s*total={_number('total')},\s*"
    rf"accuracy={_number('accuracy')}%,\s*partial_accuracy={_number('partial_accuracy')}%,\s*"
    rf"format_accuracy={_number('format_accuracy')}%"
    rf"(?:,\s*mean_reward={_number('mean_reward')})?"
)
_TRAIN_LOSS_RE = re.compile(
    rf"Train step (?P<step>\d+) training loss: (?P<loss>{_NUMBER})"
    rf"(?:\s+-\s+training perplexity: (?P<perplexity>{_NUMBER}))?"
)
_RESHARD_RE = re.compile(rf"Reshard finished in (?P<seconds>{_NUMBER})s")
_STARTED_RE = re.compile(r"Starting RL training\.\.\.")
_COMPLETED_RE = re.compile(r"RL Training Completed Successfully!")
# tunix's CheckpointManager.maybe_restore once it restored the newest committed step
# (google/tunix c4ec573 tunix/sft/checkpoint_manager.py l.292): the trainer resumes after it.
_RESTORED_RE = re.compile(r"Restored params from step: (?P<step>\d+) in")

_PHASE_BY_LABEL: dict[str, EvalPhase] = {"Pre RL Training": "pre", "Post RL Training": "post"}


@dataclass(frozen=True)
class EvalEvent:
    """One evaluation line: before training (pre), every ``eval_interval`` steps, or after (post)."""

    phase: EvalPhase
    step: int | None
    corr: int | float
    total: int
    accuracy: float
    partial_accuracy: float
    format_accuracy: float
    mean_reward: float | None

    def as_dict(self) -> dict[str, Any]:
        """The figures as a JSON-serialisable dict (non-finite floats become None)."""
        figures: dict[str, Any] = {
            "corr": _finite(self.corr),
            "total": self.total,
            "accuracy": _finite(self.accuracy),
            "partial_accuracy": _finite(self.partial_accuracy),
            "format_accuracy": _finite(self.format_accuracy),
            "mean_reward": _finite(self.mean_reward),
        }
        if self.phase == "intermediate":
            return {"step": self.step, **figures}
        return figures


@dataclass(frozen=True)
class TrainLossEvent:
    """``Train step N training loss: L`` from tunix's trainer."""

    step: int
    loss: float
    perplexity: float | None


@dataclass(frozen=True)
class ReshardEvent:
    """``Reshard finished in S s``: trainer weights copied to the vLLM sampler (once per step)."""

    seconds: float


@dataclass(frozen=True)
class TrainingStartedEvent:
    """``Starting RL training...``: pre-training evaluation is over, the training loop begins."""


@dataclass(frozen=True)
class TrainingCompletedEvent:
    """``RL Training Completed Successfully!``: the training loop returned."""


@dataclass(frozen=True)
class RestoredEvent:
    """``Restored params from step: N in S seconds``: the trainer resumed from checkpoint step N."""

    step: int


LogEvent = (
    EvalEvent | TrainLossEvent | ReshardEvent | TrainingStartedEvent | TrainingCompletedEvent | RestoredEvent
)


def _to_number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _finite(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return value


def _parse_eval(match: re.Match[str]) -> EvalEvent:
    label = match["label"]
    phase: EvalPhase = _PHASE_BY_LABEL.get(label, "intermediate")
    reward = match["mean_reward"]
    return EvalEvent(
        phase=phase,
        step=int(match["step"]) if match["step"] is not None else None,
        corr=_to_number(match["corr"]),
        total=int(_to_number(match["total"])),
        accuracy=float(match["accuracy"]),
        partial_accuracy=float(match["partial_accuracy"]),
        format_accuracy=float(match["format_accuracy"]),
        mean_reward=float(reward) if reward is not None else None,
    )


def parse_log_line(line: str) -> LogEvent | None:
    """Return the event a single log line reports, or None for any other line."""
    if match := _EVAL_RE.search(line):
        return _parse_eval(match)
    if match := _TRAIN_LOSS_RE.search(line):
        perplexity = match["perplexity"]
        return TrainLossEvent(
            step=int(match["step"]),
            loss=float(match["loss"]),
            perplexity=float(perplexity) if perplexity is not None else None,
        )
    if match := _RESHARD_RE.search(line):
        return ReshardEvent(seconds=float(match["seconds"]))
    if _STARTED_RE.search(line):
        return TrainingStartedEvent()
    if _COMPLETED_RE.search(line):
        return TrainingCompletedEvent()
    if match := _RESTORED_RE.search(line):
        return RestoredEvent(step=int(match["step"]))
    return None


class TrainingLogTracker:
    """Accumulates what a trainer's log says so far; fed line by line while the log is followed.

    Steps are keyed, so a line seen twice (a log stream re-read after a reconnect) does not count
    twice, except for ``reshard_count``, which counts lines.
    """

    def __init__(self) -> None:
        self.pre: EvalEvent | None = None
        self.post: EvalEvent | None = None
        self._intermediate: dict[int, EvalEvent] = {}
        self._losses: dict[int, TrainLossEvent] = {}
        self.reshard_count = 0
        self.started = False
        self.completed = False
        self.resumed_from_step: int | None = None

    def feed(self, line: str) -> list[LogEvent]:
        """Record the events in ``line`` (a chunk holding several lines is split) and return them."""
        events: list[LogEvent] = []
        for single_line in line.splitlines() or [line]:
            event = parse_log_line(single_line)
            if event is None:
                continue
            self._record(event)
            events.append(event)
        return events

    def _record(self, event: LogEvent) -> None:
        if isinstance(event, EvalEvent):
            if event.phase == "pre":
                self.pre = event
            elif event.phase == "post":
                self.post = event
            elif event.step is not None:
                self._intermediate[event.step] = event
        elif isinstance(event, TrainLossEvent):
            self._losses[event.step] = event
        elif isinstance(event, ReshardEvent):
            self.reshard_count += 1
        elif isinstance(event, TrainingStartedEvent):
            self.started = True
        elif isinstance(event, TrainingCompletedEvent):
            self.completed = True
        elif isinstance(event, RestoredEvent):
            self.resumed_from_step = event.step

    @property
    def last_step(self) -> int | None:
        """Highest training step a loss or intermediate-eval line has reported, None before the first."""
        steps = [*self._losses, *self._intermediate]
        return max(steps) if steps else None

    @property
    def intermediate(self) -> list[EvalEvent]:
        """Intermediate evaluations in step order."""
        return [self._intermediate[step] for step in sorted(self._intermediate)]

    @property
    def losses(self) -> list[TrainLossEvent]:
        """Training losses in step order."""
        return [self._losses[step] for step in sorted(self._losses)]

    def progress_text(self, total_steps: int) -> str:
        """Short progress for a task log or UI note, e.g. ``step 12/50``."""
        return f"step {self.last_step or 0}/{total_steps}"

    @classmethod
    def restore(cls, metrics: dict[str, Any] | None) -> TrainingLogTracker:
        """A tracker holding what :meth:`metrics` returned (a trigger resumed after a restart)."""
        tracker = cls()
        if not metrics:
            return tracker

        def evaluation(phase: EvalPhase, figures: dict[str, Any] | None) -> EvalEvent | None:
            if not figures:
                return None
            return EvalEvent(
                phase=phase,
                step=figures.get("step"),
                corr=corr if isinstance(corr := figures.get("corr"), int) else _nan_if_none(corr),
                total=int(figures.get("total") or 0),
                accuracy=_nan_if_none(figures.get("accuracy")),
                partial_accuracy=_nan_if_none(figures.get("partial_accuracy")),
                format_accuracy=_nan_if_none(figures.get("format_accuracy")),
                mean_reward=figures.get("mean_reward"),
            )

        tracker.pre = evaluation("pre", metrics.get("pre"))
        tracker.post = evaluation("post", metrics.get("post"))
        for figures in metrics.get("intermediate") or []:
            event = evaluation("intermediate", figures)
            if event is not None and event.step is not None:
                tracker._intermediate[int(event.step)] = event
        for item in metrics.get("loss") or []:
            step = int(item["step"])
            tracker._losses[step] = TrainLossEvent(step, _nan_if_none(item.get("loss")), None)
        tracker.reshard_count = int(metrics.get("reshard_count") or 0)
        tracker.started = bool(metrics.get("started"))
        tracker.completed = bool(metrics.get("completed"))
        resumed = metrics.get("resumed_from_step")
        tracker.resumed_from_step = int(resumed) if isinstance(resumed, int) else None
        return tracker

    def metrics(self) -> dict[str, Any]:
        """Everything seen so far as a JSON-serialisable dict (non-finite floats become None)."""
        return {
            "pre": self.pre.as_dict() if self.pre else None,
            "post": self.post.as_dict() if self.post else None,
            "intermediate": [event.as_dict() for event in self.intermediate],
            "loss": [{"step": event.step, "loss": _finite(event.loss)} for event in self.losses],
            "last_step": self.last_step,
            "started": self.started,
            "completed": self.completed,
            "reshard_count": self.reshard_count,
            "resumed_from_step": self.resumed_from_step,
        }
