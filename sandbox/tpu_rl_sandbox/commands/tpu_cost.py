"""The bench's TPU cost of a run (section 4): real minutes from the sandbox's scaled seconds, the
tutorials' flow on the same stage durations, and the prices of docs/tpu-prices.md.

Pure arithmetic, no Airflow: the bench feeds it the ledger's billed and trained seconds.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow_provider_tpu_rl.ledger.billing import billed_chip_seconds, spans_from_json
from airflow_provider_tpu_rl.ledger.records import idle_share
from airflow_provider_tpu_rl.ledger.schema import DEFAULT_SQLITE_FILE
from tpu_rl_sandbox.world.timescale import (
    CAPACITY_MINUTES,
    CONVERT,
    COPY,
    EXPORT,
    INSTALL,
    PULL,
    TRAIN,
    stage_real_minutes,
)

# The capacities section 4 prices, in the order it prints them; on-demand is what the tutorials'
# flow is compared at.
CAPACITIES = ("on-demand", "spot", "flex-start")
ON_DEMAND = CAPACITIES[0]
DEFAULT_PRICE_TABLE = Path("docs/tpu-prices.md")
# A row of the price table: | TPU | capacity | USD per chip-hour | read on | source | how direct |
_ROW = re.compile(
    r"^\|\s*(?P<tpu>v\w+)\s*\|\s*(?P<capacity>[\w-]+)\s*\|\s*(?P<usd>[0-9.]+)\s*\|(?P<rest>.*)\|\s*$"
)


@dataclass(frozen=True)
class Price:
    """One price of the table: USD per chip-hour, when it was read, and how directly."""

    capacity: str
    usd_per_chip_hour: float
    read_on: str
    source: str
    how_direct: str

    @property
    def read_from_its_source(self) -> bool:
        """The table read it on its source page (not derived, not second-hand)."""
        return self.how_direct.strip().lower().startswith("states")


def read_price_table(path: Path, tpu: str = "v6e") -> dict[str, Price]:
    """The prices of ``tpu`` in the Markdown table of ``path`` (docs/tpu-prices.md), by capacity.
    ValueError when a capacity of :data:`CAPACITIES` has no row."""
    prices: dict[str, Price] = {}
    for line in path.read_text().splitlines():
        match = _ROW.match(line.strip())
        if match is None or match["tpu"] != tpu:
            continue
        cells = [cell.strip() for cell in match["rest"].split("|")]
        if len(cells) != 3:
            raise ValueError(f"{path}: a {tpu} row needs 6 cells: {line.strip()}")
        read_on, source, how_direct = cells
        prices[match["capacity"]] = Price(match["capacity"], float(match["usd"]), read_on, source, how_direct)
    missing = [capacity for capacity in CAPACITIES if capacity not in prices]
    if missing:
        raise ValueError(f"{path} has no {tpu} price for {', '.join(missing)}")
    return prices


def real_minutes(sandbox_seconds: float, minute_seconds: float) -> float:
    """Real minutes of a span the sandbox played at ``minute_seconds`` seconds per real minute."""
    if minute_seconds <= 0:
        raise ValueError("the time scale is off: sandbox seconds stand for no real minutes")
    return sandbox_seconds / minute_seconds


def cost_usd(minutes: float, chips: int, usd_per_chip_hour: float) -> float:
    """The TPU cost of ``chips`` chips billed for ``minutes`` real minutes."""
    return minutes / 60.0 * chips * usd_per_chip_hour


def _capacity(what: str, overrides: Mapping[str, float] | None) -> float:
    return float((overrides or {}).get(what, CAPACITY_MINUTES[what]))


def _stage(stage: str, model: str, overrides: Mapping[str, float] | None) -> float:
    minutes = stage_real_minutes(stage, model, overrides)
    if minutes is None:
        raise ValueError(f"the time scale has no {stage} duration for {model}")
    return minutes


def tutorial_gke_minutes(
    model: str,
    stages: Mapping[str, float] | None = None,
    capacity: Mapping[str, float] | None = None,
) -> float:
    """Real minutes the tutorials' GKE flow bills its TPU nodes on the same durations: the cluster
    deploy creates the TPU pool, whose node VMs bill from their start (their boot to Ready); the
    conversion, the tutorials' first job on the TPU slice, runs the workload image there (the shared
    reference's workloads, step 7: "HF → MaxText conversion as a gcluster job on the TPU slice"), so
    the nodes first pull it (``pull``, the estimate the sandbox's GKE pull uses); then conversion,
    training and export on the slice, to the teardown. Its drain lasts as GKE drains a pool (the
    running pods' largest grace period, :func:`~tpu_rl_sandbox.world.timescale.drain_real_minutes`):
    at the teardown the tutorials' jobs have finished, no pod runs, so none. The nodes' STOPPING
    bills nothing, as for the pipeline."""
    return (
        _capacity("tpu_node_ready", capacity)
        + _stage(PULL, model, stages)
        + _stage(CONVERT, model, stages)
        + _stage(TRAIN, model, stages)
        + _stage(EXPORT, model, stages)
    )  # no drain: at the teardown the tutorials' jobs have all finished (drain_real_minutes of none)


def tutorial_tpu_vm_minutes(
    model: str,
    stages: Mapping[str, float] | None = None,
    capacity: Mapping[str, float] | None = None,
) -> float:
    """Real minutes the tutorials' TPU VM flow bills its TPU VM on the same durations: from its start
    (its create's PROVISIONING and STAGING bill nothing) through its guest's boot until ssh answers
    (``guest_boot``), the install from sources, the conversion, training, the copy of the checkpoint
    and the export, all on the TPU VM, to its delete (its STOPPING bills nothing)."""
    return _capacity("guest_boot", capacity) + sum(
        _stage(stage, model, stages) for stage in (INSTALL, CONVERT, TRAIN, COPY, EXPORT)
    )


@dataclass(frozen=True)
class RealRunEstimate:
    """What a pipeline run would bill and train on its TPU at the seeds' durations, real minutes."""

    billed_minutes: float
    trained_minutes: float
    parts: Mapping[str, float]  # what the billed minutes are made of, in billing order

    @property
    def idle_share(self) -> float:
        return 1.0 - self.trained_minutes / self.billed_minutes if self.billed_minutes > 0 else 0.0


def pipeline_gke_estimate(
    model: str,
    stages: Mapping[str, float] | None = None,
    capacity: Mapping[str, float] | None = None,
) -> RealRunEstimate:
    """The GKE pipeline's TPU pool at the seeds' durations, by the estimates the bench's time scale
    plays: the pool is created once the converted checkpoint is committed, its nodes bill from their
    boot (``tpu_node_ready``), pull the workload image (``pull``), train (``train``), and the pool is
    destroyed once the actor checkpoint is committed (no drain: the training job has ended; the
    nodes' STOPPING bills nothing). Airflow's own seconds between those steps are left out: the bench,
    which runs the pipeline on the time scale, measures them too."""
    parts = {
        "node boot": _capacity("tpu_node_ready", capacity),
        "image pull": _stage(PULL, model, stages),
        "training": _stage(TRAIN, model, stages),
    }
    return RealRunEstimate(sum(parts.values()), parts["training"], parts)


@dataclass(frozen=True)
class CostLine:
    """The cost of one TPU span at each capacity's price."""

    minutes: float
    chips: int
    usd: Mapping[str, float]  # capacity -> USD


def costs(minutes: float, chips: int, prices: Mapping[str, Price]) -> CostLine:
    """``minutes`` of ``chips`` chips at every capacity of :data:`CAPACITIES`."""
    return CostLine(
        minutes, chips, {c: cost_usd(minutes, chips, prices[c].usd_per_chip_hour) for c in CAPACITIES}
    )


def ratios_to_tutorial(run: CostLine, tutorial: CostLine) -> dict[str, float]:
    """The run's cost at each capacity's price against the tutorials' flow at on-demand."""
    base = tutorial.usd[ON_DEMAND]
    return {capacity: (usd / base if base > 0 else float("nan")) for capacity, usd in run.usd.items()}


def price_caveats(prices: Mapping[str, Price]) -> list[str]:
    """One line per price the table did not read on its source, saying how it got it."""
    return [
        f"{p.capacity} ${p.usd_per_chip_hour:.2f}/chip-hour: {p.how_direct} (read {p.read_on})"
        for capacity in CAPACITIES
        if not (p := prices[capacity]).read_from_its_source
    ]


def ledger_tpu_time(airflow_home: Path, dag_id: str) -> dict[str, Any] | None:
    """The newest run of ``dag_id`` as the product's ledger recorded it: the TPU billed by the
    machines' clocks (its RUNNING spans, per chip), the training span, the capacity held (the create
    task's start to the delete task's end), from the ledger file Airflow's default connection uses.

    The billed seconds are the spans' own, without the one-minute minimum a real machine is billed:
    the sandbox's seconds stand for its time scale's minutes, where that minimum is no minute."""
    path = airflow_home / DEFAULT_SQLITE_FILE
    if not path.exists():
        return None
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.row_factory = sqlite3.Row
        row = db.execute(
            "SELECT chips, cluster_started_at, cluster_ended_at, train_started_at, train_ended_at,"
            " billed_spans_json FROM runs WHERE dag_id = ? ORDER BY recorded_at DESC LIMIT 1",
            (dag_id,),
        ).fetchone()
    if row is None:
        return None

    def seconds(start: str | None, end: str | None) -> float | None:
        if not start or not end:
            return None
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()

    spans = spans_from_json(json.loads(row["billed_spans_json"])) if row["billed_spans_json"] else None
    chip_seconds = None if spans is None else billed_chip_seconds(spans, minimum=0.0)
    billed = None if chip_seconds is None or not row["chips"] else chip_seconds / row["chips"]
    trained = seconds(row["train_started_at"], row["train_ended_at"])
    return {
        "chips": row["chips"],
        "billed_seconds": billed,
        "trained_seconds": trained,
        "held_seconds": seconds(row["cluster_started_at"], row["cluster_ended_at"]),
        "idle_share": idle_share(billed, trained),
    }
