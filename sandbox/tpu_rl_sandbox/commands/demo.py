"""``tpu-rl-sandbox demo``: the whole multi-host pipeline on this machine, in the sandbox.

Starts the sandbox, migrates a local SQLite Airflow home, runs ``airflow dags test
tpu_rl_gke_pipeline`` with the Qwen preset, prints what happened (task states and durations,
rewards, where the checkpoints and the export are, that the cluster is gone), then stops the
sandbox. Its data is kept, so a second demo finds the converted checkpoint and skips conversion.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_provider_tpu_rl.render.gke import resource_record_object
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, gke_pipeline_from_conf
from tpu_rl_sandbox.apis.gcs_emulator import gcs_client
from tpu_rl_sandbox.commands import tpu_cost
from tpu_rl_sandbox.commands.lifecycle import sandbox_down, sandbox_env, sandbox_form_defaults, sandbox_up
from tpu_rl_sandbox.commands.schedule_once import run_queued_task
from tpu_rl_sandbox.world.calls import read_calls
from tpu_rl_sandbox.world.layout import SandboxLayout, default_root

# The untouched form (the Qwen preset, which evaluates before and after training) but for the
# cluster's name and the sandbox's v6e-32 reservation: project, region, zone and bucket are the
# form's defaults, which `tpu-rl-sandbox env` sets to the sandbox's ([tpu_rl] default_*).
DEMO_CONF: dict[str, Any] = {"cluster_name": "tpu-rl-demo", "reservation": "demo-v6e-32"}

# Fast polling for a local run; the defaults (60 s, 120 s) suit real clusters.
FAST_SETTINGS = {
    "AIRFLOW__TPU_RL__POLL_INTERVAL": "0.5",
    # `dags test` runs the trigger in-process: no scheduler to race, a short hold is enough.
    "AIRFLOW__TPU_RL__MIN_DEFERRAL_SECONDS": "1",
    # ...and writes its log lines itself: no triggerer to wait for
    "AIRFLOW__TPU_RL__TRIGGER_LOG_SETTLE_SECONDS": "0",
    "AIRFLOW__TPU_RL__RETRY_DELAY": "2",
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    # the model asset's downstream example DAG is queued by the pipeline's event only when unpaused
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
}
CONSUMER_DAG_ID = "tpu_rl_model_consumer_example"
CONSUMER_TASK_ID = "check_model"


def run_downstream(env: Mapping[str, str], log: Path) -> str:
    """The downstream example DAG, after the pipeline: the scheduler's step that creates the runs
    the model asset's event queued, then its task in the newest run; one line saying what happened."""
    queued = run_queued_task(env, CONSUMER_DAG_ID, CONSUMER_TASK_ID)
    with log.open("a") as out:
        out.write(queued.step_output + queued.task_output)
    if queued.task_code is None:
        return f"downstream: {CONSUMER_DAG_ID} was not queued (no model asset event; see {log})"
    run_type = queued.runs[-1][1]
    said = [line for line in queued.task_output.splitlines() if "new model " in line]
    if queued.task_code != 0 or not said:
        return f"DEMO FAILED: downstream {CONSUMER_DAG_ID} ({run_type}) did not succeed; see {log}"
    line = said[-1].split("new model ", 1)[1].split(" [airflow.", 1)[0]  # without the log's tail
    return f"downstream: {CONSUMER_DAG_ID} ran ({run_type}): new model {line}"


def _sync_dags_on_airflow_2(airflow: str, env: Mapping[str, str], log: Path) -> None:
    """Airflow 2.11's ``dags test`` records dataset events only for datasets already in the database."""
    from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS

    if not AIRFLOW_V_3_0_PLUS:
        _run([airflow, "dags", "reserialize"], env, log)


def _airflow(env: Mapping[str, str]) -> str:
    return str(Path(sys.executable).with_name("airflow"))


def _run(argv: list[str], env: Mapping[str, str], log: Path) -> int:
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        return subprocess.run(
            argv, env=dict(env), stdout=out, stderr=subprocess.STDOUT, check=False
        ).returncode


def _fmt_seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:6.1f}s"


