"""Hygiene of the GKE lifecycle operators in the sandbox: private work folders removed at task
end, one Secret Manager version per token (older ones disabled), accessor bindings removed at
teardown."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowException
from airflow_provider_tpu_rl.operators.gke import (
    GRANTED_XCOM_KEY,
    EnsureBucketOperator,
    GclusterDeployOperator,
    GclusterDestroyOperator,
    HfTokenSecretOperator,
)
from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID, gke_pipeline_from_conf
from tests.support.sandbox_run import DEFAULT_RUN_ID, RecordingTI, SandboxRun, prepare_cluster
from tpu_rl_sandbox.world import secret_values
from tpu_rl_sandbox.world.iam import iam_bindings
from tpu_rl_sandbox.world.store import StateStore

ACCESSOR = "roles/secretmanager.secretAccessor"


def _gcluster(sb: SandboxRun, verb: str) -> list[dict[str, Any]]:
    return [c for c in sb.calls() if c["tool"] == "gcluster" and c["argv"][:1] == [verb]]


def _out_dir(call: dict[str, Any]) -> str:
    return next(a.split("=", 1)[1] for a in call["argv"] if a.startswith("--out="))


# ---------------------------------------------------------------------------- work folders
def test_make_workdir_is_private_unpredictable_and_removable() -> None:
    first, second = gke.make_workdir("c1", "abc123"), gke.make_workdir("c1", "abc123")
    try:
        assert first != second
        for folder in (first, second):
            assert Path(folder).parent == Path(tempfile.gettempdir())
            assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
            assert Path(folder).name.startswith("tpu-rl-c1-abc123-")
    finally:
        gke.remove_workdir(first)
        gke.remove_workdir(second)
    assert not Path(first).exists()
    assert not Path(second).exists()


def test_remove_workdir_never_follows_a_symlink_inside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    folder = gke.make_workdir("c1", "abc123")
    os.symlink(outside, Path(folder) / "link")
    gke.remove_workdir(folder)
    assert not Path(folder).exists()
    assert (outside / "keep.txt").read_text() == "keep"


def test_deploy_and_destroy_work_in_fresh_folders_removed_at_task_end(sb: SandboxRun) -> None:
    conf = sb.gke_conf()
    pipeline = gke_pipeline_from_conf(conf, run_id=DEFAULT_RUN_ID)
    # a symlink planted at the old fixed path (gettempdir()/tpu-rl/<cluster>-<suffix>) is never used
    planted = Path(tempfile.gettempdir()) / "tpu-rl" / f"{sb.cluster}-{pipeline.suffix}"
    planted.parent.mkdir(parents=True, exist_ok=True)
    target = Path(tempfile.mkdtemp(prefix="attacker-"))
    planted.symlink_to(target)

    prepare_cluster(sb, conf, tpu_pool=False)  # the cluster deploy and its destroy alone
    destroy = sb.operator(GclusterDestroyOperator, task_id="destroy_cluster")
    assert destroy.execute(sb.context(destroy, conf))["destroyed"] is True

    (deploy,) = _gcluster(sb, "deploy")
    recreate = _gcluster(sb, "create")
    folders = {_out_dir(deploy), *(_out_dir(c) for c in recreate)}
    (destroy_call,) = _gcluster(sb, "destroy")
    folders.add(str(Path(destroy_call["argv"][1]).parent))
    assert len(folders) == 2, folders  # one for the deploy, one for the teardown
    for folder in folders:
        assert not Path(folder).exists(), folder
        assert Path(folder).parent == Path(tempfile.gettempdir())
        assert Path(folder) != planted
    assert list(target.iterdir()) == []


# --------------------------------------------------------------------------------- the token
def _secret(sb: SandboxRun, secret_id: str) -> dict[str, Any]:
    record = StateStore(sb.layout).read("secrets").get(f"{sb.project}/{secret_id}")
    assert record is not None
    return dict(record)


def _sync(sb: SandboxRun, conf: dict[str, Any]) -> str:
    """The TPU VM pipeline's token sync (no reader service accounts to grant)."""
    operator = sb.operator(HfTokenSecretOperator, TPU_VM_DAG_ID, task_id="sync_hf_token", conf=conf)
    return str(operator.execute(sb.context(operator, conf)))


def _adds(sb: SandboxRun) -> list[dict[str, Any]]:
    return [
        c for c in sb.calls() if c["tool"] == "gcloud" and c["argv"][:3] == ["secrets", "versions", "add"]
    ]


