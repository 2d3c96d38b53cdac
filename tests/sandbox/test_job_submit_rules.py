"""``gcluster job submit`` refuses what the real v1.103 CLI refuses, with its messages."""

from __future__ import annotations

import pytest

from tests.sandbox.conftest import Cli, Cluster, job_status, submit_args, wait_for


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--bogus"], "Error: unknown flag: --bogus"),
        (
            ["--name", "abcdefghij-abcdefghij-abcdefghij"],
            'cannot exceed 28 characters due to Kubernetes/GCE resource name limits. The provided name "abcdefghij-abcdefghij-abcdefghij" has 32 characters',
        ),
        (
            ["--name", "ok", "--pathways-gcs-location", "gs://b/p"],
            "pathways flags specified but --pathways flag is missing",
        ),
        (
            ["--name", "ok", "--pathways-proxy-env", "A=1"],
            "pathways flags specified but --pathways flag is missing",
        ),
        (["--name", "ok", "--pathways"], "pathways-gcs-location is required when using --pathways"),
        (
            ["--name", "ok", "--env", "GRPC_DNS_RESOLVER"],
            'invalid value "GRPC_DNS_RESOLVER" for --env: must be in KEY=VALUE format',
        ),
        (["--name", "ok", "--num-nodes", "2"], "--num-nodes cannot be used with TPU jobs"),
        (
            ["--name", "ok", "--gke-ttl-after-finished", "soon"],
            "invalid duration format for --gke-ttl-after-finished: soon",
        ),
    ],
)
def test_submit_argument_errors(cli: Cli, cluster: Cluster, extra: list[str], message: str) -> None:
    argv = [
        "job",
        "submit",
        "--image",
        "img",
        "--compute-type",
        "ct6e-standard-4t",
        "--command",
        "echo hi",
        *extra,
    ]
    result = cli.gcluster(*argv)
    assert result.code == 1
    assert message in result.err
    assert cli.state("jobs") == {} or all(j["cluster"] != cluster.name for j in cli.state("jobs").values())


def test_required_flags_and_image(cli: Cli, cluster: Cluster) -> None:
    missing_image = cli.gcluster(
        "job", "submit", "--name", "x", "--compute-type", "ct6e-standard-4t", "--command", "true"
    )
    assert missing_image.code == 1
    assert "either --image or --base-image must be provided" in missing_image.err
    missing = cli.gcluster("job", "submit", "--image", "img")
    assert missing.code == 1
    assert 'Error: required flag(s) "command", "compute-type", "name" not set' in missing.err


def test_bad_dns_name_fails_when_the_manifest_is_applied(cli: Cli, cluster: Cluster) -> None:
    result = cli.gcluster(*submit_args("Qwen_RL", "true"))
    assert result.code == 1
    assert "failed to apply GKE manifest" in result.err
    assert "[a-z]([-a-z0-9]*[a-z0-9])?" in result.err
    assert job_status(cli, cluster, "Qwen_RL") is None


def test_duplicate_name(cli: Cli, cluster: Cluster) -> None:
    first = cli.gcluster(*submit_args("dup-job", "echo one"))
    assert first.code == 0, first.text
    second = cli.gcluster(*submit_args("dup-job", "echo two"))
    assert second.code == 1
    assert "job with name 'dup-job' already exists in state" in second.err


def test_context_is_read_from_home_and_required(cli: Cli, cluster: Cluster) -> None:
    other_home = cli.cwd / "other-home"
    other_home.mkdir()
    result = cli.gcluster(*submit_args("no-context", "true"), env={"HOME": str(other_home)})
    assert result.code == 1
    assert "cluster name is required" in result.err
    explicit = cli.gcluster(
        *submit_args("with-flags", "true"),
        "-p",
        cluster.project,
        "-c",
        cluster.name,
        "-l",
        cluster.region,
        env={"HOME": str(other_home), "DOCKER_CONFIG": str(cli.env["HOME"]) + "/.docker"},
    )
    assert explicit.code == 0, explicit.text


def test_docker_credentials_are_a_prerequisite_per_home(cli: Cli, cluster: Cluster) -> None:
    bare_home = cli.cwd / "bare-home"
    (bare_home / ".gcluster").mkdir(parents=True)
    (bare_home / ".gcluster" / "context.json").write_text(
        (cli.cwd.parent / "home" / ".gcluster" / "context.json").read_text()
    )
    result = cli.gcluster(*submit_args("needs-docker", "true"), env={"HOME": str(bare_home)})
    assert result.code == 1
    assert "gcloud auth configure-docker gcr.io --quiet" in result.out
    assert "job could not be submitted because some prerequisites are missing." in result.err


def test_unknown_cluster_and_topology(cli: Cli, cluster: Cluster) -> None:
    unknown = cli.gcluster(*submit_args("x1", "true"), "-c", "no-such-cluster")
    assert unknown.code == 1
    assert "failed to describe GKE cluster no-such-cluster" in unknown.err
    wrong_topology = cli.gcluster(
        "job",
        "submit",
        "--name",
        "x2",
        "--image",
        "img",
        "--compute-type",
        "ct6e-standard-4t",
        "--topology",
        "2x4",
        "--command",
        "true",
    )
    assert wrong_topology.code == 1
    assert "requested topology 2x4 is not valid for cluster" in wrong_topology.err


def test_timeout_needs_units_but_the_job_is_already_created(cli: Cli, cluster: Cluster) -> None:
    result = cli.gcluster(*submit_args("timeout-units", "echo hi", "--timeout", "3600"))
    assert result.code == 1
    assert 'time: missing unit in duration "3600"' in result.err
    assert wait_for(
        lambda: job_status(cli, cluster, "timeout-units") == "Succeeded", what="job to finish anyway"
    )
