"""Specs → argv for a run on a GKE cluster it does not own (``cluster_mode=existing``).

The run's own node pools are created and deleted with ``gcloud container node-pools``, not a
pool-only Cluster Toolkit blueprint: cluster-toolkit's ``pre-existing-gke-cluster`` module (v1.95.0
``modules/scheduler/pre-existing-gke-cluster``) does fit ``gke-node-pool``, but every deployment
keeps its Terraform state and a deployment folder, and ``gcluster destroy`` of it is the only way
back; one ``node-pools delete`` of a pool the run can prove its own is the smaller thing to trust
on a cluster other teams use. The flags mirror the settings the Cluster Toolkit TPU pool gets for
each capacity (``render/blueprint.py`` ``capacity_settings``; gke-node-pool's main.tf preconditions:
flex-start with ``auto_repair`` off, no static node count, no reservation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_tpu_rl.render.blueprint import V6E_ACCELERATOR
from airflow_provider_tpu_rl.render.command import ApiCall, Command
from airflow_provider_tpu_rl.render.gke import (
    CAPACITY_PROBE_IMAGE,
    CAPACITY_PROBE_LABEL,
    CAPACITY_PROBE_NAMESPACE,
    TPU_RESOURCE,
)
from airflow_provider_tpu_rl.render.shell import key_values
from airflow_provider_tpu_rl.spec.cluster import FLEX_START, ON_DEMAND, RESERVATION, SPOT
from airflow_provider_tpu_rl.spec.existing_cluster import (
    COMPUTE_CLASS_GROUP_VERSION,
    COMPUTE_CLASS_LABEL,
    COMPUTE_CLASS_PLURAL,
    CPU_POOL_ROLE,
    TPU_POOL_ROLE,
    ExistingCluster,
    RunPools,
    compute_class_name,
)

# What the container API answers for a node pool (or its cluster) that does not exist: gcloud's
# HttpException "ResponseError: code=404, message=Not found: ..." (googlecloudsdk/api_lib/container
# /util.py, the same form the sandbox's clusters describe prints).
POOL_GONE = ("code=404",)
# The CPU pool a run creates when it names none: the machine the conversions need (spec/cluster.py
# CPU_COMPUTE_TYPE: n4-standard-64, the advanced blueprint's cpu-np), one node, no autoscaling.
CPU_POOL_NODES = 1


def _scope(cluster: ExistingCluster) -> tuple[str, ...]:
    return (f"--cluster={cluster.name}", f"--location={cluster.location}", f"--project={cluster.project}")


def describe_cluster(cluster: ExistingCluster) -> Command:
    """The container v1 ``Cluster`` as JSON: status, version, Workload Identity, node pools."""
    return Command(
        (
            "gcloud",
            "container",
            "clusters",
            "describe",
            cluster.name,
            f"--location={cluster.location}",
            f"--project={cluster.project}",
            "--format=json",
        ),
        description=f"read cluster {cluster.where} (status, GKE version, Workload Identity, node pools)",
    )


def list_pools(cluster: ExistingCluster) -> Command:
    """The cluster's node pools as JSON (names and labels: which are a run's)."""
    return Command(
        ("gcloud", "container", "node-pools", "list", *_scope(cluster), "--format=json"),
        description=f"list cluster {cluster.where}'s node pools (a run deletes only those labelled its own)",
    )


# ``--labels`` sets the node VMs' resource labels (NodeConfig.resourceLabels: gcloud 528
# api_lib/container/api_adapter.py _AddLabelsToNodeConfig), ``--node-labels`` the Kubernetes labels
# of its nodes (NodeConfig.labels, _AddNodeLabelsToNodeConfig); spec/existing_cluster.py
# pool_is_runs reads both back from the NodePool.
def _labels_flag(flag: str, labels: Mapping[str, str]) -> str:
    return f"{flag}={','.join(key_values(tuple(sorted(labels.items()))))}"


def capacity_flags(capacity: str, reservation: str, vms: int) -> tuple[str, ...]:
    """How the TPU pool is provisioned, as the Cluster Toolkit TPU pool would be for ``capacity``."""
    if capacity == ON_DEMAND:
        return (f"--num-nodes={vms}", "--reservation-affinity=none")
    if capacity == RESERVATION:
        return (f"--num-nodes={vms}", "--reservation-affinity=specific", f"--reservation={reservation}")
    if capacity == SPOT:
        return (f"--num-nodes={vms}", "--spot", "--reservation-affinity=none")
    if capacity == FLEX_START:
        # starts empty, scales up to its slice when the training's pods ask for it
        return (
            "--flex-start",
            "--reservation-affinity=none",
            "--no-enable-autorepair",
            "--enable-autoscaling",
            "--num-nodes=0",
            "--min-nodes=0",
            f"--max-nodes={vms}",
            "--location-policy=ANY",
        )
    raise ValueError(f"no node pool flags for capacity {capacity!r}")


def _service_account_flag(service_account: str) -> tuple[str, ...]:
    """``--service-account``: who the pool's nodes run as — and so who a TPU pod is to Google APIs
    (TPU pods use the host network); empty: the Compute Engine default service account."""
    return (f"--service-account={service_account}",) if service_account else ()


def create_tpu_pool(
    pools: RunPools,
    index: int,
    *,
    capacity: str,
    reservation: str,
    labels: Mapping[str, str],
    service_account: str = "",
) -> Command:
    """The run's ``index``-th TPU slice: a node pool named after the run, its node VMs carrying the
    run's resource ``labels`` (the janitor's) and its nodes the run's Kubernetes labels."""
    name = pools.tpu_pools[index]
    return Command(
        (
            "gcloud",
            "container",
            "node-pools",
            "create",
            name,
            *_scope(pools.cluster),
            f"--node-locations={pools.zone}",
            f"--machine-type={pools.shape.compute_type}",
            f"--tpu-topology={pools.shape.topology}",
            *capacity_flags(capacity, reservation, pools.shape.vms),
            *_service_account_flag(service_account),
            "--workload-metadata=GKE_METADATA",
            _labels_flag("--node-labels", pools.node_labels(TPU_POOL_ROLE)),
            _labels_flag("--labels", labels),
        ),
        description=f"create this run's TPU node pool {name} ({pools.shape.tpu_type}, {capacity}) in "
        f"cluster {pools.cluster.where}",
    )


