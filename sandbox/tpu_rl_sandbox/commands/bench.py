"""``tpu-rl-sandbox bench``: parse time, orchestration overhead and worker-slot time, measured here.

1. Parse time of each DAG file in a fresh process (``DagBag`` fill time and process wall time),
   next to an equivalent DAG built from the google provider's stock operators, in the same run;
   the GKE pipeline's fill against the stock one's (goal: at most 0.30), and any heavy client
   library (GCS hook, storage/BigQuery clients, kubernetes, ...) a DAG file loads at parse time.
2. The sandbox GKE pipeline end to end: wall time minus the simulated cloud work (the jobs' own run
   time as the sandbox recorded it, and the time spent inside the fake ``gcloud``/``gcluster``
   processes, which stand for cloud API calls; their union) = orchestration overhead, per task; next to it a trivial
   DAG of the same shape (the real DAG's task ids, edges, setup/teardown flags, trigger rules and
   Params, every task a no-op Python task) run the same way right after it, whose whole wall time is
   overhead. Five rounds (each pipeline run in a fresh sandbox and Airflow home; the first trains
   ``--train-seconds``, the others 10 s); the overhead and the baseline are the medians of the rounds.
   The pipeline's overhead per task against the trivial DAG's: goal at most 1.5x. Each run reads
   its one DAG file (``--dagfile-path``); the trivial DAG without the Params is shown beside it.
3. Worker-slot time of the ``train`` task during a 120-second simulated training: the time it
   spends executing in a worker, against the time the training took (the rest is deferred).
4. TPU time and cost: each pipeline once with its stages lasting their real minutes on the time
   scale (``--minute-seconds``; any duration replaced with ``--stage-minutes``): TPU billed by the
   machines' clocks, training, the idle share and the idle real minutes, and the run's TPU cost at
   on-demand, spot and flex-start prices (docs/tpu-prices.md, ``--prices``) next to the tutorials'
   flow on the same durations. The GKE pipeline runs twice: its TPU node pool pulling the image
   whole, then streaming it (``image_repository``); each says which pull it played and which figure
   that is, estimated from what, and the two runs' idle TPU minutes stand side by side.
   ``--tpu-time-only`` runs this section alone.
5. Capacity that falls back: a world where the TPU VM's reservation is full and flex-start out of
   stock; the time to training and the training's cost of ``["reservation", "flex-start", "spot"]``
   against a run that waits for its reservation (``commands/fallback_bench.py``).
   ``--fallback-only`` runs this section alone.
6. A cluster the run does not own: the GKE pipeline's same training on an existing cluster (a
   platform team's, ``cluster_mode existing``) beside a create-mode run; the TPU billed and the wall
   time of each, and what the sandbox does not play (the cluster's deploy and teardown) from its
   stated source (``commands/existing_bench.py``). ``--existing-only`` runs this section alone.
7. The fake CLIs' cost: CPU milliseconds per call of typical ``gcloud``/``gcluster`` commands through
   their shims, beside the interpreter's floor (``commands/cli_cost.py``). ``--cli-cost-only`` runs
   this section alone (``--cli-calls`` per command).

A benchmark, not a test: it prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from airflow_provider_tpu_rl.spec import GKE_DAG_ID, TPU_VM_DAG_ID
from tpu_rl_sandbox.commands import cli_cost, fallback_bench, tpu_cost
from tpu_rl_sandbox.commands.lifecycle import (
    dags_test,
    migrated_airflow,
    sandbox_down,
    sandbox_up,
)
from tpu_rl_sandbox.commands.lifecycle import provider_on_the_scale as provider_on_the_scale
from tpu_rl_sandbox.commands.tpu_cost import ledger_tpu_time as ledger_tpu_time
from tpu_rl_sandbox.world.calls import read_calls
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import update_settings
from tpu_rl_sandbox.world.store import StateStore
from tpu_rl_sandbox.world.timescale import PULL, STREAM_PULL, split_minutes, stage_real_minutes

PARSE_FILL_GOAL = 0.30  # the GKE pipeline's DagBag fill, as a fraction of the stock equivalent's
OVERHEAD_RATIO_GOAL = 1.5  # the pipeline's orchestration overhead per task vs a trivial DAG's
# Rounds of section 2: each a pipeline run in a fresh sandbox, then the trivial DAGs. One run of either
# varies by ±10-20% here (a trivial DAG's wall from 9 to 16 s on a loaded machine); the overhead and
# the baselines are the medians of the rounds, five so that one slow run moves neither.
ROUNDS = 5
SHORT_TRAIN_SECONDS = 10.0  # the simulated training of every round but the first
# The share of billed TPU time that does not train, per pipeline (the TPU VM trains 10 minutes only,
# so its boot weighs more), and the run's cost against the tutorials' flow at on-demand: at the
# on-demand price, and at the cheaper of spot and flex-start.
GKE_IDLE_GOAL, TPU_VM_IDLE_GOAL = 0.10, 0.15
ON_DEMAND_COST_GOAL, DISCOUNTED_COST_GOAL = 0.5, 0.25
# Section 4's time scale: one real minute of a stage lasts this long in the sandbox. Airflow's own
# seconds per task (about 0.5-1 s here, seconds in a real deployment too) count as that many
# "minutes", so the idle share read here is an upper bound of a real run's.
DEFAULT_MINUTE_SECONDS = 2.0
GKE_DAG_FILE = f"{GKE_DAG_ID}.py"
STOCK_DAG_FILE = "stock_equivalent.py"
TRIVIAL_DAG_ID = f"{GKE_DAG_ID}_trivial_shape"

# Client libraries a DAG file must not load at parse time (they belong in execute/hooks/triggers).
HEAVY_MODULES = (
    "airflow.providers.google.cloud.hooks.gcs",
    "google.cloud.storage",
    "google.cloud.bigquery",
    "googleapiclient",
    "kubernetes",
    "aiohttp",
    "airflow.providers.common.sql.hooks.sql",
)

PARSE_PROBE = textwrap.dedent(
    """
    import json, sys, time
    started = time.perf_counter()
    try:
        from airflow.dag_processing.dagbag import DagBag
        options = {}
    except ImportError:  # Airflow 2, which also reads its example DAGs unless told not to
        from airflow.models.dagbag import DagBag
        options = {"include_examples": False}
    imported = time.perf_counter()
    bag = DagBag(dag_folder=sys.argv[1], **options)
    filled = time.perf_counter()
    heavy = [name for name in json.loads(sys.argv[2]) if name in sys.modules]
    errors = [str(error).strip().splitlines()[-1] for error in bag.import_errors.values()]
    print(json.dumps({"errors": len(bag.import_errors), "error": errors[0] if errors else None,
                      "dags": len(bag.dags), "heavy": heavy,
                      "import_airflow": imported - started, "fill": filled - imported,
                      "wall": filled - started}))
    """
)

# The real DAG's shape: task ids, upstream edges, setup/teardown flags, trigger rules.
SHAPE_PROBE = textwrap.dedent(
    """
    import json, sys
    try:
        from airflow.dag_processing.dagbag import DagBag
        options = {}
    except ImportError:  # Airflow 2, which also reads its example DAGs unless told not to
        from airflow.models.dagbag import DagBag
        options = {"include_examples": False}
    bag = DagBag(dag_folder=sys.argv[1], **options)
    if sys.argv[2] not in bag.dags:
        raise SystemExit(f"{sys.argv[2]} is not in {sys.argv[1]}: {bag.import_errors}")
    dag = bag.dags[sys.argv[2]]
    params = {name: dag.params.get_param(name) for name in dag.params}  # the Param objects
    print(json.dumps({
        "tasks": [
            {
                "task_id": t.task_id,
                "upstream": sorted(t.upstream_task_ids),
                "trigger_rule": str(getattr(t.trigger_rule, "value", t.trigger_rule)),
                "is_setup": bool(t.is_setup),
                "is_teardown": bool(t.is_teardown),
                "on_failure_fail_dagrun": bool(getattr(t, "on_failure_fail_dagrun", False)),
            }
            for t in dag.tasks
        ],
        "params": {
            name: {"default": p.value, "description": p.description, "schema": p.schema}
            for name, p in params.items()
        },
    }))
    """
)

# A DAG of the given shape whose every task is a no-op Python task (run in a worker, like a real one;
# an EmptyOperator would never reach a worker), with the real DAG's trigger form: Airflow validates
# every Param each time it serializes a task, a cost of the form, not of the tasks.
TRIVIAL_DAG = textwrap.dedent(
    """
    import json
    from datetime import datetime

    from airflow.providers.common.compat.sdk import DAG, Param
    from airflow.providers.standard.operators.python import PythonOperator

    SHAPE = json.loads({shape!r})


    def noop():
        return None


    with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
             default_args={{"owner": "bench", "retries": 0}},
             params={{name: Param(p["default"], description=p["description"], schema=p["schema"])
                     for name, p in SHAPE["params"].items()}}):
        tasks = {{}}
        for spec in SHAPE["tasks"]:
            op = PythonOperator(task_id=spec["task_id"], python_callable=noop, trigger_rule=spec["trigger_rule"])
            op.is_setup = spec["is_setup"]
            op.is_teardown = spec["is_teardown"]
            if spec["is_teardown"]:
                op.on_failure_fail_dagrun = spec["on_failure_fail_dagrun"]
            tasks[spec["task_id"]] = op
        for spec in SHAPE["tasks"]:
            for upstream in spec["upstream"]:
                tasks[upstream] >> tasks[spec["task_id"]]
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