def _summary(
    root: Path, conf: Mapping[str, Any], env: Mapping[str, str], calls_before: int, wall: float
) -> list[str]:
    os.environ.update(
        {k: env[k] for k in ("AIRFLOW_HOME", "STORAGE_EMULATOR_HOST", "AIRFLOW_CONN_TPU_RL_LEDGER")}
    )
    from airflow_provider_tpu_rl.ledger.cli import format_tpu_time
    from airflow_provider_tpu_rl.ledger.hook import RunLedger

    ledger = RunLedger(conn_id="tpu_rl_ledger")
    runs = [r for r in ledger.latest_runs(limit=50) if r.dag_id == GKE_DAG_ID]
    lines = [f"== tpu_rl_gke_pipeline in the sandbox ({wall:.0f} s wall)"]
    if not runs:
        return [*lines, "no run was recorded in the ledger"]
    run = runs[0]
    lines.append(f"run {run.airflow_run_id}: {run.state.upper()}  ({run.model}, {run.chips} chips)")
    lines.append("")
    steps = ledger.recorded_steps(run.run_id)
    width = max([28, *(len(task_id) + 2 for task_id in steps)])  # publish_converted_qwen3-30b-a3b
    lines.append(f"  {'task':<{width}}{'state':<16}{'try':>4}{'duration':>10}")
    for step in sorted(steps.values(), key=lambda s: (s.started_at is None, s.started_at or 0)):
        duration = (
            (step.ended_at - step.started_at).total_seconds() if step.started_at and step.ended_at else None
        )
        lines.append(
            f"  {step.task_id:<{width}}{step.state or 'not run':<16}{step.try_number or 0:>4}{_fmt_seconds(duration):>10}"
        )
    lines.append("")
    lines.append(
        "TPU time (the ledger's): "
        + format_tpu_time(run.chip_hours, run.busy_chip_hours, run.estimated_cost_usd)
    )
    pre, post = run.pre_mean_reward, run.post_mean_reward
    reason = run.no_reward_reason
    lines.append(
        f"mean_reward: {'-' if pre is None else f'{pre:.4f}'} before -> {'-' if post is None else f'{post:.4f}'} after training"
        + (f" ({reason})" if reason else "")
    )
    if run.state == "success" and (pre is None or post is None) and run.num_test_batches != 0:
        lines.append("DEMO FAILED: no reward before and after training, and evaluation was not turned off")
    calls = read_calls(SandboxLayout(root))[calls_before:]
    submits = [c["argv"] for c in calls if c["tool"] == "gcluster" and c["argv"][:2] == ["job", "submit"]]
    converted = any(any(a.startswith("--name=") and "-hf-to-mt-" in a for a in argv) for argv in submits)
    pipeline = gke_pipeline_from_conf({**sandbox_form_defaults("gke"), **conf}, run_id=run.airflow_run_id)
    client = gcs_client(env["STORAGE_EMULATOR_HOST"])
    bucket = pipeline.cluster.bucket

    def count(uri: str) -> int:
        prefix = uri.removeprefix(f"gs://{bucket}/")
        return sum(1 for _ in client.list_blobs(bucket, prefix=prefix))

    lines.append(
        f"conversion: {'ran' if converted else 'SKIPPED (the converted checkpoint was already complete in GCS)'}"
    )
    lines.append(
        f"converted checkpoint: {pipeline.conversion.items_path}/  ({count(pipeline.conversion.items_path)} objects)"
    )
    actor = pipeline.training.actor_checkpoint_root
    lines.append(f"actor checkpoints:    {actor}  ({count(actor)} objects)")
    lines.append(
        f"Hugging Face export:  {pipeline.export.output_directory}  ({count(pipeline.export.output_directory)} objects)"
    )
    card = pipeline.export.output_directory + "README.md"
    has_card = client.bucket(bucket).blob(card.removeprefix(f"gs://{bucket}/")).exists()
    lines.append(f"model card:           {card}  ({'written' if has_card else 'MISSING'})")
    if run.state == "success" and not has_card:
        lines.append("DEMO FAILED: the export has no model card")
    lines.append(f"promotion: {run.promotion or '-'}")
    destroys = [c for c in calls if c["tool"] == "gcluster" and c["argv"][:1] == ["destroy"]]
    clusters = (
        json.loads((root / "state" / "clusters.json").read_text() or "{}")
        if (root / "state" / "clusters.json").exists()
        else {}
    )
    left = [k for k in clusters if k.endswith("/" + pipeline.cluster.cluster_name)]
    lines.append(
        f"cluster {pipeline.cluster.cluster_name}: "
        + (
            "destroyed (gcluster destroy ran, nothing left running)"
            if destroys and not left
            else f"STILL PRESENT: {left}"
        )
    )
    record = client.bucket(bucket).blob(resource_record_object(pipeline.cluster.cluster_name))
    lines.append(
        f"bucket gs://{bucket}: kept ({'with' if record.exists() else 'without'} the janitor record)"
    )
    return lines


