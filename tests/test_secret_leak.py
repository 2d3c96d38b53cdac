"""The Hugging Face token goes from the Airflow connection to Secret Manager, and nowhere else.

A unique sentinel token is put in the ``huggingface_default`` connection; the GKE operators run for
real against the sandbox (bucket, deploy, sync_hf_token, convert, train, export). The sentinel must
reach the fake Secret Manager (which keeps only its SHA-256) and must appear in no log record
(stdlib and the hook's/trigger's structlog task-log lines, captured before any masking), no XCom,
no rendered template field, no trigger argument or event, no call recorded by the fakes, no file
under the sandbox or the work dirs, and not in ``tpu-rl plan``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.common.compat.sdk import DAG

from airflow_provider_tpu_rl.cli import main as tpu_rl_cli
from airflow_provider_tpu_rl.operators.existing_cluster import ClusterModeDeployOperator
from airflow_provider_tpu_rl.operators.gke import EnsureBucketOperator, HfTokenSecretOperator
from airflow_provider_tpu_rl.operators.gke_jobs import (
    MaxTextConvertOperator,
    MaxTextExportOperator,
    PathwaysRLTrainOperator,
)
from airflow_provider_tpu_rl.pipelines.arguments import gke_task_arguments
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, gke_pipeline_from_conf
from tests.support.compat import capture_task_logs, task_log_debug
from tests.support.sandbox_run import (
    RecordingTI,
    SandboxRun,
    defer,
    enter_sandbox,
    iter_files,
    json_text,
    run_trigger,
)
from tpu_rl_sandbox.commands.lifecycle import SandboxInfo

SENTINEL = f"hf_leakcheck_{uuid.uuid4().hex}"
SECRET_ID = "tpu-rl-hf-token-huggingface_default"
RUN_ID = "manual__2026-03-01T00:00:00+00:00"


def _templated(task_id: str) -> dict[str, Any]:
    """The task's arguments as a DAG author would template them: each from a param."""
    return gke_task_arguments(lambda key: "{{ params." + key + " }}")[task_id]


def _forms(secret: str) -> list[bytes]:
    """The token as bytes, and encoded the ways a careless writer would store it."""
    raw = secret.encode()
    return [raw, base64.b64encode(raw), base64.urlsafe_b64encode(raw), raw.hex().encode()]


def _run_pipeline(sb: SandboxRun, conf: dict[str, Any]) -> dict[str, list[Any]]:
    """Every GKE work operator, in DAG order; what each exposed to Airflow (XCom, templates, triggers)."""
    seen: dict[str, list[Any]] = {"xcom": [], "rendered": [], "trigger": [], "results": []}
    resolved = gke_pipeline_from_conf(conf, run_id=RUN_ID).resolved()
    classes = {
        "ensure_bucket": EnsureBucketOperator,
        "deploy_cluster": ClusterModeDeployOperator,
        "sync_hf_token": HfTokenSecretOperator,
        "convert_to_maxtext": MaxTextConvertOperator,
        "deploy_tpu_pool": ClusterModeDeployOperator,
        "train": PathwaysRLTrainOperator,
        "export_to_huggingface": MaxTextExportOperator,
    }
    for task_id, factory in classes.items():
        op = factory(
            task_id=task_id,
            dag=DAG(GKE_DAG_ID, schedule=None, render_template_as_native_obj=True),
            **_templated(task_id),
        )
        ti = RecordingTI()
        context = sb.context(op, resolved, run_id=RUN_ID, ti=ti, apply_arguments=False)
        op.render_template_fields(context)
        rendered = {field: getattr(op, field) for field in op.template_fields}
        assert rendered["project_id"] == sb.project  # the templates really rendered
        seen["rendered"].append(rendered)
        if isinstance(op, MaxTextConvertOperator | MaxTextExportOperator | PathwaysRLTrainOperator):
            deferred = defer(op, context)
            seen["trigger"] += [deferred.trigger.serialize(), deferred.kwargs, deferred.timeout]
            event = run_trigger(deferred.trigger)
            seen["trigger"].append(event)
            result = op.execute_complete(context, event)
        else:
            result = op.execute(context)
        seen["results"].append(result)
        seen["xcom"] += ti.pushed
    return seen


def test_the_hf_token_reaches_secret_manager_and_nothing_else(
    sandbox: SandboxInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    sb = enter_sandbox(sandbox, tmp_path, monkeypatch)
    monkeypatch.setenv(
        "AIRFLOW_CONN_HUGGINGFACE_DEFAULT", json.dumps({"conn_type": "generic", "password": SENTINEL})
    )
    caplog.set_level(logging.DEBUG)
    task_log_debug(monkeypatch)  # task-log lines at DEBUG too
    conf = sb.gke_conf(hf_token_conn_id="huggingface_default", train_overrides={"num_test_batches": 2})

    with capture_task_logs() as task_log:
        seen = _run_pipeline(sb, conf)

    # It really reached the secret: the fake Secret Manager holds a version with the token's hash,
    # and the workloads that read it (conversion, training, export) all succeeded.
    versions = sb.state("secrets")[f"{sb.project}/{SECRET_ID}"]["versions"]
    assert hashlib.sha256(SENTINEL.encode()).hexdigest() in [v["sha256"] for v in versions]
    assert [seen["results"][i]["skipped"] for i in (3, 5, 6)] == [False, False, False]
    (added,) = [c for c in sb.calls() if c["argv"][:3] == ["secrets", "versions", "add"]]
    assert "--data-file=-" in added["argv"]
    assert added["exit_code"] == 0

    # Logs: the hook's and trigger's task-log lines (structlog, unmasked), stdlib records, raw output.
    log_text = "\n".join(json_text(entry) for entry in task_log)
    assert "Hugging Face token read from connection 'huggingface_default'" in log_text
    assert "[gcloud] Created version" in log_text  # the secret step's own output was captured
    assert SENTINEL not in log_text
    assert SENTINEL not in caplog.text
    assert all(SENTINEL not in json_text(record.__dict__) for record in caplog.records)
    out, err = capfd.readouterr()
    assert SENTINEL not in out
    assert SENTINEL not in err

    # XCom, return values (XCom too), rendered templates, trigger arguments and events.
    assert seen["xcom"]
    for kind in ("xcom", "results", "rendered", "trigger"):
        assert SENTINEL not in json_text(seen[kind]), kind

    # What the fakes recorded (argv, env names), and every file under the sandbox and the work dirs.
    calls_text = sb.layout.calls_file.read_text()
    assert "secrets" in calls_text
    assert SENTINEL not in calls_text
    scanned = 0
    for path in iter_files(sandbox.root, tmp_path):
        data = path.read_bytes()
        scanned += 1
        for form in _forms(SENTINEL):
            assert form not in data, f"{path} holds the HF token"
    assert scanned > 50

    # The plan of the same run shows the secret step with the value replaced.
    assert tpu_rl_cli(["plan", GKE_DAG_ID, "--conf", json.dumps(conf), "--run-id", RUN_ID]) == 0
    plan_out, plan_err = capfd.readouterr()
    plan = json.loads(plan_out)
    (secret_step,) = [s for s in plan["steps"] if s["argv"][:4] == ["gcloud", "secrets", "versions", "add"]]
    assert secret_step["stdin"] == "***"
    assert SENTINEL not in plan_out
    assert SENTINEL not in plan_err
