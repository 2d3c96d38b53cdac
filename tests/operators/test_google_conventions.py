"""The google provider's conventions: an empty project is the GCP connection's, the
impersonation chain reaches every hook and CLI, one ``deferrable`` rule for jobs and sensors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from airflow.providers.common.compat.sdk import DAG

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.hooks import credentials
from airflow_provider_tpu_rl.operators.gke import EnsureBucketOperator
from airflow_provider_tpu_rl.operators.gke_jobs import PathwaysRLTrainOperator
from airflow_provider_tpu_rl.sensors.checkpoint import HuggingFaceExportSensor, MaxTextCheckpointSensor
from tests.support.sandbox_run import REGION, SandboxRun
from tpu_rl_sandbox.apis import oauth
from tpu_rl_sandbox.apis.api_server import api_server_url
from tpu_rl_sandbox.commands.lifecycle import SANDBOX_PROJECT
from tpu_rl_sandbox.world.calls import read_calls
from tpu_rl_sandbox.world.store import StateStore

DEPLOYER = f"deployer@{SANDBOX_PROJECT}.iam.gserviceaccount.com"
IMPERSONATE_ENV = "CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT"


def _bucket_creates(sb: SandboxRun) -> list[dict[str, Any]]:
    return [
        call
        for call in read_calls(sb.layout)
        if call["tool"] == "gcloud"
        and call["argv"][:3] == ["storage", "buckets", "create"]
        and f"gs://{sb.bucket}" in call["argv"]
    ]


@pytest.fixture
def iam_credentials(sb: SandboxRun, monkeypatch: pytest.MonkeyPatch) -> None:
    """google-auth's impersonated credentials get their token from the sandbox's IAM Credentials."""
    from google.auth import iam

    url = api_server_url(sb.layout)
    assert url is not None
    monkeypatch.setattr(iam, "_IAM_ENDPOINT", oauth.iam_credentials_endpoint(url))
    credentials.clear()


@pytest.mark.usefixtures("iam_credentials")
def test_an_empty_project_is_the_connections_and_gcloud_impersonates_the_chain(
    sb: SandboxRun, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    first = EnsureBucketOperator(
        task_id="ensure_bucket", dag=DAG("d", schedule=None), location=REGION, bucket=sb.bucket
    )
    assert first.execute(sb.context(first, {}, apply_arguments=False)) == f"gs://{sb.bucket}"
    again = EnsureBucketOperator(
        task_id="ensure_bucket",
        dag=DAG("d", schedule=None),
        project_id="",  # a rendered empty param: the connection's project too
        location=REGION,
        bucket=sb.bucket,
        impersonation_chain=[DEPLOYER],
    )
    with caplog.at_level("INFO"):
        assert again.execute(sb.context(again, {}, apply_arguments=False)) == f"gs://{sb.bucket}"
    creates = _bucket_creates(sb)
    assert len(creates) == 2
    # the project of google_cloud_default (its "project" extra), as GoogleBaseHook.project_id reads it
    assert all(f"--project={SANDBOX_PROJECT}" in call["argv"] for call in creates)
    assert IMPERSONATE_ENV not in creates[0]["env_names"]
    assert IMPERSONATE_ENV in creates[1]["env_names"]
    # the write check went through google-auth's impersonated credentials: a token of the deployer
    tokens = StateStore(sb.layout).read(oauth.TOKENS_DOC).values()
    assert DEPLOYER in {token["email"] for token in tokens}
    logged = caplog.text + capsys.readouterr().out
    assert f"All API calls will be executed as [{DEPLOYER}]" in logged
    assert f"using connection google_cloud_default's project {SANDBOX_PROJECT}" in logged


def test_no_project_anywhere_fails_in_one_line(sb: SandboxRun, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    extra = json.loads(os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"]).get("extra", {})
    if isinstance(extra, str):
        extra = json.loads(extra)
    extra.pop("project", None)
    keyfile = dict(extra.get("keyfile_dict") or {})
    keyfile.pop("project_id", None)
    extra["keyfile_dict"] = keyfile
    monkeypatch.setenv(
        "AIRFLOW_CONN_TPU_RL_NO_PROJECT", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
    )
    credentials.clear()
    op = EnsureBucketOperator(
        task_id="ensure_bucket",
        dag=DAG("d", schedule=None),
        location=REGION,
        bucket=sb.bucket,
        gcp_conn_id="tpu_rl_no_project",
    )
    with pytest.raises(
        AirflowFailException, match="project_id is empty and connection 'tpu_rl_no_project' names no project"
    ):
        op.execute(sb.context(op, {}, apply_arguments=False))
    assert _bucket_creates(sb) == []


def test_the_job_trigger_carries_the_chain_to_the_triggerer() -> None:
    op = PathwaysRLTrainOperator(
        task_id="train",
        dag=DAG("d", schedule=None),
        project_id="tpu-rl-proj",
        location=REGION,
        cluster_name="c1",
        bucket="tpu-rl-b",
        model="qwen3-30b-a3b",
        run_name="r1",
        impersonation_chain=["hop@p.iam.gserviceaccount.com", DEPLOYER],
    )
    context: Any = {"run_id": "manual__1", "params": {}}
    plan = op.plan(context)
    _, kwargs = op.job_trigger(plan, "d/manual__1").serialize()
    assert kwargs["impersonation_chain"] == ["hop@p.iam.gserviceaccount.com", DEPLOYER]
    assert op.hook.impersonation_chain == ["hop@p.iam.gserviceaccount.com", DEPLOYER]


@pytest.mark.parametrize("sensor_class", [MaxTextCheckpointSensor, HuggingFaceExportSensor])
@pytest.mark.parametrize("configured", ["False", "True"])
def test_jobs_and_sensors_follow_one_deferrable_rule(
    sensor_class: Any, configured: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", configured)
    uri = (
        {"checkpoint_root": "gs://b/r/"}
        if sensor_class is MaxTextCheckpointSensor
        else {"export_uri": "gs://b/e/"}
    )
    sensor = sensor_class(task_id="s", **uri)
    job = PathwaysRLTrainOperator(
        task_id="train", location=REGION, cluster_name="c1", bucket="b", model="qwen3-30b-a3b", run_name="r1"
    )
    assert sensor.deferrable is job.deferrable is (configured == "True")
    assert sensor_class(task_id="s2", deferrable=True, **uri).deferrable is True
