"""``tpu-rl-sandbox bench`` section 5: an ordered capacity against a run that waits for its one kind.

A sandbox world on the bench's time scale where the TPU VM's reservation is full and flex-start is
out of stock in the zone (the settings ``reservations`` and ``tpu_capacity_out``). The fallback run
is ``create_vm``'s fall-through as it runs: each kind's ``gcloud compute instances create`` (the
argv ``render.tpu_vm.create_vm`` gives the kind) through the sandbox's gcloud, refused or created,
timed. The waiting run asks for the reservation alone: its create is refused until the reservation
has room again (``--stockout-minutes``), and Airflow retries the task at ``[tpu_rl] retry_delay``
doubling (about: Airflow's exponential backoff, capped at 30 minutes) ``[tpu_rl] retries`` times;
once a try lands after the stockout, its create is timed the same way. Both then train the TPU VM
model's training minutes (``timescale.STAGE_MINUTES``), costed at the kind that served
(docs/tpu-prices.md: the reservation at the on-demand price, the seeds' reservations have no public
price).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_tpu_rl.render import tpu_vm
from airflow_provider_tpu_rl.spec.cluster import ON_DEMAND, RESERVATION, TpuVmSpec
from tpu_rl_sandbox.clis.gcloud.app import Gcloud
from tpu_rl_sandbox.commands import tpu_cost
from tpu_rl_sandbox.commands.lifecycle import sandbox_down, sandbox_env, sandbox_up
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import DEFAULT_RESERVATIONS, update_settings
from tpu_rl_sandbox.world.timescale import STAGE_MINUTES, TRAIN

ZONE = "us-east5-b"
RESERVATION_NAME = "res-8"
MODEL = "llama3.1-8b-Instruct"
FALLBACK = ("reservation", "flex-start", "spot")
CHIPS = 8
MAX_RETRY_DELAY_S = 30 * 60.0


def retry_times(retry_delay_s: float, retries: int) -> list[float]:
    """When each try of a task starts, seconds after the first: the delay doubles, capped."""
    times, at, delay = [0.0], 0.0, retry_delay_s
    for _ in range(retries):
        at += min(delay, MAX_RETRY_DELAY_S)
        times.append(at)
        delay *= 2
    return times


def first_try_after(times: Sequence[float], free_at_s: float) -> float | None:
    """The start of the first try at or after ``free_at_s`` (None: every try is refused)."""
    return next((t for t in times if t >= free_at_s), None)


@dataclass(frozen=True)
class Attempt:
    kind: str
    ok: bool
    seconds: float
    said: str


def _vm(project: str, kind: str, name: str) -> TpuVmSpec:
    return TpuVmSpec(
        project=project,
        zone=ZONE,
        vm_name=name,
        reservation=RESERVATION_NAME if kind == RESERVATION else "",
        bucket=f"bkt-{project}",
        capacity=kind,
    )


def _create(root: Path, project: str, kind: str, name: str) -> Attempt:
    argv = list(tpu_vm.create_vm(_vm(project, kind, name)).argv[1:])
    err: list[str] = []
    started = time.monotonic()
    code = Gcloud(
        SandboxLayout(root.resolve()), sandbox_env(root), lambda: b"", lambda _: None, err.append
    ).run(argv)
    # the reason gcloud lists after its ERROR line (" - <message>"), on one line
    text = "".join(err)
    said = (text.split("\n - ", 1)[1] if "\n - " in text else text).splitlines()[0].strip() if text else ""
    return Attempt(kind, code == 0, time.monotonic() - started, said)


def _world(root: Path, minute_seconds: float, reservation_vms: int, out: Mapping[str, str]) -> None:
    reservations = {key: dict(value) for key, value in DEFAULT_RESERVATIONS.items()}
    reservations[f"{ZONE}/{RESERVATION_NAME}"]["count"] = reservation_vms
    update_settings(
        SandboxLayout(root.resolve()),
        minute_seconds=minute_seconds,
        reservations=reservations,
        tpu_capacity_out=dict(out),
    )


def bench_fallback(
    minute_seconds: float,
    prices: Mapping[str, tpu_cost.Price],
    *,
    stockout_minutes: float,
    retry_delay_s: float = 120.0,
    retries: int = 3,
) -> list[str]:
    """Section 5's lines (see the module's docstring)."""
    train_minutes = STAGE_MINUTES[MODEL][TRAIN]
    lines = [
        f"5. Capacity that falls back (TPU VM, {MODEL}, v6e-8 in {ZONE}; 1 real minute = {minute_seconds:g}s):",
        f"   the reservation {RESERVATION_NAME} full and flex-start out of stock for {stockout_minutes:g} real minutes",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "sandbox"
        sandbox_up(root)
        try:
            _world(root, minute_seconds, 0, {f"{ZONE}/flex-start": "stockout"})
            attempts: list[Attempt] = []
            for kind in FALLBACK:
                attempts.append(_create(root, "proj-fallback", kind, "vm-fallback"))
                if attempts[-1].ok:
                    break
            served = attempts[-1]
            seconds = sum(a.seconds for a in attempts)
            for attempt in attempts[:-1]:
                lines.append(
                    f"   fallback: {attempt.kind} refused in {attempt.seconds:.1f}s: {attempt.said[:140]}"
                )
            if served.ok:
                lines += _trained(
                    f"fallback {list(FALLBACK)}", served.kind, seconds / minute_seconds, train_minutes, prices
                )
            else:
                lines.append(f"   fallback {list(FALLBACK)}: every kind refused after {seconds:.1f}s")
            tries = retry_times(retry_delay_s, retries)
            landed = first_try_after(tries, stockout_minutes * 60.0)
            if landed is None:
                lines.append(
                    f"   waiting for {RESERVATION}: its {len(tries)} tries (retry_delay {retry_delay_s:g}s doubling, "
                    f"retries {retries}) end at {tries[-1] / 60:.0f} real minutes, inside the stockout: the run fails, "
                    "no training"
                )
            else:
                _world(root, minute_seconds, 1, {})
                created = _create(root, "proj-waiting", RESERVATION, "vm-waiting")
                lines += _trained(
                    f"waiting for {RESERVATION}",
                    RESERVATION,
                    landed / 60.0 + created.seconds / minute_seconds,
                    train_minutes,
                    prices,
                )
        finally:
            sandbox_down(root, wipe=True)
    return lines


def _trained(
    title: str, kind: str, to_tpu_minutes: float, train_minutes: float, prices: Mapping[str, tpu_cost.Price]
) -> list[str]:
    price = prices[ON_DEMAND if kind == RESERVATION else kind].usd_per_chip_hour
    cost = tpu_cost.cost_usd(train_minutes, CHIPS, price)
    return [
        f"   {title}: {kind} RUNNING after {to_tpu_minutes:.1f} real minutes (time to training, before its "
        f"install); {train_minutes:g} minutes of training at ${price:.2f}/chip-hour = ${cost:.2f}"
    ]
