"""What the end-to-end tests drive and look at: ``airflow dags test`` subprocesses in the sandbox.

Everything is read from the outside, the way an operator of the pipeline would check it: the
exit code, the metadata DB (run and task states), the sandbox's ``calls.jsonl`` and state files
(what was created, what is left), the GCS emulator's object list, and the ledger's SQLite file.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.airflow_home import migrate_into
from tests.support.compat import dags_test_task_log
from tests.support.waiting import HANG_BOUND, run_bounded
from tpu_rl_sandbox.apis.gcs_client import GcsApi, GcsError, split_gs_url
from tpu_rl_sandbox.clis.airflow_server import airflow_command, start_airflow_server, stop_airflow_server
from tpu_rl_sandbox.commands.lifecycle import SandboxInfo, sandbox_down, sandbox_env, sandbox_up
from tpu_rl_sandbox.commands.schedule_once import run_queued_task
from tpu_rl_sandbox.world.calls import read_calls
from tpu_rl_sandbox.world.faults import FAULT_ENV, reset_faults
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import DEFAULT_RESERVATIONS, update_settings
from tpu_rl_sandbox.world.store import StateStore

REPO = Path(__file__).resolve().parents[2]
DAGS_DIR = REPO / "dags"
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
TPU_RL = str(Path(sys.executable).with_name("tpu-rl"))
GKE_DAG_ID = "tpu_rl_gke_pipeline"
TPU_VM_DAG_ID = "tpu_rl_tpu_vm_pipeline"
E2E_RESERVATION = "res-8"  # a v6e-8 reservation start_world creates
# A bound against a hung `airflow dags test`, not a timing goal: twenty times a quiet GKE run's minute,
# above the longest single run of the suite loaded (a GKE run; 75-250 s in `make test`'s two loaded
# legs, fixture set-up included; over 600 s, the former bound, with a second `make test` beside it,
# as two GKE runs at once were: tests/e2e/test_existing_cluster_runs.py). A module whose runs take
# longer names its own bound (run_dag's ``timeout``).
RUN_TIMEOUT_SECONDS = 1200

# Fast sandbox and fast Airflow: 50 ms per simulated step, job polls every 0.5 s, one retry
# after 1 s (a transient fault fires once, so one retry is enough to recover; a permanent one
# exhausts it quickly).
FAST_SETTINGS = {
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_DIR),
    "AIRFLOW__TPU_RL__POLL_INTERVAL": "0.5",
    # `dags test` runs the trigger in-process: no scheduler to race, a short hold is enough.
    "AIRFLOW__TPU_RL__MIN_DEFERRAL_SECONDS": "1",
    # ...and writes its log lines itself: no triggerer to wait for
    "AIRFLOW__TPU_RL__TRIGGER_LOG_SETTLE_SECONDS": "0",
    "AIRFLOW__TPU_RL__RETRY_DELAY": "1",
    "AIRFLOW__TPU_RL__RETRIES": "1",
    "TPU_RL_SANDBOX_STEP_SECONDS": "0.05",
    # the model asset's downstream example DAG is queued by its events only when unpaused
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
    # Airflow's bound on importing one DAG file (30 s by default), a bound against a hang: a parse
    # took longer with a second `make test` beside the suite
    "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "300",
}
_INHERITED_PREFIXES = ("AIRFLOW", "TPU_RL_SANDBOX", "STORAGE_EMULATOR_HOST")
_RAISED_LINE = re.compile(r"^[\w.]+(?:Exception|Error): (?P<message>.*)$", re.MULTILINE)
_REWARD_LINE = re.compile(r"(Pre|Post) RL Training: .*?mean_reward=(?P<reward>-?[0-9.]+)")


@dataclass(frozen=True)
class Call:
    """One recorded invocation of a fake tool (``gcluster`` or ``gcloud``)."""

    tool: str
    argv: tuple[str, ...]
    exit_code: int
    start: float = 0.0  # epoch seconds, when the tool was called

    def is_(self, tool: str, *prefix: str) -> bool:
        """Whether this is ``tool`` with argv starting with ``prefix``."""
        return self.tool == tool and self.argv[: len(prefix)] == prefix

    def flag(self, name: str) -> str | None:
        """Value of ``--name=V`` or ``--name V``."""
        for index, item in enumerate(self.argv):
            if item.startswith(f"--{name}="):
                return item.split("=", 1)[1]
            if item == f"--{name}" and index + 1 < len(self.argv):
                return self.argv[index + 1]
        return None

    def __str__(self) -> str:
        return f"{self.tool} {' '.join(self.argv)} -> {self.exit_code}"


@dataclass(frozen=True)
class TaskResult:
    state: str | None
    try_number: int


@dataclass
class DagRunResult:
    """One ``airflow dags test`` command and what it left behind."""

    dag_id: str
    run_id: str
    conf: dict[str, Any]
    faults: str
    exit_code: int
    state: str
    tasks: dict[str, TaskResult]
    calls: list[Call]
    output: str
    seconds: float

    @property
    def ledger_run_id(self) -> str:
        return f"{self.dag_id}/{self.run_id}"

    def task_state(self, task_id: str) -> str | None:
        return self.tasks[task_id].state

    def calls_of(self, tool: str, *prefix: str) -> list[Call]:
        return [call for call in self.calls if call.is_(tool, *prefix)]

    def submitted_jobs(self) -> list[str]:
        """Names of the ``gcluster job submit`` calls, in order (failed submits included)."""
        return [str(call.flag("name")) for call in self.calls_of("gcluster", "job", "submit")]

    def task_log(self, task_id: str) -> str:
        """What ``dags test`` printed while ``task_id`` ran (its last try)."""
        return dags_test_task_log(
            self.output[self.output.rindex(f"[DAG TEST] starting task_id={task_id} ") :], task_id
        )

    def raised(self) -> list[str]:
        """Messages of the exceptions the run's tasks raised (``pkg.SomeException: message`` lines)."""
        return [match.group("message") for match in _RAISED_LINE.finditer(self.output)]

    def describe(self) -> str:
        """Summary for assertion messages: states, calls and the end of the output."""
        states = ", ".join(f"{t}={r.state}#{r.try_number}" for t, r in sorted(self.tasks.items()))
        calls = "\n  ".join(str(call)[:220] for call in self.calls)
        tail = "\n".join(self.output.splitlines()[-40:])
        return (
            f"{self.dag_id} {self.run_id} faults={self.faults!r} exit={self.exit_code} state={self.state} "
            f"({self.seconds:.1f}s)\ntasks: {states}\ncalls:\n  {calls}\noutput tail:\n{tail}"
        )


