"""A GKE TPU node pool's node VMs: Compute Engine instances (``world/instances.py``) that GKE
creates with the pool and deletes with it, labelled as GKE labels them.

Labels: the pool's resource labels (cluster-toolkit ``modules/compute/gke-node-pool/main.tf``:
``resource_labels = local.labels``, the blueprint's ``vars.labels`` merged with ``ghpc_module`` and
``ghpc_role``; container v1 ``NodeConfig.resourceLabels``: "The resource labels for the node pool
to use to annotate any related Google Compute Engine resources"), and GKE's own:
``goog-k8s-cluster-name``, ``goog-k8s-node-pool-name``, ``goog-k8s-cluster-location`` (the keys
Cloud Billing's cost table documents for GKE resources) and ``goog-gke-node`` (seen on real node
VMs). Names: a managed instance group's ``baseInstanceName`` and "a hyphen and a random
four-character string" (compute v1 ``InstanceGroupManager``); the base is ``gke-<cluster>-<pool>-
<8 hex>`` (GKE's own pattern, as node names show it, cut so the base stays within the API's 58
characters). TPU nodes, in a managed instance group, start PENDING (instance lifecycle page).

The sandbox makes node VMs for the TPU node pools only (the capacity the ledger bills as TPU); its
pools do not autoscale, so a pool's nodes come with the pool and go with it, but for a flex-start
pool in a zone without flex-start capacity (``tpu_capacity_out``): created empty, its scale-up
failing for every pod that asks for it (``scale_up_failure``, apis/kube_api.py ``create_pod``).
A flex-start pool with capacity gets its nodes at its create, where GKE adds them when the first
pod asks: the sandbox bills them from a few minutes early.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tpu_rl_sandbox.world import instances
from tpu_rl_sandbox.world.inventory import project_number

CLUSTER_LABEL = "goog-k8s-cluster-name"
POOL_LABEL = "goog-k8s-node-pool-name"
LOCATION_LABEL = "goog-k8s-cluster-location"
NODE_LABEL = "goog-gke-node"
# The node labels a TPU pod's nodeSelector asks for (GKE's TPU node labels, as gcluster writes them)
TPU_ACCELERATOR_SELECTOR = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_SELECTOR = "cloud.google.com/gke-tpu-topology"
FINISHED_PHASES = ("Succeeded", "Failed")
_BASE_LIMIT = 58


def is_tpu_pool(pool: dict[str, Any]) -> bool:
    return bool(pool.get("topology")) and not pool.get("failed")


def base_instance_name(cluster: str, pool: str) -> str:
    """``gke-<cluster>-<pool>-<8 hex>``, its parts cut to fit the API's 58 characters."""
    import secrets  # here and below: only a pool's creation names nodes

    suffix = secrets.token_hex(4)
    room = _BASE_LIMIT - len("gke---") - len(suffix)
    cluster_part = cluster[: max(1, room // 2)]
    pool_part = pool[: max(1, room - len(cluster_part))]
    return f"gke-{cluster_part}-{pool_part}-{suffix}".replace("--", "-")


def _random_suffix() -> str:
    import secrets
    import string

    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(4))


def node_labels(cluster: dict[str, Any], pool: dict[str, Any]) -> dict[str, str]:
    """The node VMs' labels: a toolkit pool's (the blueprint's labels and ghpc_*), or a pool
    ``gcloud container node-pools create --labels`` made (its own resource labels), and GKE's."""
    if pool.get("resource_labels") is not None:
        labels = {str(k): str(v) for k, v in pool["resource_labels"].items()}
    else:
        labels = {str(k): str(v) for k, v in (cluster.get("labels") or {}).items()}
        labels.update({"ghpc_module": "gke-node-pool", "ghpc_role": "compute"})
    labels.update(
        {
            CLUSTER_LABEL: str(cluster["name"]),
            POOL_LABEL: str(pool["name"]),
            LOCATION_LABEL: str(cluster.get("region") or ""),
            NODE_LABEL: "",
        }
    )
    return labels


def pool_zone(cluster: dict[str, Any], pool: dict[str, Any]) -> str:
    zones = pool.get("zones")
    return str(zones[0]) if isinstance(zones, list) and zones else str(cluster.get("zone") or "")


def provisioning_model(pool: dict[str, Any]) -> str:
    option = pool.get("consumption") or {}
    if option.get("enable_flex_start"):
        return "FLEX_START"
    return "SPOT" if option.get("spot") else "STANDARD"


def create_nodes(
    txn: Any,
    cluster: dict[str, Any],
    pool: dict[str, Any],
    *,
    begin: float,
    minute_seconds: float,
    overrides: dict[str, float],
) -> float:
    """Insert the pool's node VMs (one zone operation each, by GKE's service agent) and schedule
    their states; the moment they all run. The operations end when the nodes run
    (:func:`finish_creates`)."""
    project, zone = str(cluster["project"]), pool_zone(cluster, pool)
    base = base_instance_name(str(cluster["name"]), str(pool["name"]))
    pool["base_instance_name"] = base
    phases = instances.start_phases(
        minute_seconds,
        overrides,
        machine_type=str(pool["machine_type"]),
        provisioning_model=provisioning_model(pool),
        created=True,
    )
    vms = txn.doc("vms")
    running_at = begin
    for _ in range(int(pool.get("nodes") or 1)):
        name = f"{base}-{_random_suffix()}"
        record: dict[str, Any] = {
            "name": name,
            "id": instances.new_id(),
            "project": project,
            "zone": zone,
            "status": phases[0][0],
            "machineType": str(pool["machine_type"]),
            "network": f"{cluster['name']}-net-0",
            "labels": node_labels(cluster, pool),
            "scopes": ["cloud-platform"],
            "serviceAccount": pool.get("service_account", ""),
            "image": {"project": "gke-node-images", "family": None, "image": "cos"},
            "bootDiskSize": "100GB",
            "scheduling": {"provisioningModel": provisioning_model(pool), "onHostMaintenance": "TERMINATE"},
            "reservationAffinity": {"type": "none", "reservation": None},
            "created": instances.api_time(begin),
            "gke_node": True,
        }
        running_at = max(running_at, instances.schedule(record, phases, begin))
        record["operation"] = instances.add_operation(
            txn, project, zone, "insert", name, record["id"], started=begin, user=_service_agent(project)
        )["name"]
        vms[f"{project}/{zone}/{name}"] = record
    txn.save("vms")
    return running_at


def finish_creates(txn: Any, cluster: dict[str, Any], pool: dict[str, Any], running_at: float) -> None:
    """The pool's node VMs run: their insert operations are done."""
    for key, record in _nodes(txn, cluster, pool):
        instances.settle(record, running_at)
        op_name = record.pop("operation", None)
        if op_name:
            instances.finish_operation(txn, record["project"], record["zone"], op_name, running_at)
        txn.doc("vms")[key] = record
    txn.save("vms")


def begin_deletes(txn: Any, cluster: dict[str, Any], pool: dict[str, Any], begin: float) -> list[str]:
    """The managed instance group deletes the pool's node VMs: each goes STOPPING (its billing ends)
    with its delete operation; the keys of those deleted."""
    deleting: list[str] = []
    for key, record in _nodes(txn, cluster, pool):
        instances.settle(record, begin)
        instances.schedule(record, [("STOPPING", 0.0)], begin)
        instances.settle(record, begin)
        record["operation"] = instances.add_operation(
            txn,
            record["project"],
            record["zone"],
            "delete",
            record["name"],
            str(record["id"]),
            started=begin,
            user=_service_agent(str(record["project"])),
        )["name"]
        deleting.append(key)
    txn.save("vms")
    return deleting


def finish_deletes(txn: Any, keys: list[str], ended: float) -> None:
    """The node VMs ``keys`` are gone; their delete operations are done."""
    vms = txn.doc("vms")
    for key in keys:
        record = vms.pop(key, None)
        if record is not None and record.get("operation"):
            instances.finish_operation(txn, record["project"], record["zone"], record["operation"], ended)
    txn.save("vms")


def _nodes(txn: Any, cluster: dict[str, Any], pool: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (key, record)
        for key, record in txn.doc("vms").items()
        if (record.get("labels") or {}).get(CLUSTER_LABEL) == cluster["name"]
        and (record.get("labels") or {}).get(POOL_LABEL) == pool["name"]
        and record.get("project") == cluster["project"]
    ]


def running_pod_graces(
    jobs: Iterable[Mapping[str, Any]], cluster_key: str, pool: Mapping[str, Any]
) -> list[int | float | None]:
    """The ``terminationGracePeriodSeconds`` (None where the pod spec leaves it unset) of each pod
    of the cluster's JobSets that is still on the TPU pool's nodes: not finished (Succeeded,
    Failed), its nodeSelector asking for a TPU accelerator and, where it names one, the pool's
    topology. What the pool's drain waits for (:func:`~tpu_rl_sandbox.world.timescale.drain_seconds`)."""
    graces: list[int | float | None] = []
    for job in jobs:
        if job.get("cluster_key") != cluster_key:
            continue
        specs: dict[str, Mapping[str, Any]] = {}
        for rjob in ((job.get("manifest") or {}).get("spec") or {}).get("replicatedJobs") or []:
            template = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")
            specs[str(rjob.get("name"))] = template or {}
        for pod in job.get("pods") or []:
            if pod.get("phase") in FINISHED_PHASES:
                continue
            spec = specs.get(str(pod.get("replicatedJob")), {})
            selector = spec.get("nodeSelector") or {}
            if TPU_ACCELERATOR_SELECTOR not in selector:
                continue
            topology = selector.get(TPU_TOPOLOGY_SELECTOR)
            if topology and pool.get("topology") and str(topology) != str(pool["topology"]):
                continue
            grace = spec.get("terminationGracePeriodSeconds")
            graces.append(grace if isinstance(grace, int | float) and not isinstance(grace, bool) else None)
    return graces


def has_nodes(txn: Any, cluster: dict[str, Any], pool: dict[str, Any]) -> bool:
    return bool(_nodes(txn, cluster, pool))


def _service_agent(project: str) -> str:
    """Who a node VM's operations run as: the managed instance group's Google APIs service agent."""
    return f"{project_number(project)}@cloudservices.gserviceaccount.com"


def record_pool_events(
    txn: Any, key: str, before: list[dict[str, Any]], after: list[dict[str, Any]], now: float
) -> None:
    """Record node pools created (in ``after`` only) and deleted (in ``before`` only) at ``now``;
    a TPU pool that came or went without its node VMs (a deploy or destroy of the whole cluster)
    gets them or loses them at once."""
    cluster = txn.doc("clusters").get(key)
    if cluster is not None:
        kept = {p["name"] for p in after}
        for pool in after:
            # a flex-start pool whose scale-up fails stays empty (clis/gcluster/deploy.py)
            if is_tpu_pool(pool) and not pool.get("scale_up_failure") and not has_nodes(txn, cluster, pool):
                finish_creates(
                    txn,
                    cluster,
                    pool,
                    create_nodes(txn, cluster, pool, begin=now, minute_seconds=0.0, overrides={}),
                )
        for pool in before:
            if pool["name"] not in kept:
                finish_deletes(txn, begin_deletes(txn, cluster, pool, now), now)
    events = txn.doc("node_pool_events")
    rows = events.setdefault("events", [])
    old, new = {p["name"] for p in before}, {p["name"] for p in after}
    for name in sorted(new - old):
        rows.append({"cluster": key, "pool": name, "created_at": now, "deleted_at": None})
    for name in sorted(old - new):
        for row in rows:
            if row["cluster"] == key and row["pool"] == name and row["deleted_at"] is None:
                row["deleted_at"] = now
    txn.save("node_pool_events")


def pool_node_labels(pool: dict[str, Any]) -> dict[str, str]:
    """A pool's nodes' labels: its own (``--node-labels``) and GKE's ``cloud.google.com/gke-nodepool``."""
    return {**(pool.get("node_labels") or {}), "cloud.google.com/gke-nodepool": str(pool.get("name"))}


def matching_tpu_pool(cluster: dict[str, Any], job: dict[str, Any]) -> dict[str, Any] | None:
    """The TPU pool a job's pods land on: the first whose nodes carry every label of the job's
    nodeSelector (``--node-constraint``) and its slice shape. The kube-scheduler places a pod
    "only onto nodes that have each of the labels you specify" (Kubernetes, "Assigning Pods to
    Nodes", nodeSelector; direct); none: its pods stay Pending."""
    wanted = dict(job.get("node_constraint") or {})
    for pool in cluster.get("node_pools", []):
        if not pool.get("topology") or pool.get("failed"):
            continue
        if job.get("topology") and pool.get("topology") != job.get("topology"):
            continue
        labels = pool_node_labels(pool)
        if all(labels.get(key) == value for key, value in wanted.items()):
            return pool
    return None


DEFAULT_GKE_VERSION = "1.35.1-gke.1000"


def gke_version(record: Mapping[str, Any]) -> str:
    return str(record.get("gke_version") or DEFAULT_GKE_VERSION)
