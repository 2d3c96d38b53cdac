"""``tpu-rl runs``: the newest pipeline runs from the ledger, as a table; ``--failed``: the tasks
that failed in them; ``--plot``: the reward trend across runs, as a PNG."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from airflow_provider_tpu_rl.ledger.records import RunSummary, idle_share, served_capacity

UNKNOWN = "-"
DEFAULT_PLOT_FILE = "tpu-rl-reward-trend.png"
TREND_TITLE = "Mean reward across runs"  # the PNG's own title (the dashboard's heading names it there)
RUNS_COLUMNS = (
    "RUN",
    "MODEL",
    "STATE",
    "DURATION",
    "MEAN REWARD",
    "PROMOTED",
    "BILLED CHIP-H",
    "TRAINED",
    "IDLE",
    "RESUMES",
    "COST $",
    "EXPORT",
)
# The billed CPU minutes of the TPU VM's boot image bake (its bake VM): a column before EXPORT
# only when a listed run baked.
BAKE_COLUMN = "BAKE CPU-MIN"
# The capacity kind that served the TPUs and how many kinds were refused before it: a column after
# STATE only when a listed run's ordered capacity fell through.
CAPACITY_COLUMN = "CAPACITY"
# The GKE cluster a run ran on (PROJECT/LOCATION/NAME) and whether it created, was kept or named it
# (created, kept, existing): a column right after STATE only when a listed run has one.
CLUSTER_COLUMN = "CLUSTER"
# Why the janitor closed a row its run never closed (abandoned, or failed): a last column only when
# a listed run has one.
REASON_COLUMN = "REASON"
FAILED_COLUMNS = ("RUN", "MODEL", "TASK", "STATE", "TRY", "JOB", "ENDED")


def add_runs_subcommand(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``runs`` to a ``tpu-rl`` subparsers object; the parser's ``func`` is :func:`run_runs_command`."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "runs",
        help="list recent pipeline runs from the run ledger",
        description=(
            "List recent pipeline runs: state, duration, mean reward before and after training, "
            "TPU chip-hours, the CPU minutes a TPU VM run's boot image bake billed (BAKE CPU-MIN, "
            "when a listed run baked) and the Hugging Face export. The ledger is Airflow connection "
            "tpu_rl_ledger, or $AIRFLOW_HOME/tpu_rl_ledger.db when that is not defined."
        ),
    )
    parser.add_argument("--model", default=None, help="only runs of this model (MaxText model_name)")
    parser.add_argument("--limit", type=_positive_int, default=20, help="at most this many runs (default 20)")
    parser.add_argument(
        "--conn-id", default="tpu_rl_ledger", help="Airflow connection of the ledger (default tpu_rl_ledger)"
    )
    parser.add_argument(
        "--failed",
        action="store_true",
        help="instead of the runs table, list the failed and upstream_failed tasks of the newest "
        "runs: task, last try, Kubernetes job and when it ended (--limit counts tasks)",
    )
    parser.add_argument(
        "--plot",
        action="store_true",
        help="instead of the table, draw the mean reward before and after training across runs into "
        "a PNG (every run with a reward, oldest first; needs matplotlib, the 'plot' extra)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"where --plot writes the PNG (default {DEFAULT_PLOT_FILE})",
    )
    parser.set_defaults(func=run_runs_command)
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


@contextlib.contextmanager
def quiet_connection_lookups() -> Iterator[None]:
    """No "Retrieving connection ..." lines in the command's output.

    Airflow 2's ``BaseHook.get_connection`` logs each lookup at INFO, onto stdout with Airflow's
    default logging config (Airflow 3 logs it at DEBUG).
    """
    logger = logging.getLogger("airflow.hooks.base")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def run_runs_command(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the runs table; 0 on success, 1 when the ledger cannot be read."""
    with quiet_connection_lookups():
        return _runs_command(args, out, err)


