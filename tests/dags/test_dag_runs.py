"""The run state of a real ``airflow dags test`` run of the GKE pipeline whose conf is refused.

No cloud and no sandbox: ``gcluster``/``gcloud`` are fakes that record their call and fail, so any
cloud step that ran would show. What is checked is the DAG run's state, not only the task states.
A run whose steps all succeed, its watcher skipped, is the end-to-end happy run, and a run whose
teardown fails is its permanent destroy fault (tests/e2e/test_gke_pipeline.py); a destroy without
its GCS connection is tests/operators/test_gke.py and tests/records/test_lease.py; a run
with no reward or loss drawn is tests/ledger/test_plots.py.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tpu_rl_sandbox
from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS
from tests.support.airflow_home import migrate_into
from tests.support.compat import dags_test_task_log
from tests.support.dags import DAGS_DIR, GKE_DAG_ID
from tests.support.harness import RUN_TIMEOUT_SECONDS
from tests.support.waiting import run_bounded
from tpu_rl_sandbox.clis.tool_stubs import write_tool_stubs

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
BUNDLE = Path(tpu_rl_sandbox.__file__).parent / "bundle"
# A project and a bucket of the user's: `validate` refuses the form's examples.
OK_CONF = {"project": "tpu-rl-dag-runs", "bucket": "tpu-rl-dag-runs-bucket"}


@dataclass
class RunResult:
    exit_code: int
    state: str | None  # None: no DAG run was created (Airflow refused the conf at trigger time)
    task_states: dict[str, str]
    cloud_calls: list[str]
    ledger_state: str | None
    ledger_refusal: str | None  # the ledger row's "refused at validate: ..."
    output: str

    def task_log(self, task_id: str) -> str:
        """What ``dags test`` printed while ``task_id`` ran."""
        return dags_test_task_log(self.output, task_id)


_NOT_INHERITED = ("AIRFLOW", "TPU_RL_SANDBOX", "STORAGE_EMULATOR_HOST")


@pytest.fixture(scope="module")
def dags_test(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., RunResult]:
    """Run ``airflow dags test`` in a fresh AIRFLOW_HOME with failing fake cloud tools."""
    root = tmp_path_factory.mktemp("dag_runs")
    calls = root / "cloud_calls.txt"
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for tool in ("gcluster", "gcloud"):
        script = bin_dir / tool
        script.write_text(
            f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\necho "Error: injected failure" >&2\nexit 1\n'
        )
        script.chmod(0o755)
    write_tool_stubs(bin_dir)  # terraform, packer, kubectl, the auth plugin: the toolchain is there
    home = root / "airflow"
    # Nothing of another test's sandbox or Airflow settings (an xdist worker runs many files):
    # only what this fixture sets.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
    env = {
        **inherited,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_DIR),
        # Airflow's bound on importing one DAG file (30 s by default), a bound against a hang: as in
        # tests/support/harness.py, a parse took longer with a second `make test` beside the suite
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "300",
        "AIRFLOW_CONN_GCLUSTER_DEFAULT": json.dumps(
            {
                "conn_type": "gcluster",
                "extra": {
                    "gcluster_path": str(bin_dir / "gcluster"),
                    "gcloud_path": str(bin_dir / "gcloud"),
                    "bundle_dir": str(BUNDLE),
                },
            }
        ),
    }
    # (no AIRFLOW_CONN_TPU_RL_LEDGER: the ledger is the default SQLite file in AIRFLOW_HOME)
    migrate_into(home, env)

    def run(*, conf: dict[str, Any] | None = None) -> RunResult:
        calls.unlink(missing_ok=True)
        with closing(sqlite3.connect(home / "airflow.db")) as metadata:
            (last_id,) = metadata.execute("SELECT COALESCE(MAX(id), 0) FROM dag_run").fetchone()
        argv = [AIRFLOW, "dags", "test", GKE_DAG_ID, "-c", json.dumps(OK_CONF if conf is None else conf)]
        done = run_bounded(argv, f"`airflow dags test {GKE_DAG_ID}`", RUN_TIMEOUT_SECONDS, env=env)
        # The metadata DB read directly: an `airflow` CLI call would cost seconds of start-up each.
        with closing(sqlite3.connect(home / "airflow.db")) as metadata:
            run_id, run_state = metadata.execute(
                "SELECT run_id, state FROM dag_run WHERE dag_id = ? AND id > ? ORDER BY id DESC LIMIT 1",
                (GKE_DAG_ID, last_id),
            ).fetchone() or (None, None)
            assert run_id is not None, (
                f"`dags test` recorded no run (exit {done.returncode}):\n{done.stderr[-3000:]}"
            )
            states = dict(
                metadata.execute(
                    "SELECT task_id, state FROM task_instance WHERE dag_id = ? AND run_id = ?",
                    (GKE_DAG_ID, run_id),
                ).fetchall()
            )
        with closing(sqlite3.connect(home / "tpu_rl_ledger.db")) as ledger:
            row = ledger.execute(
                "SELECT state, refusal FROM runs WHERE airflow_run_id = ?", (run_id,)
            ).fetchone()
        return RunResult(
            exit_code=done.returncode,
            state=run_state,
            task_states=states,
            cloud_calls=calls.read_text().splitlines() if calls.exists() else [],
            ledger_state=row[0] if row else None,
            ledger_refusal=row[1] if row else None,
            output=done.stdout + done.stderr,
        )

    return run


# The bad setting of the run below is one whose value changes on its way to the task: Airflow 3
# serializes the conf to the task as JSON, where a NaN becomes null, while Airflow 2 hands the task
# the float itself; the form's schema lets null through for an override's value, so it is validate
# that names it. Every other bad setting is sent through the same ``validate`` in-process (and
# through the form's JSON schema) by tests/pipelines/test_form.py.
NAN_REFUSAL = (
    "train_overrides.learning_rate: must not be null (NaN and Infinity arrive as null)"
    if AIRFLOW_V_3_0_PLUS
    else "train_overrides.learning_rate: must be a finite number (got nan)"
)


def test_a_bad_conf_fails_before_anything_is_created_or_destroyed(
    dags_test: Callable[..., RunResult],
) -> None:
    result = dags_test(conf={**OK_CONF, "train_overrides": {"learning_rate": float("nan")}})
    assert result.task_states["validate"] == "failed"
    assert result.task_states["ensure_bucket"] == "upstream_failed"
    assert result.task_states["deploy_cluster"] == "upstream_failed"
    assert result.task_states["train"] == "upstream_failed"
    # Nothing was created, so nothing is destroyed; the ledger still records the run.
    assert result.task_states["destroy_cluster"] == "upstream_failed"
    assert result.task_states["record_run"] == "success"
    assert result.task_states["watcher"] == "failed"
    assert result.state == "failed"
    assert result.exit_code == 1
    assert result.cloud_calls == []
    assert result.ledger_state == "failed"
    assert result.ledger_refusal == f"refused at validate: {NAN_REFUSAL}"
    # A configuration error is its one line: no traceback in validate's log, and the watcher repeats it.
    line = f"invalid pipeline conf: {NAN_REFUSAL}"
    validate_log = result.task_log("validate")
    assert line in validate_log
    assert "Traceback" not in validate_log
    assert 'File "' not in validate_log
    watcher_log = result.task_log("watcher")
    assert f"1 task failed: validate: {line}" in watcher_log
    assert "Traceback" not in watcher_log
