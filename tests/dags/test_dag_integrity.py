"""Every file in dags/ imports cleanly, defines the expected DAGs, and touches no cloud while parsing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.dags import (
    CONSUMER_DAG_ID,
    DAGS_DIR,
    GKE_DAG_ID,
    JANITOR_DAG_ID,
    PIPELINE_DAG_IDS,
    SWEEP_DAG_ID,
    TPU_VM_DAG_ID,
)

PARSE_GUARD = Path(__file__).with_name("parse_guard.py")
CLOUD_TOOLS = ("gcloud", "gcluster", "gsutil", "kubectl", "terraform", "packer", "ssh", "bq")
# croniter calls platform.architecture(), which runs `file -b <python>`: not a cloud call.
ALLOWED_SPAWNS = ("file",)


@pytest.fixture(scope="module")
def guarded_parse(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Parse dags/ in a fresh interpreter: PATH holds only fake cloud tools, sockets refuse to connect."""
    root = tmp_path_factory.mktemp("parse")
    fake_bin = root / "bin"
    fake_bin.mkdir()
    marker = root / "cloud_tool_calls.txt"
    for tool in CLOUD_TOOLS:
        script = fake_bin / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{marker}"\nexit 97\n')
        script.chmod(0o755)
    env = {
        "PATH": str(fake_bin),
        "HOME": str(root),
        "AIRFLOW_HOME": str(root / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_DIR),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }
    done = subprocess.run(
        [sys.executable, str(PARSE_GUARD), str(DAGS_DIR)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["cloud_tool_calls"] = marker.read_text().splitlines() if marker.exists() else []
    return result


def test_every_dag_file_imports_without_errors(guarded_parse: dict[str, Any]) -> None:
    assert guarded_parse["import_errors"] == {}


def test_the_folder_defines_exactly_the_five_dags(guarded_parse: dict[str, Any]) -> None:
    assert guarded_parse["dag_ids"] == sorted(
        [GKE_DAG_ID, TPU_VM_DAG_ID, JANITOR_DAG_ID, SWEEP_DAG_ID, CONSUMER_DAG_ID]
    )


def test_the_consumer_example_runs_on_any_gke_models_asset(dag_bag: Any) -> None:
    dag = dag_bag.dags[CONSUMER_DAG_ID]
    condition = getattr(dag.timetable, "asset_condition", None) or dag.timetable.dataset_condition
    uris = sorted(asset.uri for asset in condition.objects)
    assert uris == ["tpu-rl://models/gemma4-26b", "tpu-rl://models/qwen3-30b-a3b"]
    assert all(task.execution_timeout for task in dag.tasks)


def test_parsing_opens_no_socket(guarded_parse: dict[str, Any]) -> None:
    assert guarded_parse["attempts"] == []


def test_parsing_runs_no_cloud_tool(guarded_parse: dict[str, Any]) -> None:
    assert guarded_parse["cloud_tool_calls"] == []
    programs = {Path(argv[0]).name for argv in guarded_parse["spawned"]}
    assert programs <= set(ALLOWED_SPAWNS), guarded_parse["spawned"]


def test_every_python_file_in_dags_is_parsed(dag_bag: Any) -> None:
    files = sorted(str(p) for p in DAGS_DIR.glob("*.py"))
    parsed = sorted({dag.fileloc for dag in dag_bag.dags.values()})
    assert parsed == files


@pytest.mark.parametrize("dag_id", [*PIPELINE_DAG_IDS, JANITOR_DAG_ID, SWEEP_DAG_ID])
def test_default_params_validate(dag_bag: Any, serialized_dags: dict[str, Any], dag_id: str) -> None:
    dag_bag.dags[dag_id].params.validate()
    serialized_dags[dag_id].params.validate()


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_pipelines_are_manual_only(dag_bag: Any, dag_id: str) -> None:
    dag = dag_bag.dags[dag_id]
    from tests.support.compat import dag_schedule

    assert dag_schedule(dag) is None
    assert dag.catchup is False
    assert dag.render_template_as_native_obj is True
    assert {"tpu-rl", "maxtext"} <= set(dag.tags)
    for switch in ("delete_bucket", "max_"):
        assert switch in dag.doc_md