def _runs_command(args: argparse.Namespace, out: TextIO | None, err: TextIO | None) -> int:
    from airflow_provider_tpu_rl.ledger.hook import RunLedger

    out = out or sys.stdout
    err = err or sys.stderr
    ledger = RunLedger(args.conn_id)
    failed = getattr(args, "failed", False)
    if failed and getattr(args, "plot", False):
        print("tpu-rl runs: --failed and --plot cannot go together", file=err)
        return 2
    if getattr(args, "plot", False):
        return run_plot_command(args, ledger, out, err)
    if getattr(args, "output", None) is not None:
        print("tpu-rl runs: --output goes with --plot", file=err)
        return 2
    if failed:
        return run_failed_command(args, ledger, out, err)
    return _print_rows(
        args, ledger, out, err, read=ledger.latest_runs, nothing="No runs", table=format_runs_table
    )


def _print_rows(
    args: argparse.Namespace,
    ledger: Any,
    out: TextIO,
    err: TextIO,
    *,
    read: Callable[..., Sequence[Any]],
    nothing: str,
    table: Callable[[Sequence[Any]], str],
) -> int:
    """Read rows (``model``/``limit`` from the arguments) and print their table; 0, or 1 on an error."""
    try:
        rows = read(model=args.model, limit=args.limit)
    except Exception as error:
        print(f"tpu-rl runs: cannot read the run ledger ({ledger.conn_id}): {error}", file=err)
        return 1
    if not rows:
        which = f" of model {args.model}" if args.model else ""
        print(f"{nothing}{which} in the ledger ({ledger.location}).", file=out)
        return 0
    print(table(rows), file=out)
    return 0


def format_duration(seconds: float | None) -> str:
    """``1h05m``, ``12m30s``, ``45s``; ``-`` when unknown."""
    if seconds is None:
        return UNKNOWN
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def format_reward(pre: float | None, post: float | None, num_test_batches: float | None = None) -> str:
    """``0.12→0.34``; ``-`` for a side that is unknown, ``-`` alone when both are, and why when
    the run evaluated nothing (``- (num_test_batches=0, evaluation off)``)."""
    if num_test_batches is not None and num_test_batches <= 0 and pre is None and post is None:
        return f"{UNKNOWN} (num_test_batches=0, evaluation off)"
    if pre is None and post is None:
        return UNKNOWN
    left = UNKNOWN if pre is None else f"{pre:.2f}"
    right = UNKNOWN if post is None else f"{post:.2f}"
    return f"{left}→{right}"


def format_chip_hours(chip_hours: float | None) -> str:
    """One decimal; ``-`` when unknown."""
    return UNKNOWN if chip_hours is None else f"{chip_hours:.1f}"


def format_share(share: float | None) -> str:
    """A share as a whole percentage; ``-`` when unknown."""
    return UNKNOWN if share is None else f"{share * 100:.0f}%"


def format_cost(usd: float | None) -> str:
    """Dollars with cents; ``-`` when unknown."""
    return UNKNOWN if usd is None else f"{usd:,.2f}"


def format_resumes(resumes: int | None, steps_lost: int | None, seconds_lost: float | None) -> str:
    """``1 (2 steps, 4m10s lost)``: the times training resumed after an earlier attempt and what
    that cost; ``0``; ``-`` when unknown."""
    if resumes is None:
        return UNKNOWN
    if not resumes:
        return "0"
    steps = UNKNOWN if steps_lost is None else f"{steps_lost} step{'' if steps_lost == 1 else 's'}"
    return f"{resumes} ({steps}, {format_duration(seconds_lost)} lost)"


def format_promoted(promoted: bool | None) -> str:
    """``yes``, ``not promoted`` (the promotion gate held the model back) or ``-`` (the gate never
    ran)."""
    return UNKNOWN if promoted is None else ("yes" if promoted else "not promoted")


