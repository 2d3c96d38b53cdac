"""Two GKE runs started at the same moment on one cluster a platform team runs, end to end in the
sandbox (``cluster_mode`` existing): both train and export; each creates and deletes only its own
node pools; another team's pool, its running job and the cluster itself are untouched.

The module's world is the platform team's: the cluster made outside the provider
(``make_existing_cluster``: a system pool, ``cpu-np``, another team's v6e pool with its JobSet
running, Kueue with one LocalQueue), and the grants docs/platform-teams.md asks of it, made with
gcloud before any run: the bucket and the HF token's secret, ``roles/storage.objectAdmin`` and
``roles/secretmanager.secretAccessor`` on them for the namespace's default Kubernetes service
account's Workload Identity principal (the conversions and the export) and for the runs' TPU pools'
node account (the Compute Engine default one: the runs name no ``node_service_account``).

Each run has its own AIRFLOW_HOME (two ``dags test`` processes never share one SQLite file); both
share the sandbox. One run names no CPU pool (it creates its own), the other the cluster's
``cpu-np``. Every assertion reads this one pair of runs (each ``dags test`` costs a minute of CPU).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from typing import Any

import pytest

from airflow_provider_tpu_rl.spec import GKE_DEFAULTS
from airflow_provider_tpu_rl.spec.pipeline import gke_pipeline_from_conf, run_suffix
from tests.support.harness import GKE_DAG_ID, RUN_TIMEOUT_SECONDS, Call, DagRunResult, E2EWorld
from tpu_rl_sandbox.world.calls import read_calls
from tpu_rl_sandbox.world.existing_clusters import make_existing_cluster
from tpu_rl_sandbox.world.gke_nodes import CLUSTER_LABEL, POOL_LABEL
from tpu_rl_sandbox.world.inventory import cluster_key, job_key, project_number
from tpu_rl_sandbox.world.store import StateStore

pytestmark = pytest.mark.e2e

PROJECT = "tpu-rl-e2e"
BUCKET = "tpu-rl-e2e-shared"
CLUSTER = "platform-team-tpu"
REGION, ZONE = str(GKE_DEFAULTS["region"]), str(GKE_DEFAULTS["zone"])
TEAM_POOLS = ["default-pool", "cpu-np", "team-b-v6e"]
OTHER_TEAM_POOL = "team-b-v6e"
# What the platform team set of a pool (the sandbox adds its own bookkeeping beside)
POOL_FIELDS = ("name", "machine_type", "nodes", "topology", "zones", "node_labels", "resource_labels")
OTHER_TEAM_JOB = "team-b-train"
# The namespace's default Kubernetes service account as IAM names it (GKE's Workload Identity
# Federation page: principal://iam.googleapis.com/projects/PROJECT_NUMBER/locations/global/
# workloadIdentityPools/PROJECT_ID.svc.id.goog/subject/ns/NAMESPACE/sa/KSA_NAME).
DEFAULT_KSA = (
    f"principal://iam.googleapis.com/projects/{project_number(PROJECT)}/locations/global/"
    f"workloadIdentityPools/{PROJECT}.svc.id.goog/subject/ns/default/sa/default"
)
# The pools' node account when a run names none: Compute Engine's default service account.
POOL_ACCOUNT = f"serviceAccount:{project_number(PROJECT)}-compute@developer.gserviceaccount.com"


def conf(run_name: str, **extra: Any) -> dict[str, Any]:
    return {
        "project": PROJECT,
        "bucket": BUCKET,
        "num_batches": 3,
        "run_name": run_name,
        "cluster_mode": "existing",
        "existing_cluster": f"{PROJECT}/{REGION}/{CLUSTER}",
        **extra,
    }


def gcloud(world: E2EWorld, *args: str) -> None:
    """One gcloud command as the platform team runs it (the sandbox's gcloud, its account)."""
    done = subprocess.run(
        ["gcloud", *args],
        env=world.env,
        cwd=world.root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"gcloud {' '.join(args)}: {done.stdout}{done.stderr}"


def platform_team_grants(world: E2EWorld, secret: str) -> None:
    """What docs/platform-teams.md asks a platform team to grant before runs use the cluster."""
    gcloud(
        world,
        "storage",
        "buckets",
        "create",
        f"gs://{BUCKET}",
        f"--project={PROJECT}",
        f"--location={REGION}",
    )
    gcloud(world, "secrets", "create", secret, f"--project={PROJECT}", "--replication-policy=automatic")
    for member in (DEFAULT_KSA, POOL_ACCOUNT):
        gcloud(
            world,
            "storage",
            "buckets",
            "add-iam-policy-binding",
            f"gs://{BUCKET}",
            f"--member={member}",
            "--role=roles/storage.objectAdmin",
        )
        gcloud(
            world,
            "secrets",
            "add-iam-policy-binding",
            secret,
            f"--project={PROJECT}",
            f"--member={member}",
            "--role=roles/secretmanager.secretAccessor",
        )


def team_pool_nodes(store: StateStore) -> list[str]:
    """The Compute Engine VMs of the other team's pool (its nodes), by name."""
    return sorted(
        name
        for name, vm in store.read("vms").items()
        if (vm.get("labels") or {}).get(CLUSTER_LABEL) == CLUSTER
        and (vm.get("labels") or {}).get(POOL_LABEL) == OTHER_TEAM_POOL
    )


def pool_name(call: Call) -> str:
    """The NAME of ``gcloud container node-pools create|delete NAME``."""
    return call.argv[3]


@pytest.fixture(scope="module")
def both(world: E2EWorld) -> dict[str, Any]:
    """Runs A (its own CPU pool) and B (the cluster's cpu-np) started together; the sandbox before and after."""
    store = StateStore(world.layout)
    make_existing_cluster(store, PROJECT, REGION, ZONE, CLUSTER, other_team_job=OTHER_TEAM_JOB)
    secret = gke_pipeline_from_conf(conf("x"), dag_id=GKE_DAG_ID, run_id="r").hf_token.secret_id
    platform_team_grants(world, secret)
    key = cluster_key(PROJECT, REGION, CLUSTER)
    before = store.read("clusters")[key]
    job_before = store.read("jobs")[job_key(PROJECT, REGION, CLUSTER, OTHER_TEAM_JOB)]
    calls_before = len(read_calls(world.layout))
    home = world.root / "second" / "airflow"
    home.mkdir(parents=True)
    shutil.copy2(world.home / "airflow.db", home / "airflow.db")
    second = E2EWorld(
        root=world.root / "second",
        sandbox=world.sandbox,
        home=home,
        env={**world.env, "AIRFLOW_HOME": str(home)},
    )
    results: dict[str, DagRunResult] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def run(name: str, where: E2EWorld, run_conf: dict[str, Any]) -> None:
        try:
            start.wait()
            # bounded as any run of the suite (RUN_TIMEOUT_SECONDS): beside a second `make test`
            # (load average 22), run B of the 2.11 leg still ran at 600 s, the module's former bound
            results[name] = where.run_dag(GKE_DAG_ID, run_conf)
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [
        threading.Thread(target=run, args=("a", world, conf("team-a")), daemon=True),
        threading.Thread(target=run, args=("b", second, conf("team-b", cpu_node_pool="cpu-np")), daemon=True),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=RUN_TIMEOUT_SECONDS + 60)
    if errors:
        raise errors[0]
    assert set(results) == {"a", "b"}, "a run did not end within its bound"
    calls = [
        Call(str(e["tool"]), tuple(e["argv"]), int(e["exit_code"]), float(e.get("start") or 0.0))
        for e in read_calls(world.layout)[calls_before:]
    ]
    return {
        "a": results["a"],
        "b": results["b"],
        "calls": calls,
        "cluster_before": before,
        "cluster_after": store.read("clusters")[key],
        "team_nodes_after": team_pool_nodes(store),
        "job_before": job_before,
        "job_after": store.read("jobs").get(job_key(PROJECT, REGION, CLUSTER, OTHER_TEAM_JOB)),
    }


def test_two_runs_at_once_on_an_existing_cluster_each_train_export_and_delete_only_their_own_pools(
    world: E2EWorld, both: dict[str, Any]
) -> None:
    a, b, calls = both["a"], both["b"], both["calls"]
    describe = f"{a.describe()}\n\n{b.describe()}"
    for run in (a, b):
        assert run.state == "success", run.describe()
        for task in ("preflight", "deploy_cluster", "deploy_tpu_pool", "convert_to_maxtext", "train"):
            assert run.task_state(task) == "success", (task, run.describe())
        for task in ("export_to_huggingface", "destroy_tpu_pool", "destroy_cluster"):
            assert run.task_state(task) == "success", (task, run.describe())
        # its own model, exported whole
        spec = gke_pipeline_from_conf(run.conf, dag_id=run.dag_id, run_id=run.run_id)
        assert world.hf_export_problems(spec.export.output_directory) == [], run.describe()
    suffix_a, suffix_b = (run_suffix(GKE_DAG_ID, run.run_id) for run in (a, b))
    assert suffix_a != suffix_b, describe
    own = {f"tpu-rl-{suffix_a}-tpu-0", f"tpu-rl-{suffix_a}-cpu", f"tpu-rl-{suffix_b}-tpu-0"}

    def pools(verb: str) -> list[str]:
        return sorted(
            pool_name(c)
            for c in calls
            if c.is_("gcloud", "container", "node-pools", verb) and c.exit_code == 0
        )

    # each pool created once and deleted once, by its run: no other pool was ever touched
    assert pools("create") == sorted(own), describe
    assert pools("delete") == sorted(own), describe
    touched = {pool_name(c) for c in calls if c.is_("gcloud", "container", "node-pools")}
    assert not touched & set(TEAM_POOLS), describe
    # the cluster was never deployed, destroyed nor deleted
    assert not [c for c in calls if c.is_("gcluster", "deploy") or c.is_("gcluster", "destroy")], describe
    assert not [c for c in calls if c.is_("gcloud", "container", "clusters", "delete")], describe
    # every job on this cluster; each run's training pinned to its own pools
    submits = [c for c in calls if c.is_("gcluster", "job", "submit")]
    assert submits, describe
    assert {c.flag("cluster") for c in submits} == {CLUSTER}, describe
    for suffix in (suffix_a, suffix_b):
        trains = [
            c
            for c in submits
            if "--pathways" in c.argv and f"--node-constraint=tpu-rl-run={suffix}" in c.argv
        ]
        assert trains, describe
    # the cluster, its pools and the other team's pool are as the platform team left them
    before, after = both["cluster_before"], both["cluster_after"]
    assert after.get("exists", True)
    assert after["status"] == "RUNNING"
    assert [p["name"] for p in after["node_pools"]] == TEAM_POOLS
    assert [{k: p.get(k) for k in POOL_FIELDS} for p in after["node_pools"]] == [
        {k: p.get(k) for k in POOL_FIELDS} for p in before["node_pools"]
    ]
    assert len(both["team_nodes_after"]) == 2, both["team_nodes_after"]  # its slice's two VMs, still there
    # the other team's job: the same JobSet (its uid), still admitted and running on its pool
    job_before, job_after = both["job_before"], both["job_after"]
    assert job_after is not None, "the other team's JobSet was deleted"
    assert job_after["uid"] == job_before["uid"]
    assert job_after["status"] == "Running"
    assert not job_after["suspended"]
    assert [(p["name"], p["phase"]) for p in job_after["pods"]] == [
        (p["name"], "Running") for p in job_before["pods"]
    ]
