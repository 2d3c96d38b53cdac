"""The machine's speed at the interpreter work the suite does, so two ``make test`` summaries compare.

The suite is CPU-bound, and its CPU-seconds are a change's own cost only on the same machine: the
same commit took 1973 CPU-s of the legs on one session's 2-core machine and 3246 on another's.
This times a fixed pure-Python workload (bytecode loops, dicts, strings, JSON: what Airflow's
imports and parsing spend their time on), best of ``RUNS``, in CPU-seconds of this process.
``make test`` runs it before the legs start, while the machine is quiet, and prints the figure
beside the legs' times.
"""

from __future__ import annotations

import json
import sys
import time

RUNS = 3
ROUNDS = 100_000


def workload() -> int:
    """A fixed amount of interpreter work; its result is checked so nothing is optimised away."""
    total = 0
    table: dict[str, int] = {}
    for i in range(ROUNDS):
        key = f"task-{i % 97}-{i % 13}"
        table[key] = table.get(key, 0) + i
        text = json.dumps({"id": key, "n": i, "tags": [key, str(i)]})
        total += len(json.loads(text)["tags"][0]) + sum(range(i % 50))
    return total + len(table)


def best_cpu_seconds(runs: int = RUNS) -> float:
    """The least CPU time of ``runs`` runs of :func:`workload`."""
    times = []
    for _ in range(runs):
        start = time.process_time()
        workload()
        times.append(time.process_time() - start)
    return min(times)


def main() -> int:
    seconds = best_cpu_seconds()
    print(
        f"machine speed: the reference workload took {seconds:.2f} CPU-s (tools/machine_speed.py, best of {RUNS}; "
        "the legs' CPU-seconds scale with it)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