def printed_rewards(text: str) -> dict[str, float]:
    """``{"pre": x, "post": y}`` from MaxText's "Pre/Post RL Training: ... mean_reward=" lines."""
    found: dict[str, float] = {}
    for match in _REWARD_LINE.finditer(text):
        found[match.group(1).lower()] = float(match.group("reward"))
    return found


# An asset's events, from Airflow's metadata DB: Airflow 3's assets, Airflow 2's datasets.
ASSET_EVENTS_SQL = (
    "SELECT e.source_dag_id, e.source_run_id, e.extra FROM asset_event e JOIN asset a ON e.asset_id = a.id "
    "WHERE a.uri = ? ORDER BY e.id"
)
DATASET_EVENTS_SQL = (
    "SELECT e.source_dag_id, e.source_run_id, e.extra FROM dataset_event e "
    "JOIN dataset a ON e.dataset_id = a.id WHERE a.uri = ? ORDER BY e.id"
)


@dataclass
class E2EWorld:
    """A sandbox and an AIRFLOW_HOME that a test module runs its DAG runs in."""

    root: Path
    sandbox: SandboxInfo
    home: Path
    env: dict[str, str]
    runs: list[DagRunResult] = field(default_factory=list)

    @property
    def layout(self) -> SandboxLayout:
        return SandboxLayout(self.sandbox.root)

    @property
    def gcs(self) -> GcsApi:
        return GcsApi(self.sandbox.emulator_url)

    # -- running ------------------------------------------------------------------------
    def run_dag(
        self,
        dag_id: str,
        conf: dict[str, Any],
        faults: str = "",
        env_overrides: dict[str, str] | None = None,
        timeout: float = RUN_TIMEOUT_SECONDS,
    ) -> DagRunResult:
        """``airflow dags test DAG -c CONF`` with ``TPU_RL_SANDBOX_FAIL=faults`` (transient faults
        re-armed), killed after ``timeout`` seconds (a hang's bound)."""
        if dag_id == TPU_VM_DAG_ID and "reservation" not in conf:
            # `validate` refuses the form's example reservation: name one of the sandbox's.
            conf = {**conf, "reservation": E2E_RESERVATION}
        reset_faults(self.layout)
        calls_before = len(read_calls(self.layout))
        env = {**self.env, **(env_overrides or {})}
        if faults:
            env[FAULT_ENV] = faults
        started = time.monotonic()
        done = run_bounded(
            airflow_command(self.home, ["dags", "test", dag_id, "-c", json.dumps(conf)]),
            f"`airflow dags test {dag_id}` (faults: {faults or 'none'})",
            timeout,
            env=env,
            cwd=self.root,
        )
        seconds = time.monotonic() - started
        output = done.stdout + done.stderr
        log_file = self.root / "runs" / f"{len(self.runs):02d}-{dag_id}.log"
        log_file.parent.mkdir(exist_ok=True)
        log_file.write_text(output)
        run_id, state = self.metadata_one(
            "SELECT run_id, state FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", (dag_id,)
        )
        tasks = {
            task_id: TaskResult(task_state, int(try_number or 0))
            for task_id, task_state, try_number in self.metadata(
                "SELECT task_id, state, try_number FROM task_instance WHERE dag_id = ? AND run_id = ?",
                (dag_id, run_id),
            )
        }
        calls = [
            Call(
                str(entry["tool"]),
                tuple(entry["argv"]),
                int(entry["exit_code"]),
                float(entry.get("start") or 0.0),
            )
            for entry in read_calls(self.layout)[calls_before:]
        ]
        result = DagRunResult(
            dag_id, str(run_id), conf, faults, done.returncode, str(state), tasks, calls, output, seconds
        )
        self.runs.append(result)
        return result

    def tpu_rl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``tpu-rl ARGS`` with this world's AIRFLOW_HOME (bounded by :data:`HANG_BOUND`: a few
        seconds quiet, it ran past 120 s beside a second ``make test``)."""
        return subprocess.run(
            [TPU_RL, *args],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=HANG_BOUND,
            check=False,
        )

    # -- databases ----------------------------------------------------------------------
    def metadata(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows from Airflow's metadata DB (read directly: the CLI costs seconds of start-up)."""
        with closing(sqlite3.connect(self.home / "airflow.db")) as db:
            return list(db.execute(sql, params).fetchall())

    def metadata_one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
        rows = self.metadata(sql, params)
        assert rows, f"no row for {sql} {params}"
        return rows[0]

    def ledger(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows from the run ledger (the default SQLite file in AIRFLOW_HOME)."""
        path = self.home / "tpu_rl_ledger.db"
        assert path.is_file(), f"no ledger at {path}"
        with closing(sqlite3.connect(path)) as db:
            return list(db.execute(sql, params).fetchall())

    # -- the fake cloud -----------------------------------------------------------------
    def live_clusters(self) -> set[str]:
        """Names of GKE clusters that exist in the sandbox."""
        clusters = StateStore(self.layout).read("clusters")
        return {key.rsplit("/", 1)[-1] for key, record in clusters.items() if record.get("exists", True)}

    def node_pool_lifetimes(self, cluster_name: str, pool: str) -> list[tuple[float, float | None]]:
        """Each life of the cluster's node pool ``pool``: (created, deleted) in epoch seconds
        (``None``: not deleted), in order, as the fake gcluster recorded them."""
        events = StateStore(self.layout).read("node_pool_events").get("events", [])
        return [
            (float(row["created_at"]), None if row["deleted_at"] is None else float(row["deleted_at"]))
            for row in events
            if row["cluster"].rsplit("/", 1)[-1] == cluster_name and row["pool"] == pool
        ]

    def live_vms(self) -> set[str]:
        """Names of Compute Engine instances that exist in the sandbox."""
        return {key.rsplit("/", 1)[-1] for key in StateStore(self.layout).read("vms")}

    def fired_faults(self) -> set[str]:
        """Transient faults that fired since the last :meth:`run_dag` re-armed them."""
        return set(StateStore(self.layout).read("faults"))

    def sandbox_job_logs(self) -> list[str]:
        """Texts of every job attempt the sandbox ran (what the simulated pods printed)."""
        return [path.read_text() for path in sorted(self.layout.jobs_dir.glob("*/attempt-*.log"))]

    # -- the GCS emulator ---------------------------------------------------------------
    def bucket_exists(self, bucket: str) -> bool:
        return self.gcs.get_bucket(bucket) is not None

    def objects(self, uri: str) -> set[str]:
        """Object names under ``gs://bucket/prefix``, relative to the prefix."""
        bucket, prefix = split_gs_url(uri)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        return {info.name[len(prefix) :] for info in self.gcs.iter_objects(bucket, prefix)}

    def written_at(self, uri: str) -> float:
        """When the emulator last wrote the object ``gs://bucket/name`` (its ``updated``), epoch seconds."""
        from datetime import datetime

        bucket, name = split_gs_url(uri)
        (info,) = [i for i in self.gcs.iter_objects(bucket, name) if i.name == name]
        return datetime.fromisoformat(info.updated.replace("Z", "+00:00")).timestamp()

    def model_card(self, export_uri: str) -> str:
        """The ``README.md`` beside an export (the provider's model card)."""
        bucket, name = split_gs_url(export_uri.rstrip("/") + "/README.md")
        return self.gcs.download(bucket, name).decode()

    def asset_events(self, uri: str) -> list[tuple[str, str, dict[str, Any]]]:
        """(source DAG, source run id, extra) of every event of the asset (Airflow 2: dataset) ``uri``."""
        from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS

        sql = ASSET_EVENTS_SQL if AIRFLOW_V_3_0_PLUS else DATASET_EVENTS_SQL
        rows = self.metadata(sql, (uri,))
        return [
            (dag, run, json.loads(extra) if isinstance(extra, str) else dict(extra or {}))
            for dag, run, extra in rows
        ]

    def run_downstream(self, dag_id: str, task_id: str) -> tuple[list[tuple[str, str]], str]:
        """The scheduler's step that turns queued asset events into runs (in-process, once), then
        ``airflow tasks test`` of ``task_id`` in ``dag_id``'s newest run, through the module's
        Airflow CLI server as its ``dags test`` runs are (Airflow 3 builds its in-process execution
        API there once). Returns the DAG's runs (run id, run type) and the task's output."""
        queued = run_queued_task(
            self.env, dag_id, task_id, cwd=self.root, airflow=lambda args: airflow_command(self.home, args)
        )
        assert queued.step_code == 0, queued.step_output
        if queued.task_code is None:
            return [], queued.step_output
        return queued.runs, f"rc={queued.task_code}\n{queued.task_output}"

    def sync_dags(self) -> None:
        """Airflow 2.11's ``dags test`` registers dataset events only for datasets already in the
        database (Airflow 3's syncs the DAG folder itself): ``airflow dags reserialize`` once."""
        from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS

        if AIRFLOW_V_3_0_PLUS:
            return
        done = subprocess.run(
            airflow_command(self.home, ["dags", "reserialize"]),
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def exists(self, uri: str) -> bool:
        bucket, name = split_gs_url(uri)
        return self.gcs.exists(bucket, name)

    def hf_export_problems(self, export_uri: str) -> list[str]:
        """What is missing from a Hugging Face export: config, index, every shard it names, tokenizer."""
        names = self.objects(export_uri)
        problems = [
            f"{name} missing" for name in ("config.json", "tokenizer_config.json") if name not in names
        ]
        if not {"tokenizer.json", "tokenizer.model"} & names:
            problems.append("no tokenizer.json / tokenizer.model")
        if "model.safetensors.index.json" in names:
            bucket, prefix = split_gs_url(export_uri.rstrip("/") + "/model.safetensors.index.json")
            try:
                index = json.loads(self.gcs.download(bucket, prefix))
            except (GcsError, ValueError) as error:
                return [*problems, f"index unreadable: {error}"]
            shards = set(index.get("weight_map", {}).values())
            if not shards:
                problems.append("the index names no shard")
            problems += [f"shard {shard} (named by the index) missing" for shard in sorted(shards - names)]
        elif "model.safetensors" not in names:
            problems.append("no model.safetensors and no model.safetensors.index.json")
        return problems


def start_world(root: Path) -> E2EWorld:
    """Start a sandbox under ``root`` and migrate a fresh AIRFLOW_HOME next to it."""
    info = sandbox_up(root / "sandbox")
    home = root / "airflow"
    try:
        # The runs of a module share one project, and some leave their VM behind on purpose
        # (keep_vm, a destroy that keeps failing): the v6e-8 reservation holds more than one VM.
        update_settings(
            SandboxLayout(info.root),
            reservations={
                **DEFAULT_RESERVATIONS,
                **{
                    f"us-east5-b/{name}": {"machine_type": "ct6e-standard-8t", "count": 8}
                    for name in ("res-8", "my-v6e-8-reservation")
                },
            },
        )
        home.mkdir()
        (root / "tmp").mkdir()
        (root / "user").mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_PREFIXES)}
        env.update(sandbox_env(info.root))
        env.update(FAST_SETTINGS)
        # TMPDIR holds the per-run deployment folders (gettempdir()/tpu-rl/...), HOME the
        # gcluster/docker config: both private to this module.
        env.update({"AIRFLOW_HOME": str(home), "TMPDIR": str(root / "tmp"), "HOME": str(root / "user")})
        migrate_into(home, env)
        start_airflow_server(home, env)
    except BaseException:
        stop_airflow_server(home)
        sandbox_down(info.root)
        raise
    return E2EWorld(root=root, sandbox=info, home=home, env=env)


def stop_world(world: E2EWorld) -> None:
    """Stop the Airflow CLI server, the emulator and any job worker (the data stays for
    post-mortems in the tmp dir)."""
    stop_airflow_server(world.home)
    sandbox_down(world.sandbox.root)


def duplicates(names: Iterable[str]) -> list[str]:
    """Names that occur more than once."""
    return sorted(name for name, count in Counter(names).items() if count > 1)