class ParseError(RuntimeError):
    """A DAG file did not parse (an import error, or no DAG in it)."""


def _parse_once(path: Path, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", PARSE_PROBE, str(path), json.dumps(HEAVY_MODULES)],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    if out.returncode != 0:
        raise ParseError(f"the parse probe crashed: {out.stderr.strip().splitlines()[-1:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if result["errors"] or not result["dags"]:
        raise ParseError(result["error"] or "no DAG in the file")
    return result


def parse_env(airflow_home: str) -> dict[str, str]:
    return {**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW_HOME": airflow_home}


def bench_parse(dags_dir: Path, repeats: int) -> tuple[list[str], set[str]]:
    """The parse table, and the names of the files that parsed."""
    with tempfile.TemporaryDirectory() as tmp:
        stock = Path(tmp) / STOCK_DAG_FILE
        stock.write_text(STOCK_DAG)
        env = parse_env(tmp)
        files = [*sorted(dags_dir.glob("tpu_rl_*.py")), stock]
        medians: dict[str, tuple[float, float]] = {}
        heavy: dict[str, list[str]] = {}
        failed: dict[str, str] = {}
        for path in files:
            try:
                runs = [_parse_once(path, env) for _ in range(repeats)]
            except ParseError as err:
                failed[path.name] = str(err)
                continue
            medians[path.name] = (
                statistics.median(r["fill"] for r in runs),
                statistics.median(r["wall"] for r in runs),
            )
            heavy[path.name] = runs[-1]["heavy"]
    stock_fill = medians[STOCK_DAG_FILE][0]
    lines = [
        f"1. DAG parse time, fresh process, median of {repeats} (DagBag fill = import of the file + DAG build)",
        f"   {'file':<32}{'fill':>9}{'process':>10}{'vs stock':>10}",
    ]
    for name, (fill, wall) in medians.items():
        lines.append(f"   {name:<32}{fill:8.3f}s{wall:9.3f}s{fill / stock_fill:9.2f}x")
    for name, error in failed.items():
        lines.append(f"   {name:<32}  did not parse: {error[:200]}")
    if GKE_DAG_FILE in medians:
        ratio = medians[GKE_DAG_FILE][0] / stock_fill
        verdict = "met" if ratio <= PARSE_FILL_GOAL else "NOT met"
        lines.append(
            f"   {GKE_DAG_FILE} DagBag fill vs {STOCK_DAG_FILE}: "
            f"ratio {ratio:.2f} (goal ≤ {PARSE_FILL_GOAL:.2f}; {verdict})"
        )
    ours = {name: modules for name, modules in heavy.items() if name != STOCK_DAG_FILE}
    loaded = {name: modules for name, modules in ours.items() if modules}
    if loaded:
        for name, modules in loaded.items():
            lines.append(f"   heavy modules loaded while parsing {name}: {', '.join(modules)}")
    elif ours:
        lines.append(
            f"   heavy modules loaded while parsing tpu_rl_*.py: none (stock: {len(heavy[STOCK_DAG_FILE])})"
        )
    return lines, set(medians)


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


def _job_intervals(root: Path) -> dict[str, tuple[float, float]]:
    """Each job's own run (JobSet creation → completion), from the sandbox's job records: to the
    microsecond (``gcluster job list`` prints whole seconds, ±1 s of noise per job)."""
    intervals: dict[str, tuple[float, float]] = {}
    for job in StateStore(SandboxLayout(root)).read("jobs").values():
        if job.get("created_ts") is not None and job.get("completed_ts") is not None:
            intervals[str(job["name"])] = (float(job["created_ts"]), float(job["completed_ts"]))
    return intervals


def _call_intervals(root: Path, since: float, until: float) -> list[tuple[float, float]]:
    """The fake CLI calls made in ``[since, until]`` (each from its shim's start to its end)."""
    return [
        (float(c["start"]), float(c["end"]))
        for c in read_calls(SandboxLayout(root))
        if since <= float(c["start"]) <= until
    ]


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval (overlaps counted once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def dag_shape(dag_file: Path, dag_id: str, env: dict[str, str]) -> dict[str, Any]:
    """The real DAG's tasks (id, upstream ids, setup/teardown flags, trigger rule) and its Params
    (``tasks``, ``params``), loaded by DagBag."""
    out = subprocess.run(
        [sys.executable, "-c", SHAPE_PROBE, str(dag_file), dag_id], env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise ParseError(f"cannot load {dag_id} from {dag_file}: {out.stderr.strip()[-1000:]}")
    shape: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return shape


def write_trivial_dag(folder: Path, shape: dict[str, Any], with_form: bool = True) -> Path:
    """A DAG file of ``shape`` whose tasks do nothing (:data:`TRIVIAL_DAG_ID`), with the real DAG's
    Params unless ``with_form`` is false."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{TRIVIAL_DAG_ID}.py"
    if not with_form:
        shape = {**shape, "params": {}}
    path.write_text(TRIVIAL_DAG.format(shape=json.dumps(shape), dag_id=TRIVIAL_DAG_ID))
    return path


@dataclass(frozen=True)
class TpuTimeRun:
    """One pipeline of section 4: its DAG, its bench conf, its model, its idle goal and the
    tutorials' flow its cost is set against (real minutes from the stage and capacity durations)."""

    dag_id: str
    conf: dict[str, Any]
    model: str
    idle_goal: float
    tutorial_minutes: Callable[[str, Mapping[str, float], Mapping[str, float]], float]
    tutorial_flow: str


def tpu_time_lines(
    title: str,
    tpu: dict[str, Any] | None,
    *,
    idle_goal: float = TPU_VM_IDLE_GOAL,
    minute_seconds: float = DEFAULT_MINUTE_SECONDS,
) -> list[str]:
    """The bench's lines of TPU billed vs trained time, from the ledger, in sandbox seconds and in
    real minutes (sandbox seconds / ``minute_seconds``)."""
    if tpu is None or tpu["billed_seconds"] is None:
        return [f"{title}: the ledger recorded no billed span"]
    share = tpu["idle_share"]
    billed = tpu["billed_seconds"]
    trained = tpu["trained_seconds"]
    held = tpu.get("held_seconds")
    verdict = "" if share is None else ("; met" if share <= idle_goal else "; NOT met")

    def minutes(seconds: float | None) -> str:
        return "-" if seconds is None else f"{tpu_cost.real_minutes(seconds, minute_seconds):6.1f} real min"

    idle = None if trained is None else max(0.0, billed - trained)
    return [
        f"{title}, as the run ledger recorded it",
        f"   TPU billed (the machines' clocks)       {billed:8.1f}s  = {minutes(billed)}",
        f"   TPU training (the training job ran)     {(trained if trained is not None else float('nan')):8.1f}s  = {minutes(trained)}",
        f"   idle share of the billed time           {('-' if share is None else f'{share:.0%}'):>8}"
        f"  (goal ≤ {idle_goal:.0%}{verdict}); idle {minutes(idle).strip()}",
        f"   capacity held (create to delete task)   {(held if held is not None else float('nan')):8.1f}s  = {minutes(held)}",
    ]


def cost_lines(
    run: TpuTimeRun,
    tpu: dict[str, Any] | None,
    minute_seconds: float,
    prices: Mapping[str, tpu_cost.Price],
    stages: Mapping[str, float],
    capacity: Mapping[str, float],
) -> list[str]:
    """The run's estimated TPU cost at each capacity's price beside the tutorials' flow on the same
    durations at on-demand, and the ratios against the issue's goals."""
    if tpu is None or tpu["billed_seconds"] is None or not tpu.get("chips"):
        return ["   cost: the ledger recorded no billed span"]
    chips = int(tpu["chips"])
    ours = tpu_cost.costs(tpu_cost.real_minutes(tpu["billed_seconds"], minute_seconds), chips, prices)
    tutorial = tpu_cost.costs(run.tutorial_minutes(run.model, stages, capacity), chips, prices)
    ratios = tpu_cost.ratios_to_tutorial(ours, tutorial)
    discounted = min(ratios["spot"], ratios["flex-start"])
    header = "".join(f"{capacity:>12}" for capacity in tpu_cost.CAPACITIES)

    def usd(line: tpu_cost.CostLine) -> str:
        return "".join(f"{'$' + format(line.usd[c], '.2f'):>12}" for c in tpu_cost.CAPACITIES)

    def verdict(ratio: float, goal: float) -> str:
        return "met" if ratio <= goal else "NOT met"

    return [
        f"   estimated TPU cost of the run, {chips} chips               {header}",
        f"     this run: billed {ours.minutes:6.1f} real min               {usd(ours)}",
        f"     tutorials' flow: {tutorial.minutes:6.1f} real min               {usd(tutorial)}",
        f"       ({run.tutorial_flow})",
        "     this run / tutorials' flow at on-demand         "
        + "".join(f"{ratios[c]:>11.2f}x" for c in tpu_cost.CAPACITIES),
        f"     goals: on-demand ≤ {ON_DEMAND_COST_GOAL:.2f}x ({verdict(ratios['on-demand'], ON_DEMAND_COST_GOAL)}),"
        f" spot or flex-start ≤ {DISCOUNTED_COST_GOAL:.2f}x ({verdict(discounted, DISCOUNTED_COST_GOAL)})",
    ]


def task_seconds(airflow_home: Path, dag_id: str) -> dict[str, float]:
    """Each task's duration in the newest run of ``dag_id``, from Airflow's own database (the
    SQLite file of ``airflow dags test``), in the order the tasks started."""
    with contextlib.closing(sqlite3.connect(airflow_home / "airflow.db")) as db:
        rows = db.execute(
            "SELECT task_id, start_date, end_date FROM task_instance WHERE dag_id = ?"
            " AND run_id = (SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1)"
            " AND start_date IS NOT NULL AND end_date IS NOT NULL ORDER BY start_date",
            (dag_id, dag_id),
        ).fetchall()
    return {
        task: (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
        for task, start, end in rows
    }


# Where each pull figure comes from (world/timescale.py says it at length): the bench's words.
PULL_SOURCES: Final[Mapping[str, str]] = MappingProxyType(
    {
        PULL: "an estimate from the image's size (~10-12 GB compressed) and a registry in the same continent; no source states it",
        STREAM_PULL: (
            "an estimate: Google's 2021 launch blog's 'a couple of seconds (irrespective of container size)', "
            "GKE in general, not TPU nodes, plus an allowance for the remote reads of a workload that opens many "
            "files as it starts (GKE's image-streaming page, Limitations; no figure); the page also says a first "
            "pull may show no benefit"
        ),
    }
)


def image_pull_lines(pulls: list[dict[str, Any]]) -> list[str]:
    """The bench's lines on the TPU pool's image: streamed or pulled whole (and why), the real
    minutes the sandbox played and which figure that is, from the sandbox's ``image_pulls``."""
    if not pulls:
        return ["   the TPU node pool's image: no pull recorded"]
    lines = []
    for pull in pulls:
        how = "streamed" if pull["streamed"] else "pulled whole"
        gcfs = "enable_gcfs on" if pull.get("enable_gcfs") else "enable_gcfs off"
        lines += textwrap.wrap(
            f"the TPU node pool's image {how} ({gcfs}; {pull['reason']}): {pull['real_minutes']:.1f} real min, "
            f"timescale's {pull['stage']!r}: {PULL_SOURCES.get(pull['stage'], 'an estimate')}",
            width=100,
            initial_indent="   ",
            subsequent_indent="     ",
        )
    return lines


def image_pulls(root: Path) -> list[dict[str, Any]]:
    """The pulls the sandbox at ``root`` played (``machines/job_worker.py``)."""
    pulls: list[dict[str, Any]] = (
        StateStore(SandboxLayout(root.resolve())).read("image_pulls").get("pulls", [])
    )
    return pulls


def streaming_lines(idle: Mapping[str, float | None], stages: Mapping[str, float]) -> list[str]:
    """The GKE run's idle TPU minutes with the image pulled whole beside the streamed run's
    (``stages``: the stage minutes replaced)."""
    whole, streamed = idle.get(WHOLE_GKE_RUN), idle.get(STREAMED_GKE_RUN)
    if whole is None or streamed is None:
        return []
    return [
        f"   GKE idle TPU time: image pulled whole {whole:.1f} real min, streamed {streamed:.1f} real min"
        f" (the difference is the pull's two estimates, {stage_real_minutes(PULL, overrides=stages)} vs"
        f" {stage_real_minutes(STREAM_PULL, overrides=stages)} real min, and the runs' own noise)"
    ]


WHOLE_GKE_RUN: Final = "GKE (Qwen3-30B-A3B, v6e-32)"
STREAMED_GKE_RUN: Final = "GKE (Qwen3-30B-A3B, v6e-32), image streamed"
# The pipelines the TPU time is measured on, each with the conf of its bench run (the rest comes
# from the sandbox's [tpu_rl] defaults).
TPU_TIME_RUNS: dict[str, TpuTimeRun] = {
    WHOLE_GKE_RUN: TpuTimeRun(
        GKE_DAG_ID,
        {"project": "tpu-rl-bench", "cluster_name": "tpu-rl-bench", "bucket": "tpu-rl-bench-bucket"},
        "qwen3-30b-a3b",
        GKE_IDLE_GOAL,
        tpu_cost.tutorial_gke_minutes,
        "the TPU nodes from the cluster deploy to its teardown: node boot, image pull, convert, train, export",
    ),
    # The same run with its TPU node pool streaming the image (image_repository: the image copied
    # into the project's Artifact Registry first): the pull's estimate against the whole pull's.
    STREAMED_GKE_RUN: TpuTimeRun(
        GKE_DAG_ID,
        {
            "project": "tpu-rl-bench",
            "cluster_name": "tpu-rl-bench",
            "bucket": "tpu-rl-bench-bucket",
            "image_repository": "tpu-rl-bench-images",
        },
        "qwen3-30b-a3b",
        GKE_IDLE_GOAL,
        tpu_cost.tutorial_gke_minutes,
        "the TPU nodes from the cluster deploy to its teardown: node boot, image pull, convert, train, export",
    ),
    "TPU VM (Llama 3.1 8B, v6e-8)": TpuTimeRun(
        TPU_VM_DAG_ID,
        {"project": "tpu-rl-bench", "vm_name": "tpu-rl-bench", "bucket": "tpu-rl-bench-bucket"},
        "llama3.1-8b-Instruct",
        TPU_VM_IDLE_GOAL,
        tpu_cost.tutorial_tpu_vm_minutes,
        "the TPU VM from its create to its delete: its guest's boot, install from sources, convert, train, copy, export",
    ),
}


def parse_stage_minutes(text: str) -> dict[str, float]:
    """``--stage-minutes``: a JSON object of real minutes by stage or capacity duration; ValueError
    in one line (not JSON, not an object, an unknown key naming the known ones, a bad value)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON ({err.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object of minutes: {text!r}")
    stages, capacity = split_minutes(value)
    return {**stages, **capacity}


def _stage_minutes_argument(text: str) -> dict[str, float]:
    try:
        return parse_stage_minutes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def bench_tpu_time(
    dags_dir: Path,
    minute_seconds: float,
    step_seconds: float,
    stage_minutes: Mapping[str, float] | None = None,
    prices_path: Path = tpu_cost.DEFAULT_PRICE_TABLE,
) -> list[str]:
    """Section 4: each pipeline once, in a fresh sandbox whose stages last their real minutes x
    ``minute_seconds`` (the sandbox's time scale, ``stage_minutes`` replacing any duration); the
    ledger's TPU billed and training time, the idle share, the run's cost beside the tutorials'
    flow's, and every task's duration."""
    stages, capacity = split_minutes(stage_minutes or {})
    prices = tpu_cost.read_price_table(prices_path)
    lines = [
        f"4. TPU time with the stages in the tutorials' proportions (1 real minute = {minute_seconds:g}s here;",
        "   conversion, training, export, the TPU VM's install and its guest's boot last their minutes in",
        "   tpu_rl_sandbox.world.timescale)",
        f"   durations replaced (real minutes): {json.dumps({**stages, **capacity}, sort_keys=True) if stages or capacity else 'none'}",
        f"   real minutes = sandbox seconds / {minute_seconds:g}; Airflow's own seconds (about 0.5-1 s a task here)",
        "   count as minutes too, so the idle share and minutes are upper bounds of a real run's",
        f"   prices from {prices_path} (USD per v6e chip-hour): "
        + ", ".join(f"{c} {prices[c].usd_per_chip_hour:.2f}" for c in tpu_cost.CAPACITIES),
    ]
    lines += [f"   caveat: {caveat}" for caveat in tpu_cost.price_caveats(prices)]
    idle: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for number, (title, run) in enumerate(TPU_TIME_RUNS.items()):
            root, home = Path(tmp) / f"tpu-{number}" / "sandbox", Path(tmp) / f"tpu-{number}" / "airflow"
            sandbox_up(root)
            try:
                update_settings(
                    SandboxLayout(root.resolve()),
                    minute_seconds=minute_seconds,
                    stage_minutes=stages,
                    capacity_minutes=capacity,
                )
                airflow, env = migrated_airflow(root, home, dags_dir, step_seconds)
                env.update(provider_on_the_scale(minute_seconds))
                alone = Path(tmp) / f"tpu-{number}" / "dag" / f"{run.dag_id}.py"
                alone.parent.mkdir(parents=True)
                alone.write_text((dags_dir / f"{run.dag_id}.py").read_text())
                conf = {**run.conf, "run_name": f"bench-{number}"}
                wall, _ = dags_test(airflow, run.dag_id, alone, env, conf)
                durations = task_seconds(home, run.dag_id)
                tpu = ledger_tpu_time(home, run.dag_id)
                lines += tpu_time_lines(
                    f"   {title}", tpu, idle_goal=run.idle_goal, minute_seconds=minute_seconds
                )
                lines += cost_lines(run, tpu, minute_seconds, prices, stages, capacity)
                if run.dag_id == GKE_DAG_ID:
                    lines += image_pull_lines(image_pulls(root))
                    idle[title] = _idle_minutes(tpu, minute_seconds)
                lines.append(f"   the run's wall time {wall:.1f}s; each task's duration:")
                lines += textwrap.wrap(
                    ", ".join(f"{task} {seconds:.1f}s" for task, seconds in durations.items()),
                    width=100,
                    initial_indent="     ",
                    subsequent_indent="     ",
                )
            finally:
                sandbox_down(root, wipe=True)
    return lines + streaming_lines(idle, stages)


def _idle_minutes(tpu: dict[str, Any] | None, minute_seconds: float) -> float | None:
    """Real minutes of billed TPU time that did not train, from the ledger's figures."""
    if tpu is None or tpu["billed_seconds"] is None or tpu["trained_seconds"] is None:
        return None
    return tpu_cost.real_minutes(max(0.0, tpu["billed_seconds"] - tpu["trained_seconds"]), minute_seconds)


@dataclass(frozen=True)
class PipelineRun:
    """One ``airflow dags test`` of the GKE pipeline in its own sandbox and Airflow home."""

    batches: int
    wall: float
    jobs: dict[str, tuple[float, float]]  # job name -> (created, completed)
    calls: list[tuple[float, float]]  # fake CLI calls
    log: list[str]

    @property
    def work(self) -> float:
        """Simulated cloud work: the union of the jobs' runs and the CLI calls."""
        return union_seconds([*self.jobs.values(), *self.calls])

    @property
    def overhead(self) -> float:
        return self.wall - self.work


def _pipeline_round(
    dags_dir: Path, folder: Path, batches: int, step_seconds: float, shape: dict[str, Any] | None
) -> tuple[PipelineRun, dict[str, Any], float, float]:
    """In a fresh sandbox and Airflow home: the pipeline run, then the trivial DAG of its shape with
    and without the Params; (the run, the shape, the two trivial walls). The shape is read from the
    DAG file unless an earlier round passes it."""
    conf = {
        "project": "tpu-rl-bench",
        "cluster_name": "tpu-rl-bench",
        "bucket": "tpu-rl-bench-bucket",
        "num_batches": batches,
        "keep_cluster": True,  # keep the jobs listable afterwards; the sandbox is wiped at the end
    }
    root, home = folder / "sandbox", folder / "airflow"
    sandbox_up(root)
    try:
        airflow, env = migrated_airflow(root, home, dags_dir, step_seconds)
        if shape is None:
            shape = dag_shape(dags_dir / GKE_DAG_FILE, GKE_DAG_ID, env)
        started_at = time.time()
        # The DAG file alone in its folder, as the trivial DAGs are: the bundle parsed around
        # the run holds that one file, not the other DAGs of dags/.
        alone = folder / "pipeline" / GKE_DAG_FILE
        alone.parent.mkdir()
        alone.write_text((dags_dir / GKE_DAG_FILE).read_text())
        wall, log = dags_test(airflow, GKE_DAG_ID, alone, env, conf)
        run = PipelineRun(
            batches=batches,
            wall=wall,
            jobs=_job_intervals(root),
            calls=_call_intervals(root, started_at, time.time()),
            log=log,
        )
        # The same shape, the same sandbox, the same Airflow home, right after: only the DAG file differs.
        trivial = write_trivial_dag(folder / "trivial", shape)
        formless = write_trivial_dag(folder / "formless", shape, with_form=False)
        trivial_wall = dags_test(airflow, TRIVIAL_DAG_ID, trivial, env)[0]
        formless_wall = dags_test(airflow, TRIVIAL_DAG_ID, formless, env)[0]
    finally:
        sandbox_down(root, wipe=True)
    return run, shape, trivial_wall, formless_wall


def _seconds(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}s" for v in values)


def bench_pipeline(dags_dir: Path, train_seconds: float, step_seconds: float) -> list[str]:
    """Sections 2-4: :data:`ROUNDS` rounds, each a pipeline run and the two trivial DAGs after it;
    the first round trains ``train_seconds`` (the worker slot and TPU time are read from it), the
    others :data:`SHORT_TRAIN_SECONDS`. Overheads and baselines are the medians of the rounds."""
    runs: list[PipelineRun] = []
    trivial_walls: list[float] = []
    formless_walls: list[float] = []
    shape: dict[str, Any] = {}  # read in the first round, passed on to the others
    with tempfile.TemporaryDirectory() as tmp:
        for number in range(ROUNDS):
            seconds = train_seconds if number == 0 else min(train_seconds, SHORT_TRAIN_SECONDS)
            batches = max(1, round(seconds / step_seconds))
            run, shape, trivial_wall, formless_wall = _pipeline_round(
                dags_dir, Path(tmp) / f"round-{number}", batches, step_seconds, shape or None
            )
            runs.append(run)
            trivial_walls.append(trivial_wall)
            formless_walls.append(formless_wall)
    first = runs[0]
    job_seconds = {name: end - start for name, (start, end) in first.jobs.items()}
    held, span = worker_slot_seconds(first.log, "train")
    tasks = len(shape["tasks"])
    overheads = [run.overhead for run in runs]
    overhead = statistics.median(overheads)
    per_task = overhead / tasks
    trivial_wall, formless_wall = statistics.median(trivial_walls), statistics.median(formless_walls)
    trivial_per_task = trivial_wall / tasks
    formless_per_task = formless_wall / tasks
    ratio = per_task / trivial_per_task
    verdict = "met" if ratio <= OVERHEAD_RATIO_GOAL else "NOT met"
    params = len(shape["params"])
    steps = ", ".join(f"{o:.1f}s ({run.batches} steps)" for o, run in zip(overheads, runs, strict=True))
    return [
        f"2. Sandbox GKE pipeline, {first.batches} training steps x {step_seconds}s (poll interval 1 s), {tasks} tasks",
        f"   wall time of `airflow dags test`        {first.wall:8.1f}s",
        f"   the jobs' own run time ({len(first.jobs)} jobs)          {sum(job_seconds.values()):8.1f}s  {json.dumps({k: round(v) for k, v in job_seconds.items()})}",
        f"   time inside the fake cloud CLIs ({len(first.calls)} calls) {union_seconds(first.calls):8.1f}s  (gcloud/gcluster stand-ins: API latency here)",
        f"   simulated cloud work (union of both)      {first.work:8.1f}s",
        f"   orchestration overhead                  {first.overhead:8.1f}s",
        f"   orchestration overhead, median of {ROUNDS} runs {overhead:6.1f}s  = {per_task:.2f}s per task ({steps})",
        f"   trivial DAG, same shape ({tasks} no-op Python tasks, same edges, setup/teardown, trigger rules,",
        f"   the same {params} Params), run after each pipeline run",
        f"   wall time of `airflow dags test`        {trivial_wall:8.1f}s  = {trivial_per_task:.2f}s per task (all overhead;",
        f"   median of {ROUNDS} runs: {_seconds(trivial_walls)})",
        f"   the same without the Params              {formless_wall:8.1f}s  = {formless_per_task:.2f}s per task "
        f"(ratio {per_task / formless_per_task:.2f} against it; {_seconds(formless_walls)})",
        f"   overhead per task, pipeline vs trivial  {per_task:.2f}s / {trivial_per_task:.2f}s: "
        f"ratio {ratio:.2f} (goal ≤ {OVERHEAD_RATIO_GOAL:.2f}; {verdict})",
        f"   each round's ratio: {', '.join(f'{o / w:.2f}' for o, w in zip(overheads, trivial_walls, strict=True))}",
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
    parser.add_argument(
        "--minute-seconds",
        type=float,
        default=DEFAULT_MINUTE_SECONDS,
        help="the sandbox seconds one real minute of a stage lasts in the TPU time runs (4.)",
    )
    parser.add_argument("--parse-only", action="store_true", help="only the DAG parse benchmark (1.)")
    parser.add_argument("--tpu-time-only", action="store_true", help="only the TPU time and cost (4.)")
    parser.add_argument("--fallback-only", action="store_true", help="only the capacity fallback (5.)")
    parser.add_argument("--cli-cost-only", action="store_true", help="only the fake CLIs' CPU per call (7.)")
    parser.add_argument(
        "--cli-calls", type=int, default=20, help="calls per command in 7. (the median is shown)"
    )
    parser.add_argument(
        "--existing-only", action="store_true", help="only the existing cluster beside a created one (6.)"
    )
    parser.add_argument(
        "--stockout-minutes",
        type=float,
        default=120.0,
        help="real minutes the reservation stays full in 5. (the waiting run's retries meet it)",
    )
    parser.add_argument(
        "--stage-minutes",
        type=_stage_minutes_argument,
        default={},
        metavar="JSON",
        help="real minutes replacing stage or capacity durations of the time scale in 4., e.g. "
        '\'{"train": 60, "vm_provisioning": 2}\' (keys: tpu_rl_sandbox.world.timescale STAGE_KEYS and '
        "CAPACITY_MINUTES; a stage applies to both pipelines' models)",
    )
    parser.add_argument(
        "--prices",
        type=Path,
        default=tpu_cost.DEFAULT_PRICE_TABLE,
        help="the price table 4. costs runs at (docs/tpu-prices.md)",
    )


def run_bench_command(args: argparse.Namespace) -> int:
    dags = args.dags_folder.resolve()
    print(f"tpu-rl-sandbox bench on {os.cpu_count()} cores, Python {sys.version.split()[0]}", flush=True)
    only = (args.parse_only, args.tpu_time_only, args.fallback_only, args.existing_only, args.cli_cost_only)
    if sum(bool(x) for x in only) > 1:
        print(
            "--parse-only, --tpu-time-only, --fallback-only, --existing-only and --cli-cost-only exclude each other",
            file=sys.stderr,
        )
        return 2
    if args.cli_cost_only:
        return _print_cli_cost(args)
    if args.fallback_only:
        return _print_fallback(args)
    if args.existing_only:
        return _print_existing(dags, args)
    if args.tpu_time_only:
        return _print_tpu_time(dags, args)
    lines, parsed = bench_parse(dags, args.repeats)
    for line in lines:
        print(line, flush=True)
    if args.parse_only:
        return 0
    if GKE_DAG_FILE not in parsed:
        print(f"2./3. skipped: {GKE_DAG_FILE} does not parse", flush=True)
        return 1
    for line in bench_pipeline(dags, args.train_seconds, args.step_seconds):
        print(line, flush=True)
    _print_tpu_time(dags, args)
    _print_fallback(args)
    _print_existing(dags, args)
    return _print_cli_cost(args)


def _print_fallback(args: argparse.Namespace) -> int:
    prices = tpu_cost.read_price_table(args.prices)
    for line in fallback_bench.bench_fallback(
        args.minute_seconds, prices, stockout_minutes=args.stockout_minutes
    ):
        print(line, flush=True)
    return 0


def _print_existing(dags: Path, args: argparse.Namespace) -> int:
    from tpu_rl_sandbox.commands import existing_bench  # it imports this module's helpers

    for line in existing_bench.bench_existing(
        dags, args.minute_seconds, args.step_seconds, args.stage_minutes
    ):
        print(line, flush=True)
    return 0


def _print_cli_cost(args: argparse.Namespace) -> int:
    for line in cli_cost.bench_cli_cost(args.cli_calls):
        print(line, flush=True)
    return 0


def _print_tpu_time(dags: Path, args: argparse.Namespace) -> int:
    for line in bench_tpu_time(dags, args.minute_seconds, args.step_seconds, args.stage_minutes, args.prices):
        print(line, flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
