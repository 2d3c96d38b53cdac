"""The fake cloud's inventory in the sandbox state: project numbers, GKE clusters (keys, records,
node pools, service accounts), job keys, and which project a bucket belongs to."""

from __future__ import annotations

import hashlib
from typing import Any

from tpu_rl_sandbox.world.store import StateStore


def project_number(project: str) -> str:
    """A stable 12-digit project number for ``project``."""
    return str(100_000_000_000 + int(hashlib.sha256(project.encode()).hexdigest()[:10], 16) % 900_000_000_000)


def cluster_key(project: str, region: str, name: str) -> str:
    return f"{project}/{region}/{name}"


def job_key(project: str, location: str, cluster: str, name: str) -> str:
    return f"{project}/{location}/{cluster}/{name}"


def cluster_service_accounts(project: str, deployment: str) -> dict[str, str]:
    """E-mails of the service accounts the GKE blueprint creates (``<name>-gke-np-sa`` etc.)."""
    return {
        "node_pool": f"{deployment}-gke-np-sa@{project}.iam.gserviceaccount.com",
        "workload": f"{deployment}-gke-wl-sa@{project}.iam.gserviceaccount.com",
    }


def find_cluster(store: StateStore, project: str, location: str, name: str) -> dict[str, Any] | None:
    """The cluster with ``name`` in ``project`` whose location (region) is ``location``."""
    clusters = store.read("clusters")
    found = clusters.get(cluster_key(project, location, name))
    if found is not None and found.get("exists", True):
        return found
    return None


def bucket_project(store: StateStore, bucket: str) -> str | None:
    """The project a bucket was created in (``gcloud storage buckets create``), if known."""
    record = store.read("buckets").get(bucket)
    return None if record is None else record.get("project")


def gke_node_pools(record: dict[str, Any]) -> list[dict[str, Any]]:
    """container v1 ``NodePool`` resources (JSON, camelCase) of a fake cluster record."""
    return [
        {
            "name": pool["name"],
            "config": {
                "machineType": pool["machine_type"],
                "serviceAccount": pool.get("service_account", ""),
                # NodeConfig.gcfsConfig: image streaming, shown when the pool turns it on
                **({"gcfsConfig": {"enabled": True}} if pool.get("enable_gcfs") else {}),
                # NodeConfig.labels (Kubernetes node labels) and .resourceLabels (the node VMs'),
                # as ``gcloud container node-pools create --node-labels / --labels`` set them
                **({"labels": dict(pool["node_labels"])} if pool.get("node_labels") else {}),
                **({"resourceLabels": dict(pool["resource_labels"])} if pool.get("resource_labels") else {}),
            },
            "initialNodeCount": pool.get("nodes", 1),
            "status": ("ERROR" if pool.get("failed") else "RUNNING"),
            **(
                {"placementPolicy": {"tpuTopology": pool["topology"], "type": "COMPACT"}}
                if pool.get("topology")
                else {}
            ),
        }
        for pool in record.get("node_pools", [])
    ]


def external_ip(name: str) -> str:
    """The external IPv4 address of a fake VM or cluster endpoint named ``name`` (stable)."""
    digest = hashlib.sha256(name.encode()).digest()
    return f"34.{digest[0]}.{digest[1]}.{digest[2] or 1}"


PODS_DOC = "pods"


def cluster_jobs(store: StateStore, cluster_key: str) -> list[dict[str, Any]]:
    """The JobSet records of one cluster."""
    return [job for job in store.read("jobs").values() if job.get("cluster_key") == cluster_key]