def create_cpu_pool(
    pools: RunPools, machine_type: str, labels: Mapping[str, str], service_account: str = ""
) -> Command:
    """The run's own CPU pool (the conversions and the export), when it names none of the cluster's."""
    name = pools.created_cpu_pool
    if not name:
        raise ValueError("the run uses the cluster's CPU pool: it creates none")
    return Command(
        (
            "gcloud",
            "container",
            "node-pools",
            "create",
            name,
            *_scope(pools.cluster),
            f"--node-locations={pools.zone}",
            f"--machine-type={machine_type}",
            f"--num-nodes={CPU_POOL_NODES}",
            *_service_account_flag(service_account),
            "--workload-metadata=GKE_METADATA",
            _labels_flag("--node-labels", pools.node_labels(CPU_POOL_ROLE)),
            _labels_flag("--labels", labels),
        ),
        description=f"create this run's CPU node pool {name} ({machine_type}) in cluster {pools.cluster.where}",
    )


def delete_pool(cluster: ExistingCluster, name: str) -> Command:
    """Delete one node pool the run proved its own; one already gone is success."""
    return Command(
        ("gcloud", "container", "node-pools", "delete", name, *_scope(cluster), "--quiet"),
        ok_if_output_contains=POOL_GONE,
        description=f"delete this run's node pool {name} (the cluster {cluster.where} is never deleted)",
    )


