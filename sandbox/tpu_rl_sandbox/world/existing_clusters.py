"""A GKE cluster made outside the provider (by a platform team), with or without each thing a run
needs of it, and another team's node pool and jobs on it.

Its record lives beside the clusters ``gcluster deploy`` makes (the ``clusters`` document), so the
fake ``gcloud container clusters describe``, the GKE API's ``clusters.get`` and the cluster's
Kubernetes API serve it the same way; ``made_outside`` marks it (no Terraform state names it).

What each field stands for, and where the real answer comes from:

- ``gke_version``: ``Cluster.currentMasterVersion`` (container v1).
- ``status``: ``Cluster.status`` (``RUNNING``, ``RECONCILING``, ``DEGRADED`` …).
- ``workload_pool``: ``Cluster.workloadIdentityConfig.workloadPool`` (absent: Workload Identity off;
  GKE's Workload Identity page: the pool of a project is ``PROJECT_ID.svc.id.goog``).
- ``autopilot``: ``Cluster.autopilot.enabled``.
- ``apis``: the ``group/version`` pairs its Kubernetes API serves beyond the built-in ones (a CRD's
  group is served once the CRD is installed: JobSet's ``jobset.x-k8s.io/v1alpha2``, Kueue's
  ``kueue.x-k8s.io/v1beta1``); a cluster ``gcluster deploy`` made serves both (its kubectl-apply
  module installs JobSet and Kueue).
- ``local_queues``: the Kueue LocalQueues of namespace ``default``; a ``gcluster deploy`` cluster
  has ``user-queue`` (kubectl-apply ``kueue/kueue-configuration-pathways.yaml.tftpl``, v1.95.0).

The other team's job is a JobSet in the ``jobs`` document like the ones ``gcluster job submit``
makes, admitted and running on the other team's pool; no job worker plays its pods (its program is
the other team's): it runs until someone deletes it, which no run of the provider may do.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from tpu_rl_sandbox.world.gke_nodes import DEFAULT_GKE_VERSION as DEFAULT_GKE_VERSION
from tpu_rl_sandbox.world.gke_nodes import gke_version as gke_version
from tpu_rl_sandbox.world.inventory import cluster_key
from tpu_rl_sandbox.world.store import StateStore
from tpu_rl_sandbox.world.timestamps import rfc3339

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
KUEUE_API = "kueue.x-k8s.io/v1beta1"
# Built-in groups every GKE API server serves (a subset: what a discovery reader may look for).
BUILT_IN_APIS = ("apps/v1", "batch/v1", "rbac.authorization.k8s.io/v1", "storage.k8s.io/v1")
TOOLKIT_LOCAL_QUEUE = "user-queue"
# The GKE version a cluster made today runs (what the sandbox's GKE API reports by default).
# The prerequisites a test may leave out, each a field of the record.
PREREQUISITES = (
    "running",
    "version",
    "workload_identity",
    "jobset",
    "kueue",
    "local_queue",
    "cpu_pool",
    "standard",
)


def served_apis(record: Mapping[str, Any]) -> tuple[str, ...]:
    """The ``group/version`` pairs the cluster's Kubernetes API serves."""
    extra = record.get("apis")
    return (*BUILT_IN_APIS, *(extra if extra is not None else (JOBSET_API, KUEUE_API)))


def local_queues(record: Mapping[str, Any]) -> list[str]:
    """The Kueue LocalQueues of namespace ``default`` (none when Kueue is not installed)."""
    if KUEUE_API not in served_apis(record):
        return []
    named = record.get("local_queues")
    if named is not None:
        return [str(q) for q in named]
    installed = (record.get("kueue") or {}).get("installed")
    return [TOOLKIT_LOCAL_QUEUE] if installed else []


def status(record: Mapping[str, Any]) -> str:
    if record.get("status"):
        return str(record["status"])
    return "RUNNING" if record.get("healthy", True) else "DEGRADED"


def workload_pool(record: Mapping[str, Any]) -> str | None:
    """The Workload Identity pool; a ``gcluster deploy`` cluster has its project's (the gke-cluster
    module sets ``workload_identity_config { workload_pool = "<project>.svc.id.goog" }``)."""
    if "workload_pool" in record:
        pool = record["workload_pool"]
        return str(pool) if pool else None
    return f"{record['project']}.svc.id.goog"


def workload_identity_config(record: Mapping[str, Any]) -> dict[str, Any]:
    """``workloadIdentityConfig`` as the container API returns it: absent when it is off."""
    pool = workload_pool(record)
    return {"workloadIdentityConfig": {"workloadPool": pool}} if pool else {}