def test_a_new_secret_version_only_when_the_token_changed(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = sb.tpu_vm_conf()
    secret_id = _sync(sb, conf)
    assert len(_adds(sb)) == 1
    assert _sync(sb, conf) == secret_id
    assert len(_adds(sb)) == 1, "the same token stored twice"

    stored = _secret(sb, secret_id)
    digest = stored["annotations"][gke.TOKEN_DIGEST_ANNOTATION]
    token = json.loads(os.environ["AIRFLOW_CONN_HUGGINGFACE_DEFAULT"])["password"]
    assert token not in json.dumps(stored)
    assert token not in json.dumps(sb.calls())

    new_token = "hf_" + "n" * 34
    monkeypatch.setenv(
        "AIRFLOW_CONN_HUGGINGFACE_DEFAULT", json.dumps({"conn_type": "generic", "password": new_token})
    )
    _sync(sb, conf)
    assert len(_adds(sb)) == 2
    stored = _secret(sb, secret_id)
    assert [v["state"] for v in stored["versions"]] == ["DISABLED", "ENABLED"]
    assert stored["annotations"][gke.TOKEN_DIGEST_ANNOTATION] != digest
    # the workloads read "latest": the new token
    value, problem = secret_values.secret_value(StateStore(sb.layout), sb.project, secret_id, "latest")
    assert problem == ""
    assert value == secret_values.placeholder_token(stored["versions"][-1]["sha256"])
    _sync(sb, conf)
    assert len(_adds(sb)) == 2


def _granted_by_token_task(sb: SandboxRun, conf: dict[str, Any], run_id: str = DEFAULT_RUN_ID) -> list[str]:
    """Run the token task again as its DAG run does; the accounts it pushed as this run's grants."""
    token = sb.operator(HfTokenSecretOperator, task_id="sync_hf_token", conf=conf, run_id=run_id)
    ti = RecordingTI()
    token.execute(sb.context(token, conf, run_id=run_id, ti=ti))
    granted: list[str] = ti.pulled(GRANTED_XCOM_KEY)
    return granted


def test_teardown_removes_the_secret_accessor_bindings_this_run_added(sb: SandboxRun) -> None:
    conf = sb.gke_conf()
    pipeline = gke_pipeline_from_conf(conf, run_id=DEFAULT_RUN_ID)
    resource = f"projects/{sb.project}/secrets/{pipeline.hf_token.secret_id}"
    accounts = [pipeline.cluster.workload_service_account, pipeline.cluster.node_pool_service_account]
    members = {f"serviceAccount:{a}" for a in accounts}
    bucket = sb.operator(EnsureBucketOperator, task_id="ensure_bucket")
    bucket.execute(sb.context(bucket, conf))
    deploy = sb.operator(GclusterDeployOperator, task_id="deploy_cluster")
    deploy.execute(sb.context(deploy, conf))
    granted = _granted_by_token_task(sb, conf)
    assert sorted(granted) == sorted(accounts)
    assert members <= set(iam_bindings(sb.layout, resource).get(ACCESSOR, []))
    # a retry reports the same grants: the cluster's hold (recorded), not "nothing new"
    assert sorted(_granted_by_token_task(sb, conf)) == sorted(accounts)

    destroy = sb.operator(GclusterDestroyOperator, task_id="destroy_cluster", revoke_service_accounts=granted)
    done = destroy.execute(sb.context(destroy, conf))
    assert done["destroyed"] is True
    assert sorted(done["revoked_accounts"]) == sorted(accounts)
    assert not members & set(iam_bindings(sb.layout, resource).get(ACCESSOR, []))
    # a retried teardown finds the bindings gone and still succeeds
    assert destroy.execute(sb.context(destroy, conf))["destroyed"] is True


def test_a_failed_deploys_teardown_keeps_a_live_runs_secret_access(sb: SandboxRun) -> None:
    """Run A (its own bucket) uses cluster C; run B names C too, in another bucket: its deploy
    fails (the cluster exists), its token task never runs, and its teardown revokes nothing."""
    conf_a = sb.gke_conf()
    run_b = "manual__2026-03-02T00:00:00+00:00"
    conf_b = {**conf_a, "bucket": f"{sb.bucket}-b"}
    pipeline = gke_pipeline_from_conf(conf_a, run_id=DEFAULT_RUN_ID)
    resource = f"projects/{sb.project}/secrets/{pipeline.hf_token.secret_id}"
    members = {
        f"serviceAccount:{pipeline.cluster.workload_service_account}",
        f"serviceAccount:{pipeline.cluster.node_pool_service_account}",
    }
    prepare_cluster(sb, conf_a)
    assert members <= set(iam_bindings(sb.layout, resource).get(ACCESSOR, []))
    bucket = sb.operator(EnsureBucketOperator, task_id="ensure_bucket", conf=conf_b, run_id=run_b)
    bucket.execute(sb.context(bucket, conf_b, run_id=run_b))
    deploy = sb.operator(GclusterDeployOperator, task_id="deploy_cluster", conf=conf_b, run_id=run_b)
    with pytest.raises(AirflowException):
        deploy.execute(sb.context(deploy, conf_b, run_id=run_b))

    # the DAG's template: sync_hf_token never ran, so its XCom is None
    destroy = sb.operator(
        GclusterDestroyOperator,
        task_id="destroy_cluster",
        conf=conf_b,
        run_id=run_b,
        revoke_service_accounts=None,
    )
    done = destroy.execute(sb.context(destroy, conf_b, run_id=run_b))

    assert done["revoked_accounts"] == []
    assert members <= set(iam_bindings(sb.layout, resource).get(ACCESSOR, []))
    record = sb.cluster_record()
    assert record is not None
    assert record.get("exists", True) is not False  # A's cluster stands