# ---------------------------------------------------------------------------------------------
# The ComputeClass route (capacity_route compute-class): one ComputeClass, the run's ordered
# capacity kinds its priorities, GKE auto-creating a node pool for the first it can get. Fields
# from GKE's ComputeClass CRD reference (kubernetes-engine/docs/reference/crds/computeclass,
# direct) and the TPU compute-class page ("Provision TPUs using custom compute classes"):
# - ``priorities[].tpu``: ``type`` (the accelerator node label's value, tpu-v6e-slice), ``count``
#   (TPU chips per node) and ``topology`` (the slice's);
# - ``spot: true`` (Spot VMs), ``flexStart.enabled: true`` (flex-start), ``reservations``:
#   ``affinity: Specific`` with ``specific: [{name}]`` (one reservation by name; the reference's
#   example, direct), ``affinity: None`` (on-demand: consume none, as the pools route's
#   ``--reservation-affinity=none``; the reference's third value beside Specific and AnyBestEffort,
#   as we read it: not seen in a stored copy, second-hand);
# - ``priorityDefaults.location.zones``: the zones new nodes go to (the run's one zone);
# - ``nodePoolAutoCreation.enabled: true``: GKE creates the node pools itself;
# - ``whenUnsatisfiable: DoNotScaleUp``: no node outside the priorities when none can be had (the
#   pods stay pending; the reference's other value, ScaleUpAnyway, would create a default one).
def _priority(kind: str, reservation: str, pools: RunPools) -> dict[str, Any]:
    tpu = {"type": V6E_ACCELERATOR, "count": pools.shape.chips_per_vm, "topology": pools.shape.topology}
    if kind == SPOT:
        return {"tpu": tpu, "spot": True}
    if kind == FLEX_START:
        return {"tpu": tpu, "flexStart": {"enabled": True}}
    if kind == RESERVATION:
        return {"tpu": tpu, "reservations": {"affinity": "Specific", "specific": [{"name": reservation}]}}
    if kind == ON_DEMAND:
        return {"tpu": tpu, "reservations": {"affinity": "None"}}
    raise ValueError(f"no ComputeClass priority for capacity {kind!r}")


def compute_class(
    pools: RunPools, capacities: Sequence[str], reservation: str, labels: Mapping[str, str]
) -> dict[str, Any]:
    """The run's ComputeClass: named after the run, labelled as its pools (``labels``, the node
    VMs' resource labels: run, provider, bucket, expiry), one priority per capacity kind in order."""
    if not capacities:
        raise ValueError("a ComputeClass needs at least one capacity kind")
    return {
        "apiVersion": COMPUTE_CLASS_GROUP_VERSION,
        "kind": "ComputeClass",
        "metadata": {"name": compute_class_name(pools.suffix), "labels": dict(sorted(labels.items()))},
        "spec": {
            "priorities": [_priority(kind, reservation, pools) for kind in capacities],
            "priorityDefaults": {"location": {"zones": [pools.zone]}},
            "nodePoolAutoCreation": {"enabled": True},
            "whenUnsatisfiable": "DoNotScaleUp",
        },
    }


def _compute_class_url(name: str = "") -> str:
    base = f"/apis/{COMPUTE_CLASS_GROUP_VERSION}/{COMPUTE_CLASS_PLURAL}"
    return f"{base}/{name}" if name else base


def apply_compute_class(manifest: Mapping[str, Any]) -> ApiCall:
    """The Kubernetes API request that creates the run's ComputeClass (cluster-scoped)."""
    return ApiCall(
        "POST",
        _compute_class_url(),
        manifest,
        description=f"create this run's ComputeClass {manifest['metadata']['name']} (GKE auto-creates "
        "a TPU node pool for its first priority it can get when the training's pods ask for it)",
    )


def delete_compute_class(pools: RunPools) -> ApiCall:
    """The request that deletes the run's ComputeClass, made only when its labels say it is the run's."""
    name = compute_class_name(pools.suffix)
    return ApiCall(
        "DELETE",
        _compute_class_url(name),
        description=f"delete this run's ComputeClass {name} when its labels name the run (GKE removes "
        "the node pools it auto-created once their nodes are empty)",
    )


def compute_class_probe_name(pools: RunPools) -> str:
    """The placeholder pod that asks the run's ComputeClass for its first node."""
    return f"{compute_class_name(pools.suffix)}-capacity-probe"


def compute_class_probe_pod(pools: RunPools) -> dict[str, Any]:
    """A placeholder pod selecting the run's ComputeClass (``cloud.google.com/compute-class``) and
    asking for one node's TPU chips: GKE auto-creates a node pool for the first priority it can
    get, and the node it lands on says which kind that was. Deleted once read."""
    chips = {TPU_RESOURCE: str(pools.shape.chips_per_vm)}
    name = compute_class_name(pools.suffix)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": compute_class_probe_name(pools),
            "namespace": CAPACITY_PROBE_NAMESPACE,
            "labels": {CAPACITY_PROBE_LABEL: name},
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {COMPUTE_CLASS_LABEL: name},
            "tolerations": [{"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "placeholder",
                    "image": CAPACITY_PROBE_IMAGE,
                    "resources": {"requests": dict(chips), "limits": dict(chips)},
                }
            ],
        },
    }