def format_tpu_time(
    billed: float | None, busy: float | None, usd: float | None, held: float | None = None
) -> str:
    """``billed 4.3 TPU chip-hours, trained 1.2 (idle 72%), est. $11.61``, billed by the machines'
    clocks; with ``held``: ``; capacity held 4.9`` (the create task's start to the delete task's end)."""
    line = (
        f"billed {format_chip_hours(billed)} TPU chip-hours, trained {format_chip_hours(busy)} "
        f"(idle {format_share(idle_share(billed, busy))}), est. ${format_cost(usd)}"
    )
    return line if held is None else f"{line}; capacity held {format_chip_hours(held)}"


def format_cpu_minutes(seconds: float | None) -> str:
    """Billed CPU seconds as minutes, one decimal; ``-`` when none were billed or unknown."""
    return UNKNOWN if seconds is None or seconds <= 0 else f"{seconds / 60:.1f}"


def runs_columns(runs: Sequence[RunSummary]) -> tuple[str, ...]:
    """:data:`RUNS_COLUMNS`, with :data:`BAKE_COLUMN` before EXPORT when a run's bake billed CPU time,
    :data:`REASON_COLUMN` last when the janitor closed a listed run's row and :data:`CLUSTER_COLUMN`
    after STATE when a listed run ran on a GKE cluster."""
    columns: tuple[str, ...] = RUNS_COLUMNS
    if any(run.bake_billed_seconds for run in runs):
        export = RUNS_COLUMNS.index("EXPORT")
        columns = (*RUNS_COLUMNS[:export], BAKE_COLUMN, *RUNS_COLUMNS[export:])
    if any(run.end_reason for run in runs):
        columns = (*columns, REASON_COLUMN)
    if any(run.settings.get("capacity_attempts") for run in runs):
        state = columns.index("STATE") + 1
        columns = (*columns[:state], CAPACITY_COLUMN, *columns[state:])
    if any(run.gke_cluster for run in runs):
        state = columns.index("STATE") + 1
        columns = (*columns[:state], CLUSTER_COLUMN, *columns[state:])
    return columns


def format_capacity(settings: Mapping[str, Any]) -> str:
    """The kind that served, and the kinds refused before it: ``spot (2 refused)``."""
    served = served_capacity(settings) or UNKNOWN
    refused = len(settings.get("capacity_attempts") or ())
    return f"{served} ({refused} refused)" if refused else served


def runs_table_rows(runs: Sequence[RunSummary]) -> list[tuple[str, ...]]:
    """The table's cells, one tuple per run, in :func:`runs_columns` order. A run refused before
    anything was spent has no values past STATE: its row ends with why (one cell spanning them)."""
    columns = runs_columns(runs)
    bake, reason = BAKE_COLUMN in columns, REASON_COLUMN in columns
    capacity = CAPACITY_COLUMN in columns
    cluster = CLUSTER_COLUMN in columns
    return [
        (run.run_id, run.model or UNKNOWN, run.state or UNKNOWN, run.refusal)
        if run.refusal
        else (
            run.run_id,
            run.model or UNKNOWN,
            run.state or UNKNOWN,
            *((run.cluster_text or UNKNOWN,) if cluster else ()),
            *((format_capacity(run.settings),) if capacity else ()),
            format_duration(run.duration_seconds),
            format_reward(run.pre_mean_reward, run.post_mean_reward, run.num_test_batches),
            format_promoted(run.promoted),
            format_chip_hours(run.chip_hours),
            format_chip_hours(run.busy_chip_hours),
            format_share(run.idle_share),
            format_resumes(run.resumes, run.steps_lost, run.seconds_lost),
            format_cost(run.estimated_cost_usd),
            *((format_cpu_minutes(run.bake_billed_seconds),) if bake else ()),
            run.export_uri or UNKNOWN,
            *((run.end_reason or UNKNOWN,) if reason else ()),
        )
        for run in runs
    ]