def idle_table(run: Any) -> list[str]:
    """The demo's last table: the run's TPU time as the ledger has it (the sandbox's seconds) beside
    what a real run of it would bill and train at the seeds' durations, each row saying why."""
    chips = run.chips or 0
    if not chips or run.chip_hours is None:
        return []

    def minutes(chip_hours: float | None) -> str:
        return "-" if chip_hours is None else f"{chip_hours * 60 / chips:.1f}"

    share = run.idle_share
    rows = [
        (
            "this run, in the sandbox (the ledger's)",
            minutes(run.chip_hours),
            minutes(run.busy_chip_hours),
            "-" if share is None else f"{share:.0%}",
            "training plays in seconds, while Airflow's own steps take their real seconds",
        )
    ]
    try:
        real = tpu_cost.pipeline_gke_estimate(str(run.model))
    except ValueError:
        real = None
    if real is not None:
        parts = " + ".join(f"{name} {value:g}" for name, value in real.parts.items())
        rows.append(
            (
                "a real run of it, at the seeds' durations",
                f"{real.billed_minutes:.1f}",
                f"{real.trained_minutes:.1f}",
                f"{real.idle_share:.0%}",
                f"{parts} min, estimates (sandbox world/timescale.py); make bench measures it",
            )
        )
    width = max(len(row[0]) for row in rows)
    lines = [
        f"\n== TPU idle of this run ({run.model}, {chips} chips): the sandbox's figure and a real run's",
        f"  {'':<{width}}  {'BILLED MIN':>10}  {'TRAINED MIN':>11}  {'IDLE':>4}  WHY",
    ]
    lines += [f"  {r[0]:<{width}}  {r[1]:>10}  {r[2]:>11}  {r[3]:>4}  {r[4]}" for r in rows]
    return lines


def _latest_gke_run() -> Any:
    """The newest GKE pipeline run of the demo's ledger (its environment already set), or None."""
    from airflow_provider_tpu_rl.ledger.hook import RunLedger

    runs = [r for r in RunLedger(conn_id="tpu_rl_ledger").latest_runs(limit=50) if r.dag_id == GKE_DAG_ID]
    return runs[0] if runs else None


def run_demo(root: Path, airflow_home: Path, dags_folder: Path, conf: Mapping[str, Any]) -> int:
    """Run the pipeline once in the sandbox and print the summary; return the DAG run's exit code."""
    # This process imports Airflow (the ledger hook, the summary): it reads the demo's own
    # AIRFLOW_HOME, never the user's ~/airflow.
    os.environ["AIRFLOW_HOME"] = str(airflow_home)
    from airflow_provider_tpu_rl.ledger.hook import sqlite_connection_uri  # imports Airflow: not at start-up

    info = sandbox_up(root)
    try:
        env = {**os.environ, **sandbox_env(root), **FAST_SETTINGS}
        env["AIRFLOW_HOME"] = str(airflow_home)
        env["AIRFLOW_CONN_TPU_RL_LEDGER"] = sqlite_connection_uri(airflow_home / "tpu_rl_ledger.db")
        env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags_folder)
        airflow_home.mkdir(parents=True, exist_ok=True)
        log = airflow_home / "demo.log"
        airflow = _airflow(env)
        print(f"sandbox: {info.root} (GCS emulator {info.emulator_url}); log: {log}", flush=True)
        if _run([airflow, "db", "migrate"], env, log) != 0:
            print(f"airflow db migrate failed; see {log}", file=sys.stderr)
            return 1
        _sync_dags_on_airflow_2(airflow, env, log)
        calls_before = len(read_calls(SandboxLayout(root)))
        started = time.monotonic()
        print("running: airflow dags test tpu_rl_gke_pipeline (Qwen3-30B-A3B preset) ...", flush=True)
        code = _run([airflow, "dags", "test", GKE_DAG_ID, "-c", json.dumps(dict(conf))], env, log)
        summary = _summary(root, conf, env, calls_before, time.monotonic() - started)
        if code == 0:
            summary.append(run_downstream(env, log))
        print("\n".join(summary))
        if any(line.startswith("DEMO FAILED") for line in summary) and code == 0:
            code = 1
        runs = subprocess.run(
            [str(Path(sys.executable).with_name("tpu-rl")), "runs", "--limit", "5"],
            env=env,
            check=False,
            capture_output=True,
            text=True,
        )
        print("\n== run ledger (tpu-rl runs)\n" + runs.stdout.rstrip())
        latest = _latest_gke_run()
        if latest is not None:
            print("\n".join(idle_table(latest)))
        return code
    finally:
        sandbox_down(root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpu-rl-sandbox demo", description=__doc__)
    add_demo_arguments(parser)
    return run_demo_command(parser.parse_args(argv))


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=None, help="sandbox folder (default .sandbox)")
    parser.add_argument("--airflow-home", type=Path, default=Path(".demo/airflow"))
    parser.add_argument("--dags-folder", type=Path, default=Path("dags"))
    parser.add_argument("--conf", help="extra conf (JSON object) merged over the demo conf")


def run_demo_command(args: argparse.Namespace) -> int:
    # A new run_name each time: a second demo trains and exports again, into new folders, while
    # the converted checkpoint (keyed by model only) is found complete and conversion is skipped.
    run_name = time.strftime("demo-%Y%m%d-%H%M%S")
    conf = {**DEMO_CONF, "run_name": run_name, **(json.loads(args.conf) if args.conf else {})}
    root = (args.dir or default_root()).resolve()
    return run_demo(root, args.airflow_home.resolve(), args.dags_folder.resolve(), conf)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
