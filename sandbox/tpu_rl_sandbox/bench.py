"""``tpu-rl-sandbox bench``: parse time, orchestration overhead and worker-slot time, measured here.

1. Parse time of each DAG file in a fresh process (``DagBag`` fill time and process wall time),
   next to an equivalent DAG built from the google provider's stock operators, in the same run.
2. The sandbox GKE pipeline end to end: wall time minus the simulated work (the jobs' own run time
   as ``gcluster job list`` reports it) = orchestration overhead, per task.
3. Worker-slot time of the ``train`` task during a 120-second simulated training: the time it
   spends executing in a worker, against the time the training took (the rest is deferred).

A benchmark, not a test: it prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.render.command import Command
from tpu_rl_sandbox.control import sandbox_down, sandbox_env, sandbox_up
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, gke_pipeline_from_conf

PARSE_PROBE = textwrap.dedent(
    """
    import json, sys, time
    started = time.perf_counter()
    from airflow.dag_processing.dagbag import DagBag
    imported = time.perf_counter()
    bag = DagBag(dag_folder=sys.argv[1])
    filled = time.perf_counter()
    print(json.dumps({"errors": len(bag.import_errors), "dags": len(bag.dags),
                      "import_airflow": imported - started, "fill": filled - imported,
                      "wall": filled - started}))
    """
)

# The same pipeline shape (13 tasks, the same kind of params) from stock google-provider operators.
STOCK_DAG = textwrap.dedent(
    """
    from datetime import datetime
    from airflow.providers.common.compat.sdk import DAG, Param, TriggerRule, task
    from airflow.providers.google.cloud.operators.gcs import GCSCreateBucketOperator
    from airflow.providers.google.cloud.operators.kubernetes_engine import (
        GKECreateClusterOperator, GKEDeleteClusterOperator, GKEStartPodOperator)
    from airflow.providers.google.cloud.sensors.gcs import GCSObjectExistenceSensor

    with DAG("stock_equivalent", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
             params={k: Param("x", type="string", title=k, description=k, section="s")
                     for k in ["model", "project", "region", "zone", "cluster_name", "bucket", "reservation",
                               "image", "compute_type", "topology", "hf_model_path", "run_name",
                               "hf_token_conn_id", "hf_token_secret", "authorized_cidr"]}):
        @task
        def validate():
            return {}

        def pod(task_id):
            return GKEStartPodOperator(task_id=task_id, project_id="p", location="us-east5", cluster_name="c",
                                       name=task_id, namespace="default", image="busybox", cmds=["true"],
                                       deferrable=True)

        v = validate()
        bucket = GCSCreateBucketOperator(task_id="ensure_bucket", bucket_name="b")
        deploy = GKECreateClusterOperator(task_id="deploy_cluster", project_id="p", location="us-east5",
                                          body={"name": "c", "node_pools": [{"name": "p", "initial_node_count": 1}]})
        token, convert, train, export = pod("sync_hf_token"), pod("convert"), pod("train"), pod("export")
        sensors = [GCSObjectExistenceSensor(task_id=f"wait_{n}", bucket="b", object=n, deferrable=True)
                   for n in ("converted", "actor", "hf")]
        destroy = GKEDeleteClusterOperator(task_id="destroy_cluster", project_id="p", location="us-east5",
                                           cluster_name="c").as_teardown(setups=deploy)

        @task(trigger_rule=TriggerRule.ALL_DONE)
        def record_run():
            return None

        @task(trigger_rule=TriggerRule.ONE_FAILED)
        def watcher():
            raise RuntimeError

        v >> bucket >> deploy >> token >> convert >> sensors[0] >> train >> sensors[1] >> export >> sensors[2]
        sensors[2] >> destroy >> record_run() >> watcher()
    """
)


def _parse_once(path: Path, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", PARSE_PROBE, str(path)], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    if result["errors"] or not result["dags"]:
        raise RuntimeError(f"{path} did not parse: {out.stderr[-2000:]}")
    return result


def bench_parse(dags_dir: Path, repeats: int) -> list[str]:
    env = {**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    with tempfile.TemporaryDirectory() as tmp:
        stock = Path(tmp) / "stock_equivalent.py"
        stock.write_text(STOCK_DAG)
        env["AIRFLOW_HOME"] = tmp
        files = [*sorted(dags_dir.glob("tpu_rl_*.py")), stock]
        medians: dict[str, tuple[float, float]] = {}
        for path in files:
            runs = [_parse_once(path, env) for _ in range(repeats)]
            medians[path.name] = (
                statistics.median(r["fill"] for r in runs),
                statistics.median(r["wall"] for r in runs),
            )
    stock_fill = medians["stock_equivalent.py"][0]
    lines = [
        f"1. DAG parse time, fresh process, median of {repeats} (DagBag fill = import of the file + DAG build)"
    ]
    lines.append(f"   {'file':<32}{'fill':>9}{'process':>10}{'vs stock':>10}")
    for name, (fill, wall) in medians.items():
        lines.append(f"   {name:<32}{fill:8.3f}s{wall:9.3f}s{fill / stock_fill:9.2f}x")
    return lines


_LINE = re.compile(r"^(\S+Z) .*")


def _stamp(line: str) -> float | None:
    match = _LINE.match(line)
    if not match:
        return None
    try:
        return datetime.fromisoformat(match.group(1).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def worker_slot_seconds(log_lines: list[str], task_id: str) -> tuple[float, float]:
    """(seconds the task ran in a worker, seconds from its first start to its end) from the log."""
    ti_id = None
    for line in log_lines:
        found = re.search(
            rf"running task <TaskInstance: \S+\.{re.escape(task_id)} .* ti_id=([0-9a-f-]+)>", line
        )
        if found:
            ti_id = found.group(1)
            break
    if ti_id is None:
        raise RuntimeError(f"no task {task_id} in the log")
    running_since: float | None = None
    held = 0.0
    first: float | None = None
    last: float | None = None
    for line in log_lines:
        if f"ti_id={ti_id}" not in line:
            continue
        stamp = _stamp(line)
        if stamp is None:
            continue
        if "Task started" in line:
            running_since = stamp
            first = stamp if first is None else first
        elif "Task instance state updated" in line and "new_state=" in line and running_since is not None:
            held += stamp - running_since
            running_since = None
            last = stamp
    if first is None or last is None:
        raise RuntimeError(f"task {task_id} did not start and end in the log")
    return held, last - first


def _job_seconds(env: dict[str, str], conf: dict[str, Any]) -> dict[str, float]:
    """Each job's own run time (creation → completion) as the sandbox's `gcluster job list` says."""
    pipeline = gke_pipeline_from_conf(conf)
    command: Command = gke.job_list(
        pipeline.cluster.project, pipeline.cluster.cluster_name, pipeline.cluster.region
    )
    out = subprocess.run(
        [str(Path(env["PATH"].split(os.pathsep)[0]) / "gcluster"), *command.argv[1:]],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    from airflow_provider_tpu_rl.hooks.jobs import parse_job_list

    seconds: dict[str, float] = {}
    for job in parse_job_list((out.stdout + out.stderr).splitlines()):
        if job.created_at and job.completed_at:
            seconds[job.name] = (job.completed_at - job.created_at).total_seconds()
    return seconds


def bench_pipeline(dags_dir: Path, train_seconds: float, step_seconds: float) -> list[str]:
    batches = max(1, round(train_seconds / step_seconds))
    conf = {
        "project": "tpu-rl-bench",
        "cluster_name": "tpu-rl-bench",
        "bucket": "tpu-rl-bench-bucket",
        "num_batches": batches,
        "keep_cluster": True,  # keep the jobs listable afterwards; the sandbox is wiped at the end
    }
    with tempfile.TemporaryDirectory() as tmp:
        root, home = Path(tmp) / "sandbox", Path(tmp) / "airflow"
        sandbox_up(root)
        try:
            env = {
                **os.environ,
                **sandbox_env(root),
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_FOLDER": str(dags_dir),
                "AIRFLOW__TPU_RL__POLL_INTERVAL": "1",
                "TPU_RL_SANDBOX_STEP_SECONDS": str(step_seconds),
            }
            airflow = str(Path(sys.executable).with_name("airflow"))
            subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, check=True)
            started = time.monotonic()
            run = subprocess.run(
                [airflow, "dags", "test", GKE_DAG_ID, "-c", json.dumps(conf)],
                env=env,
                capture_output=True,
                text=True,
            )
            wall = time.monotonic() - started
            log = (run.stdout + run.stderr).splitlines()
            if run.returncode != 0:
                raise RuntimeError("the pipeline failed:\n" + "\n".join(log[-40:]))
            jobs = _job_seconds(env, conf)
            held, span = worker_slot_seconds(log, "train")
        finally:
            sandbox_down(root, wipe=True)
    work = sum(jobs.values())
    tasks = 13
    return [
        f"2. Sandbox GKE pipeline, {batches} training steps x {step_seconds}s (poll interval 1 s)",
        f"   wall time of `airflow dags test`       {wall:8.1f}s",
        f"   simulated work (3 jobs, job list)      {work:8.1f}s  {json.dumps({k: round(v) for k, v in jobs.items()})}",
        f"   orchestration overhead                  {wall - work:8.1f}s  = {(wall - work) / tasks:.1f}s per task ({tasks} tasks)",
        "3. Worker slot held by `train` while the job trains",
        f"   train task, first start to end          {span:8.1f}s",
        f"   of which executing in a worker          {held:8.1f}s  ({held / span:.1%}; deferred the rest)",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpu-rl-sandbox bench", description=__doc__)
    add_bench_arguments(parser)
    return run_bench_command(parser.parse_args(argv))


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dags-folder", type=Path, default=Path("dags"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--train-seconds", type=float, default=120.0)
    parser.add_argument("--step-seconds", type=float, default=2.0)


def run_bench_command(args: argparse.Namespace) -> int:
    dags = args.dags_folder.resolve()
    print(f"tpu-rl-sandbox bench on {os.cpu_count()} cores, Python {sys.version.split()[0]}", flush=True)
    for line in bench_parse(dags, args.repeats):
        print(line, flush=True)
    for line in bench_pipeline(dags, args.train_seconds, args.step_seconds):
        print(line, flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
