"""TPU_RL_SANDBOX_FAIL injects each failure always, or once with ``:transient``."""

from __future__ import annotations

import json

import pytest

from tests.sandbox.conftest import Cli, Cluster, deploy_args, submit_args
from tests.sandbox.test_jobs import CONVERT, EXPORT, convert, logs, pathways_flags, train_command

pytestmark = pytest.mark.usefixtures("clean_faults")
FAIL = "TPU_RL_SANDBOX_FAIL"


def cluster_status(cli: Cli, project: str) -> list[str]:
    listed = json.loads(
        cli.gcloud("container", "clusters", "list", f"--project={project}", "--format=json").out or "[]"
    )
    return [c["status"] for c in listed]


def test_deploy_transient_stockout_then_success(cli: Cli, names: dict[str, str]) -> None:
    env = {FAIL: "deploy:transient"}
    first = cli.gcluster("deploy", str(cli.info.blueprint), *deploy_args(names, backend=False), env=env)
    assert first.code == 1
    assert "GCE_STOCKOUT" in first.err
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in first.err
    assert cluster_status(cli, names["project"]) == ["DEGRADED"]
    second = cli.gcluster("deploy", str(cli.info.blueprint), *deploy_args(names, backend=False), env=env)
    assert second.code == 0, second.text
    assert "Apply complete! Resources: 1 added" in second.out  # only the node pool was missing
    assert cluster_status(cli, names["project"]) == ["RUNNING"]


def test_deploy_config_error_every_time(cli: Cli, names: dict[str, str]) -> None:
    for _ in range(2):
        result = cli.gcluster(
            "deploy", str(cli.info.blueprint), *deploy_args(names, backend=False), env={FAIL: "deploy"}
        )
        assert result.code == 1
        assert "reservations/res-1' does not exist or is not usable" in result.err
        assert "GCE_STOCKOUT" not in result.err


def test_destroy_faults(cli: Cli, names: dict[str, str]) -> None:
    assert cli.gcluster("deploy", str(cli.info.blueprint), *deploy_args(names, backend=False)).code == 0
    failing = cli.gcluster("destroy", names["cluster"], "--auto-approve", env={FAIL: "destroy"})
    assert failing.code == 1
    assert f'Destruction of "{names["cluster"]}" failed after 1 attempts' in failing.err
    assert "Error 403" in failing.err
    assert cluster_status(cli, names["project"]) == ["RUNNING"]
    robust = cli.gcluster(
        "destroy", names["cluster"], "--auto-approve", "--robust", env={FAIL: "destroy:transient"}
    )
    assert robust.code == 0, robust.text
    assert "is already being used by" in robust.err
    assert "Destroy attempt 2 of 3" in robust.out
    assert cluster_status(cli, names["project"]) == []


def test_convert_fault_always_fails_and_transient_is_absorbed_by_a_jobset_restart(
    cli: Cli, cluster: Cluster
) -> None:
    command = CONVERT.format(token=cluster.token_export(), bucket=cluster.bucket)
    always = cli.gcluster(
        *submit_args("conv-always", command, "--await-job-completion"), env={FAIL: "convert"}
    )
    assert always.code == 1
    assert "Checkpoint conversion failed" in logs(cli, "conv-always")
    assert "qwen/max-text-format/0/commit_success.txt" not in cli.objects(cluster.bucket, "qwen/")
    # Default --restarts 1: the JobSet retries the failed attempt and succeeds.
    transient = cli.gcluster(
        *submit_args("conv-transient", command, "--await-job-completion"), env={FAIL: "convert:transient"}
    )
    assert transient.code == 0, transient.text
    job = cli.job(cluster.project, cluster.region, cluster.name, "conv-transient")
    assert job is not None
    assert job["attempt"] == 2


def test_train_fault_fails_after_the_first_checkpoint_and_keeps_it(cli: Cli, cluster: Cluster) -> None:
    convert(cli, cluster)
    actor = "qwen/trained/rl/checkpoints/actor/"
    command = train_command(cluster, steps=4, period=2)
    failed = cli.gcluster(
        *submit_args("rl-fail", command, *pathways_flags(cluster), "--await-job-completion"),
        env={FAIL: "train:transient"},
    )
    assert failed.code == 1
    assert "UNAVAILABLE" in logs(cli, "rl-fail")
    after_failure = cli.objects(cluster.bucket, actor)
    assert f"{actor}2/commit_success.txt" in after_failure
    assert not any(name.startswith(f"{actor}4/") for name in after_failure)
    retried = cli.gcluster(
        *submit_args("rl-retry", command, *pathways_flags(cluster), "--await-job-completion"),
        env={FAIL: "train:transient"},
    )
    assert retried.code == 0, retried.text
    assert "Restored params from step: 2 in" in logs(cli, "rl-retry")
    final = cli.objects(cluster.bucket, actor)
    assert set(after_failure) <= set(final)
    assert f"{actor}4/commit_success.txt" in final
    always = cli.gcluster(
        *submit_args(
            "rl-always",
            train_command(cluster, steps=4, period=2).replace("run_name=rl", "run_name=rl2"),
            *pathways_flags(cluster),
            "--await-job-completion",
        ),
        env={FAIL: "train"},
    )
    assert always.code == 1
    assert "RESOURCE_EXHAUSTED" in logs(cli, "rl-always")


def test_export_fault(cli: Cli, cluster: Cluster) -> None:
    convert(cli, cluster)
    assert (
        cli.gcluster(
            *submit_args(
                "rl",
                train_command(cluster, steps=2, period=2, tests=0),
                *pathways_flags(cluster),
                "--await-job-completion",
            )
        ).code
        == 0
    )
    command = EXPORT.format(token=cluster.token_export(), bucket=cluster.bucket, step=2)
    failed = cli.gcluster(
        *submit_args("export-fail", command, "--await-job-completion", "--restarts", "0"),
        env={FAIL: "export:transient"},
    )
    assert failed.code == 1
    assert "503 Server Error" in logs(cli, "export-fail")
    assert cli.objects(cluster.bucket, "qwen/hf-trained/") == []
    again = cli.gcluster(
        *submit_args("export-ok", command, "--await-job-completion", "--restarts", "0"),
        env={FAIL: "export:transient"},
    )
    assert again.code == 0, again.text
    assert cli.objects(cluster.bucket, "qwen/hf-trained/")


def test_bad_fault_spec_is_refused(cli: Cli, cluster: Cluster) -> None:
    result = cli.gcluster(*submit_args("bad-fault", "true"), env={FAIL: "explode"})
    assert result.code == 1
    assert "bad TPU_RL_SANDBOX_FAIL entry 'explode'" in result.err
