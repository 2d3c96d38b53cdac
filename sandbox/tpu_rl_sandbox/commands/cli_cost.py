"""``tpu-rl-sandbox bench`` section 6: what one call of a fake CLI costs in CPU.

The suite runs the fake ``gcloud``/``gcluster`` thousands of times (each started by a ``<root>/bin``
shim), so their start-up is a large share of its CPU. A fresh sandbox; each typical command run
``calls`` times through its shim as the provider's hooks run it (the sandbox's environment, stdout
and stderr to /dev/null); the CPU of each call is its process's and its waited-for children's
(``wait4``), the ``sh`` shim and its ``date`` included, plus what the sandbox's call server spent
meanwhile (its own and its reaped children's CPU in ``/proc``: the forked child that ran a ``gcloud``
(or ``gcluster job``)
call, :mod:`tpu_rl_sandbox.clis.call_server`). Beside them the floor: the interpreter started bare
(``-S``) and with its site (the venv's ``.pth`` files). The modules column is how many modules the
call's own processes import (``-X importtime``'s lines, one run; a served call's modules were
imported by the server once). ``--cli-cost-only`` runs
this section alone; ``--cli-calls`` sets how many calls per command.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tpu_rl_sandbox.clis import call_server
from tpu_rl_sandbox.commands.lifecycle import sandbox_down, sandbox_up

# Typical calls of the suite's operator tests, as ``(label, argv)``; argv[0] is a tool in the
# sandbox's bin/ or, for the floor, the interpreter. The operator tests' calls.jsonl (2026-12-06):
# most gcloud calls are the HF token secret's (versions list, IAM policy, describe, create),
# ``auth list``/``configure-docker``, buckets; most gcluster calls ``job list`` and ``job submit``.
PROBE_ZONE = "us-east5-b"
FAKE_COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gcloud version", ("gcloud", "version")),
    ("gcloud auth list", ("gcloud", "auth", "list")),
    ("gcloud secrets versions list (absent)", ("gcloud", "secrets", "versions", "list", "cli-cost-probe")),
    ("gcloud config get-value project", ("gcloud", "config", "get-value", "project")),
    ("gcloud storage ls", ("gcloud", "storage", "ls")),
    (
        "gcloud compute instances describe (absent)",
        ("gcloud", "compute", "instances", "describe", "cli-cost-probe", f"--zone={PROBE_ZONE}"),
    ),
    (
        "gcloud container clusters list",
        ("gcloud", "container", "clusters", "list", f"--location={PROBE_ZONE[:-2]}"),
    ),
    ("gcloud bad flag (usage error)", ("gcloud", "storage", "ls", "--no-such-flag")),
    ("gcluster --version", ("gcluster", "--version")),
    ("gcluster deploy --help", ("gcluster", "deploy", "--help")),
    ("gcluster job list (no cluster)", ("gcluster", "job", "list")),
    ("kubectl version --client (sh stub)", ("kubectl", "version", "--client")),
)
FLOOR_COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("python -S -c pass (floor)", (sys.executable, "-S", "-c", "pass")),
    ("python -c pass (with site)", (sys.executable, "-c", "pass")),
)


@dataclass(frozen=True)
class CallCost:
    """``calls`` runs of one command: CPU and wall milliseconds per call, its exit code, modules."""

    label: str
    cpu_ms: list[float]
    wall_ms: list[float]
    exit_code: int
    modules: int | None

    @property
    def median_cpu_ms(self) -> float:
        return statistics.median(self.cpu_ms)

    @property
    def median_wall_ms(self) -> float:
        return statistics.median(self.wall_ms)


def server_cpu_ms(server_pid: int | None) -> float:
    """The call server's CPU so far, its reaped children's (the calls it ran) included; 0 without one."""
    if server_pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{server_pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime, stime, cutime, cstime: fields 14-17 of proc(5), 12-15 after the command's ")"
    return sum(int(value) for value in fields[11:15]) * 1000 / os.sysconf("SC_CLK_TCK")


def run_once(
    argv: Sequence[str], env: Mapping[str, str], server_pid: int | None = None
) -> tuple[float, float, int]:
    """One call: its CPU ms (user + system, with its waited-for children, and what the sandbox's call
    server spent on it), wall ms, exit code."""
    served_before = server_cpu_ms(server_pid)
    start = time.monotonic()
    process = subprocess.Popen(
        list(argv),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = (time.monotonic() - start) * 1000
    served = server_cpu_ms(server_pid) - served_before
    return (usage.ru_utime + usage.ru_stime) * 1000 + served, wall, process.returncode


def imported_modules(argv: Sequence[str], env: Mapping[str, str]) -> int | None:
    """How many modules one call imports (``PYTHONPROFILEIMPORTTIME``'s lines); None for no Python."""
    traced = {**env, "PYTHONPROFILEIMPORTTIME": "1"}
    result = subprocess.run(list(argv), env=traced, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    return len(lines) - 1 if lines else None  # the first line is the header


def measure(
    commands: Sequence[tuple[str, Sequence[str]]],
    env: Mapping[str, str],
    calls: int,
    server_pid: int | None = None,
) -> list[CallCost]:
    """Each command ``calls`` times, interleaved round by round so a load change hits all alike."""
    samples: dict[str, list[tuple[float, float, int]]] = {label: [] for label, _ in commands}
    for _ in range(calls):
        for label, argv in commands:
            samples[label].append(run_once(argv, env, server_pid))
    return [
        CallCost(
            label=label,
            cpu_ms=[cpu for cpu, _, _ in samples[label]],
            wall_ms=[wall for _, wall, _ in samples[label]],
            exit_code=samples[label][-1][2],
            modules=imported_modules(argv, env),
        )
        for label, argv in commands
    ]


def cost_lines(costs: Sequence[CallCost], calls: int) -> list[str]:
    """The section's table: per command, median CPU and wall ms per call, exit code, modules."""
    width = max(len(cost.label) for cost in costs)
    lines = [
        f"7. Fake CLI calls: CPU per call, median of {calls} (wait4: the shim, the interpreter, its children;"
        " the call server's child)",
        f"   {'command':<{width}}  {'CPU ms':>7}  {'wall ms':>7}  {'exit':>4}  {'modules':>7}",
    ]
    for cost in costs:
        modules = "-" if cost.modules is None else str(cost.modules)
        lines.append(
            f"   {cost.label:<{width}}  {cost.median_cpu_ms:7.1f}  {cost.median_wall_ms:7.1f}  "
            f"{cost.exit_code:>4}  {modules:>7}"
        )
    return lines


def bench_cli_cost(calls: int, root: Path | None = None) -> list[str]:
    """Section 6 in a fresh sandbox (``root``, else a temporary folder), stopped afterwards."""
    with tempfile.TemporaryDirectory(prefix="tpu-rl-cli-cost-") as scratch:
        info = sandbox_up(root or Path(scratch) / "sandbox")
        try:
            env = {**os.environ, **info.env, "CLOUDSDK_CORE_PROJECT": "sandbox-project"}
            commands = [
                (label, (str(info.bin_dir / argv[0]), *argv[1:])) for label, argv in FAKE_COMMANDS
            ] + [(label, tuple(argv)) for label, argv in FLOOR_COMMANDS]
            server = json.loads((info.root / call_server.INFO_FILE).read_text())["pid"]
            return cost_lines(measure(commands, env, calls, int(server)), calls)
        finally:
            sandbox_down(info.root)