def format_runs_table(runs: Sequence[RunSummary]) -> str:
    """A fixed-width table of runs, aligned columns separated by two spaces."""
    columns = runs_columns(runs)
    numbers = ("DURATION", "BILLED CHIP-H", "TRAINED", "IDLE", "COST $", BAKE_COLUMN)
    right_aligned = {columns.index(name) for name in numbers if name in columns}
    return _format_table(columns, runs_table_rows(runs), right_aligned)


def failed_table_rows(steps: Sequence[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """The cells of the ledger's ``failed_steps`` rows, in :data:`FAILED_COLUMNS` order."""
    return [
        (
            str(step["run_id"]),
            step.get("model") or UNKNOWN,
            str(step["task_id"]),
            step.get("state") or UNKNOWN,
            UNKNOWN if step.get("try_number") is None else str(step["try_number"]),
            step.get("job_name") or UNKNOWN,
            _format_time(step.get("ended_at")),
        )
        for step in steps
    ]


def format_failed_table(steps: Sequence[Mapping[str, Any]]) -> str:
    """A fixed-width table of failed tasks, aligned like the runs table."""
    return _format_table(FAILED_COLUMNS, failed_table_rows(steps), {FAILED_COLUMNS.index("TRY")})


def _format_time(value: datetime | None) -> str:
    return UNKNOWN if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _format_table(columns: tuple[str, ...], cells: Sequence[tuple[str, ...]], right_aligned: set[int]) -> str:
    """Aligned columns; a row shorter than ``columns`` ends with one cell that spans the rest
    (it takes no part in their widths)."""
    rows = [columns, *cells]
    full = [row for row in rows if len(row) == len(columns)]
    widths = [max(len(row[index]) for row in full) for index in range(len(columns))]
    lines = []
    for row in rows:
        last = len(row) - 1
        padded = [
            cell
            if index == last and len(row) < len(columns)
            else cell.rjust(widths[index])
            if index in right_aligned
            else cell.ljust(widths[index])
            for index, cell in enumerate(row)
        ]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def run_failed_command(args: argparse.Namespace, ledger: Any, out: TextIO, err: TextIO) -> int:
    """Print the failed tasks of the newest runs; 0 on success (also when none failed), 1 on an error."""
    return _print_rows(
        args,
        ledger,
        out,
        err,
        read=ledger.failed_steps,
        nothing="No failed tasks in the runs",
        table=format_failed_table,
    )


def run_plot_command(args: argparse.Namespace, ledger: Any, out: TextIO, err: TextIO) -> int:
    """Write the reward trend PNG; 0 on success (also when no run has a reward), 1 on an error."""
    from airflow_provider_tpu_rl.ledger.plots import (
        PLOT_EXTRA_HINT,
        figure_png,
        matplotlib_available,
        reward_trend_figure,
        reward_trend_series,
    )

    if not matplotlib_available():
        print(f"tpu-rl runs --plot: matplotlib is not installed; {PLOT_EXTRA_HINT}", file=err)
        return 1
    try:
        rows = ledger.reward_trend(model=args.model)
    except Exception as error:
        print(f"tpu-rl runs: cannot read the run ledger ({ledger.conn_id}): {error}", file=err)
        return 1
    if not rows:
        which = f" of model {args.model}" if args.model else ""
        print(
            f"No runs{which} with a mean reward in the ledger ({ledger.location}); no plot written.", file=out
        )
        return 0
    series = reward_trend_series(rows)
    output: Path = args.output or Path(DEFAULT_PLOT_FILE)
    try:
        output.write_bytes(figure_png(reward_trend_figure(series, title=TREND_TITLE)))
    except OSError as error:
        print(f"tpu-rl runs --plot: cannot write {output}: {error}", file=err)
        return 1
    models = ", ".join(one.model for one in series)
    print(f"Wrote the reward trend of {len(rows)} run(s) ({models}) to {output}", file=out)
    return 0