def make_existing_cluster(
    store: StateStore,
    project: str,
    region: str,
    zone: str,
    name: str,
    *,
    missing: Iterable[str] = (),
    other_team_pool: str = "team-b-v6e",
    other_team_job: str = "team-b-train",
) -> dict[str, Any]:
    """Write a cluster a platform team made: a system pool, a CPU pool ``cpu-np``, another team's
    TPU pool with its running JobSet ``other_team_job`` (when JobSet is installed), Kueue with a
    ``team-queue`` LocalQueue, JobSet — less each of ``missing`` (:data:`PREREQUISITES`). Returns
    the record."""
    left_out = set(missing)
    unknown = left_out - set(PREREQUISITES)
    if unknown:
        raise ValueError(f"no such prerequisite: {sorted(unknown)}")
    apis = [api for api, need in ((JOBSET_API, "jobset"), (KUEUE_API, "kueue")) if need not in left_out]
    pools: list[dict[str, Any]] = [{"name": "default-pool", "machine_type": "e2-standard-8", "nodes": 2}]
    if "cpu_pool" not in left_out:
        pools.append({"name": "cpu-np", "machine_type": "n4-standard-64", "nodes": 1})
    if other_team_pool:
        pools.append(
            {
                "name": other_team_pool,
                "machine_type": "ct6e-standard-4t",
                "topology": "2x4",
                "nodes": 2,
                "zones": [zone],
                "node_labels": {"team": "b"},
                "resource_labels": {"team": "b"},
            }
        )
    record: dict[str, Any] = {
        "name": name,
        "project": project,
        "region": region,
        "zone": zone,
        "made_outside": True,
        "labels": {"owner": "platform-team"},
        "created": rfc3339(),
        "created_at": time.time(),
        "exists": True,
        "healthy": True,
        "status": "RUNNING" if "running" not in left_out else "RECONCILING",
        "gke_version": DEFAULT_GKE_VERSION if "version" not in left_out else "1.30.5-gke.1014000",
        "workload_pool": f"{project}.svc.id.goog" if "workload_identity" not in left_out else None,
        "autopilot": "standard" in left_out,
        "apis": apis,
        "local_queues": [] if "local_queue" in left_out else ["team-queue"],
        "kueue": {
            "installed": "kueue" not in left_out,
            "covered": ["google.com/tpu", "cpu", "memory"],
            # the ClusterQueue's nominal quotas: the toolkit's own Pathways Kueue template's defaults
            # (clis/gcluster/deploy.py KUEUE_TEMPLATE_DEFAULTS), as a team that followed it has them
            "quota": {"cpu": 480, "memory": "2000G", "google.com/tpu": "999999"},
        },
        "pathways": True,
        "workload_identity_ksa": "workload-identity-k8s-sa",
        "node_pools": pools,
    }
    key = cluster_key(project, region, name)
    with store.txn() as txn:
        clusters = txn.doc("clusters")
        if key in clusters and clusters[key].get("exists", True):
            raise ValueError(f"cluster {key} exists already")
        clusters[key] = record
        txn.save("clusters")
    if other_team_pool and other_team_job and JOBSET_API in apis:
        start_other_team_job(store, record, other_team_pool, other_team_job)
    return record


def start_other_team_job(
    store: StateStore, cluster: Mapping[str, Any], pool: str, name: str
) -> dict[str, Any]:
    """Another team's JobSet on its own v6e pool, admitted, its pods Running: created through the
    fake Kubernetes API as ``kubectl apply`` would, pinned to the pool by its nodeSelector (GKE's
    TPU node labels and ``cloud.google.com/gke-nodepool``). Returns the stored record."""
    from tpu_rl_sandbox.apis import kube_api  # the API layer (it imports this world, not the reverse)

    selector = {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "2x4",
        "cloud.google.com/gke-nodepool": pool,
    }
    manifest = {
        "apiVersion": kube_api.JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {"team": "b", kube_api.QUEUE_NAME_KEY: "team-queue"}},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "slice",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": 2,
                            "completions": 2,
                            "template": {
                                "spec": {
                                    "nodeSelector": selector,
                                    "containers": [
                                        {
                                            "name": "jax-tpu",
                                            "image": "us-docker.pkg.dev/team-b/train:latest",
                                            "command": ["python3", "train.py"],
                                        }
                                    ],
                                }
                            },
                        }
                    },
                }
            ]
        },
    }
    job = kube_api.create_jobset(
        store.layout,
        cluster,
        kube_api.DEFAULT_NAMESPACE,
        manifest,
        {"node_constraint": {"cloud.google.com/gke-nodepool": pool}, "topology": "2x4", "other_team": True},
    )
    now = rfc3339()
    pods = kube_api.plan_pods(job, 0)
    for pod in pods:
        pod["phase"] = "Running"
        pod["containers"] = [
            {"name": c["name"], "state": "running", "startedAt": now} for c in pod["containers"]
        ]
    with store.txn() as txn:
        jobs = txn.doc("jobs")
        stored = jobs[job["key"]]
        # Kueue admitted it (spec.suspend false) and its pods run: what the other team left running
        stored.update(suspended=False, admitted=now, status="Running", attempt=1, started=now, pods=pods)
        txn.save("jobs")
        return dict(stored)
