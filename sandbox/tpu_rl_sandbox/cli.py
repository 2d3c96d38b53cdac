"""``tpu-rl-sandbox``: the local sandbox (``up``/``down``/``env``), the demo and the benchmarks."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tpu_rl_sandbox.commands.bench import add_bench_arguments, run_bench_command
from tpu_rl_sandbox.commands.demo import add_demo_arguments, run_demo_command
from tpu_rl_sandbox.commands.lifecycle import add_sandbox_subcommands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpu-rl-sandbox", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_sandbox_subcommands(sub)
    demo = sub.add_parser("demo", help="run the GKE pipeline end to end in the local sandbox")
    add_demo_arguments(demo)
    demo.set_defaults(func=run_demo_command)
    bench = sub.add_parser("bench", help="benchmarks: DAG parse time, orchestration overhead, worker slot")
    add_bench_arguments(bench)
    bench.set_defaults(func=run_bench_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
