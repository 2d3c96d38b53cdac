"""CPU jobs (the conversions) on the GKE cluster: Kueue admits them only where the ClusterQueue
covers ``cpu``; they run on ``cpu-np`` without the host network, as their Kubernetes service
account's Google account (Workload Identity), and never with a TPU topology."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.render.blueprint import customize_blueprint
from airflow_provider_tpu_rl.spec.presets import PRESETS
from tests.sandbox.conftest import Cli, Cluster, job_status, make_cluster, wait_for
from tests.sandbox.test_jobs import CONVERT
from tpu_rl_sandbox.world.inventory import project_number

CPU_FLAGS = (
    "--compute-type",
    "n4-standard-64",
    "--node-constraint",
    "cloud.google.com/gke-nodepool=cpu-np",
)
IMAGE = "us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4"


def cpu_submit(cluster: Cluster, name: str, *extra: str) -> list[str]:
    command = CONVERT.format(token=cluster.token_export(), bucket=cluster.bucket)
    return ["job", "submit", "--name", name, "--image", IMAGE, *CPU_FLAGS, *extra, "--command", command]


@pytest.fixture
def cpu_queue_cluster(cli: Cli, names: dict[str, str], tmp_path: Path) -> Cluster:
    """A cluster deployed from the blueprint as the provider edits it (the module's Pathways queue)."""
    folder = tmp_path / "blueprint"
    shutil.copytree(cli.info.blueprint.parent, folder)
    edited = folder / cli.info.blueprint.name
    edited.write_text(customize_blueprint(cli.info.blueprint.read_text(), PRESETS["qwen3-30b-a3b"].blueprint))
    return make_cluster(cli, names, edited)


def test_where_the_queue_covers_no_cpu_a_cpu_job_is_never_admitted(cli: Cli, cluster: Cluster) -> None:
    """The tutorials' own kueue-configuration.yaml.tftpl: quota for google.com/tpu only."""
    assert (
        cli.gcluster(*cpu_submit(cluster, "cpu-stuck", "--service-account", "workload-identity-k8s-sa")).code
        == 0
    )
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert job_status(cli, cluster, "cpu-stuck") == "Suspended"
        time.sleep(0.2)
    assert cli.gcluster("job", "cancel", "cpu-stuck").code == 0


def test_a_cpu_job_gets_no_topology(cli: Cli, cluster: Cluster) -> None:
    result = cli.gcluster(*cpu_submit(cluster, "cpu-topology", "--topology", "4x8"))
    assert result.code == 1
    assert "topology is not allowed for GPU and CPU jobs" in result.text
    assert job_status(cli, cluster, "cpu-topology") is None


def test_a_cpu_job_runs_on_cpu_np_as_the_workload_account(cli: Cli, cpu_queue_cluster: Cluster) -> None:
    cluster = cpu_queue_cluster
    result = cli.gcluster(
        *cpu_submit(
            cluster, "cpu-convert", "--service-account", "workload-identity-k8s-sa", "--await-job-completion"
        )
    )
    assert result.code == 0, result.text
    assert "qwen/max-text-format/0/commit_success.txt" in cli.objects(cluster.bucket, "qwen/max-text-format/")
    job = cli.job(cluster.project, cluster.region, cluster.name, "cpu-convert")
    assert job is not None
    pod = job["manifest"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu-np"}
    assert pod["serviceAccountName"] == "workload-identity-k8s-sa"
    assert "hostNetwork" not in pod
    (container,) = pod["containers"]
    assert container["resources"] == {"limits": {"cpu": "60"}}  # 95% of n4-standard-64's vCPUs, no TPU


def test_a_cpu_job_without_the_workload_identity_account_cannot_write(
    cli: Cli, cpu_queue_cluster: Cluster
) -> None:
    cluster = cpu_queue_cluster
    # the default Kubernetes account's Workload Identity principal may read the token, not write
    principal = (
        f"principal://iam.googleapis.com/projects/{project_number(cluster.project)}/locations/global/"
        f"workloadIdentityPools/{cluster.project}.svc.id.goog/subject/ns/default/sa/default"
    )
    granted = cli.gcloud(
        "secrets",
        "add-iam-policy-binding",
        cluster.secret,
        f"--project={cluster.project}",
        f"--member={principal}",
        "--role=roles/secretmanager.secretAccessor",
    )
    assert granted.code == 0, granted.text
    result = cli.gcluster(*cpu_submit(cluster, "cpu-default-ksa", "--await-job-completion"))
    assert result.code == 1
    text = cli.gcluster("job", "logs", "cpu-default-ksa", "--main-only").err
    assert "workloadIdentityPools" in text
    assert "/sa/default does not have storage.objects.create access" in text


def test_a_cpu_job_waits_while_the_cpu_quota_is_used(cli: Cli, names: dict[str, str], tmp_path: Path) -> None:
    """Kueue admits a CPU job only while the running ones leave it room in the queue's quota:
    with pathways_cpu_quota 100, a second 60-cpu job waits for the first."""
    import yaml

    folder = tmp_path / "blueprint"
    shutil.copytree(cli.info.blueprint.parent, folder)
    doc = yaml.safe_load(
        customize_blueprint(cli.info.blueprint.read_text(), PRESETS["qwen3-30b-a3b"].blueprint)
    )
    for group in doc["deployment_groups"]:
        for module in group["modules"]:
            if module["source"] == "modules/management/kubectl-apply":
                module["settings"]["kueue"]["config_template_vars"]["pathways_cpu_quota"] = 100
    edited = folder / cli.info.blueprint.name
    edited.write_text(yaml.safe_dump(doc, sort_keys=False))
    cluster = make_cluster(cli, names, edited)
    hold = tmp_path / "hold"
    hold.touch()
    ksa = ("--service-account", "workload-identity-k8s-sa")
    assert (
        cli.gcluster(
            *cpu_submit(cluster, "cpu-first", *ksa), env={"TPU_RL_SANDBOX_HOLD_FILE": str(hold)}
        ).code
        == 0
    )
    wait_for(lambda: job_status(cli, cluster, "cpu-first") == "Running", what="the first job admitted")
    assert cli.gcluster(*cpu_submit(cluster, "cpu-second", *ksa)).code == 0
    time.sleep(1.0)
    assert job_status(cli, cluster, "cpu-second") == "Suspended"
    hold.unlink()
    wait_for(lambda: job_status(cli, cluster, "cpu-second") == "Succeeded", what="the second job to run")


def test_a_converter_on_cpu_np_refuses_to_start_without_skip_jax_distributed_system(
    cli: Cli, cpu_queue_cluster: Cluster
) -> None:
    """A CPU node pool's pod has no TPU chips: MaxText's pyconfig looks for a JAX cluster there
    unless told to skip it, as on the CPU VM."""
    cluster = cpu_queue_cluster
    argv = cpu_submit(
        cluster, "cpu-no-skip", "--service-account", "workload-identity-k8s-sa", "--await-job-completion"
    )
    at = argv.index("--command") + 1
    argv[at] = argv[at].replace("skip_jax_distributed_system=true ", "").replace(" hardware=cpu", "")
    assert "skip_jax_distributed_system" not in argv[at]
    assert "hardware" not in argv[at]
    assert cli.gcluster(*argv).code == 1
    text = cli.gcluster("job", "logs", "cpu-no-skip", "--main-only").text
    assert "ValueError: coordinator_address should be defined." in text
    assert not cli.objects(cluster.bucket, "qwen/max-text-format/")
