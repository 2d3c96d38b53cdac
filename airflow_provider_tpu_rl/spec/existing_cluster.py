"""A GKE cluster the run does not own (``cluster_mode=existing``): what it must have, and the node
pools a run creates in it and may delete.

In *create* mode the run deploys the cluster with Cluster Toolkit and destroys it. In *existing*
mode a platform team made the cluster; the run creates only its own TPU node pool (and, when it
names no CPU pool, its own CPU pool), named and labelled after the run, and deletes only those.
Plain Python: the cluster's and the Kubernetes API's answers are read here, fetched elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.cluster import (
    FLEX_START,
    K8S_NAME,
    ON_DEMAND,
    RESERVATION,
    SPOT,
    GkeJobTarget,
    SliceShape,
)
from airflow_provider_tpu_rl.spec.errors import SpecError

CREATE: Final = "create"
EXISTING: Final = "existing"
CLUSTER_MODES: Final = (CREATE, EXISTING)

# container v1 Cluster.name (gcloud 528's generated container_v1_messages.py): "can be up to 40
# characters ... Lowercase letters, numbers, and hyphens only. Must start with a letter. Must end
# with a number or a letter." Direct (the API's own field docs). A Cluster Toolkit deployment name
# is shorter (20, rules.gke_cluster_name): the existing cluster was not made by the toolkit.
EXISTING_CLUSTER_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?$")
EXISTING_CLUSTER_RULE = (
    "PROJECT/LOCATION/NAME, e.g. my-project/us-east5/team-tpu (a GKE cluster of ≤ 40 characters)"
)
# The whole PROJECT/LOCATION/NAME (the form's pattern; ExistingCluster checks each part in one line).
EXISTING_CLUSTER_VALUE: Final = re.compile(
    "^{}/{}(?:-[a-z])?/{}$".format(
        *(p.pattern.strip("^$") for p in (rules.PROJECT_ID, rules.REGION, EXISTING_CLUSTER_NAME))
    )
)

# GKE versions (first that runs the feature):
# - TPU v6e: 1.31.2-gke.1115000 (GKE's TPU page, as Ray's "Start Google Cloud GKE Cluster with TPUs
#   for KubeRay" quotes it; second-hand, the same figure spec/preflight.py uses for the blueprint).
# - flex-start TPU node pools: 1.33.0-gke.1712000 (GKE "About flex-start provisioning mode",
#   kubernetes-engine/docs/concepts/dws: "To run TPUs, use GKE version 1.33.0-gke.1712000 or
#   later"; read through a mirror of the page, direct in wording).
V6E_MIN_VERSION: Final = (1, 31, 2, 1115000)
FLEX_START_MIN_VERSION: Final = (1, 33, 0, 1712000)

# The Kubernetes API groups the run's jobs need served, found by API discovery (GET /apis):
# - jobset.x-k8s.io/v1alpha2: every `gcluster job submit` creates a JobSet, the Pathways job too
#   (cluster-toolkit v1.95.0 pkg/orchestrator/gke/templates/jobset.tmpl, pathways_jobset.tmpl:
#   "apiVersion: jobset.x-k8s.io/v1alpha2"); no other controller for Pathways.
# - kueue.x-k8s.io/v1beta1: gcluster queues the JobSet on a Kueue LocalQueue of namespace default
#   (gke_job_orchestrator.go configureClusterEnvironment / checkLocalQueueExists: `kubectl get
#   localqueue NAME -n default`).
JOBSET_GROUP_VERSION: Final = "jobset.x-k8s.io/v1alpha2"
KUEUE_GROUP_VERSION: Final = "kueue.x-k8s.io/v1beta1"
QUEUE_NAMESPACE: Final = "default"
# What gcluster picks with no --queue and no LocalQueue at all (gke_job_orchestrator.go
# defaultLocalQueue); it then *prompts* to create queues — a run never lets it.
GCLUSTER_DEFAULT_QUEUE: Final = "multislice-queue"

# GCP permissions a run needs on an existing cluster (testIamPermissions on its project). GKE's "API
# permissions" reference (kubernetes-engine/docs/reference/api-permissions, direct):
# nodePools.create and nodePools.delete need container.clusters.update on the cluster, nodePools.get
# and list container.clusters.get; clusters.get with container.clusters.getCredentials to see its
# credentials; operations.get container.operations.get; a custom resource (a JobSet) POST/DELETE/GET
# container.thirdPartyObjects.create/delete/get. No container.clusters.create or .delete: the run
# never creates nor deletes the cluster. The role is the smallest predefined one that holds it.
EXISTING_CLUSTER_PERMISSIONS: Final = {
    "container.clusters.get": "roles/container.clusterViewer",
    "container.clusters.getCredentials": "roles/container.clusterViewer",
    "container.clusters.update": "roles/container.clusterAdmin",
    "container.operations.get": "roles/container.clusterAdmin",
    # `gcluster job submit/list/cancel` and the provider's reads through the Kubernetes API
    "container.thirdPartyObjects.create": "roles/container.developer",
    "container.thirdPartyObjects.delete": "roles/container.developer",
    "container.thirdPartyObjects.get": "roles/container.developer",
    "container.thirdPartyObjects.list": "roles/container.developer",
    "container.pods.list": "roles/container.developer",
    "container.pods.getLogs": "roles/container.developer",
}

TPU_POOL_PREFIX: Final = "tpu-rl-"
# The node labels (Kubernetes) and resource labels (the node VMs') of a run's own pools.
RUN_LABEL: Final = "tpu-rl-run"
MANAGED_LABEL: Final = "tpu-rl-managed"
BUCKET_LABEL: Final = "tpu-rl-bucket"
POOL_ROLE_LABEL: Final = "tpu-rl-pool"
TPU_POOL_ROLE: Final = "tpu"
CPU_POOL_ROLE: Final = "cpu"

# An ordered capacity (``["spot", "on-demand"]``) falls through on a cluster the provider deploys
# (its TPU node pool's blueprint group, operators/gke.py); a run's own node pool on a cluster it does
# not own is created with one kind.
EXISTING_ONE_KIND: Final = (
    "cluster_mode existing takes one capacity kind with capacity_route pools: its node pool's create "
    "does not fall through an ordered list; give the one kind, or set capacity_route to "
    "compute-class (GKE chooses among the kinds)"
)


# How the run's TPU nodes come (``capacity_route``): ``pools``, its own node pools created with
# gcloud (one kind); ``compute-class``, one GKE ComputeClass whose priorities are the ordered
# capacity kinds, GKE auto-creating a node pool for the first it can get.
POOLS_ROUTE: Final = "pools"
COMPUTE_CLASS_ROUTE: Final = "compute-class"
CAPACITY_ROUTES: Final = (POOLS_ROUTE, COMPUTE_CLASS_ROUTE)
# The provider's blueprint creates its TPU pool itself and leaves Cluster Toolkit gke-cluster's
# ``cluster_autoscaling`` (node auto-provisioning, v1.95.0 modules/scheduler/gke-cluster/README.md)
# off: nothing there would auto-create a pool for a ComputeClass.
COMPUTE_CLASS_CREATE_MODE: Final = (
    "compute-class is for cluster_mode existing: the provider's own cluster creates its TPU pool "
    "itself and has no node pool auto-creation for a ComputeClass; use pools (its create falls "
    "through the ordered capacity)"
)

# ComputeClass (GKE's CRD reference, kubernetes-engine/docs/reference/crds/computeclass, direct):
# apiVersion cloud.google.com/v1, kind ComputeClass, cluster-scoped (its example has no namespace);
# a Pod asks for one with the node selector cloud.google.com/compute-class: NAME ("About custom
# compute classes", direct). Versions (first that runs the feature):
# - custom ComputeClasses in Standard clusters: 1.30.3-gke.1451000 ("About custom compute classes":
#   "available ... in version 1.30.3-gke.1451000 and later", direct);
# - nodePoolAutoCreation in a ComputeClass of a Standard cluster without cluster-level node
#   auto-provisioning: 1.33.3-gke.1136000 (Google's gke-compute-classes skill, github google/skills
#   skills/cloud/gke-compute-classes/SKILL.md, quoting GKE's "Configure node pool auto-creation";
#   second-hand); node auto-provisioning of TPU v6e (Trillium): 1.31.1-gke.1146000 (GKE "Use node
#   auto-provisioning", direct);
# - flexStart in a ComputeClass priority for TPUs: flex-start TPU nodes need 1.33.0-gke.1712000
#   (FLEX_START_MIN_VERSION above), later than both: the one this route checks with flex-start.
COMPUTE_CLASS_GROUP_VERSION: Final = "cloud.google.com/v1"
COMPUTE_CLASS_PLURAL: Final = "computeclasses"
COMPUTE_CLASS_LABEL: Final = "cloud.google.com/compute-class"
COMPUTE_CLASS_MIN_VERSION: Final = (1, 30, 3, 1451000)
AUTO_CREATION_MIN_VERSION: Final = (1, 33, 3, 1136000)

# The GKE node labels that say which kind a node is (each a node selector GKE documents):
# - cloud.google.com/gke-spot: "true" on Spot VM nodes (GKE "Spot VMs", direct);
# - cloud.google.com/gke-flex-start: "true" on flex-start nodes (GKE "About flex-start provisioning
#   mode", kubernetes-engine/docs/concepts/dws, its node selector; direct in wording);
# - cloud.google.com/reservation-name: the reservation a node consumes (GKE "Consuming reserved
#   zonal resources", its node selector for a specific reservation; direct in wording).
SPOT_NODE_LABEL: Final = "cloud.google.com/gke-spot"
FLEX_START_NODE_LABEL: Final = "cloud.google.com/gke-flex-start"
RESERVATION_NODE_LABEL: Final = "cloud.google.com/reservation-name"


def capacity_route(value: Any) -> str:
    """``pools`` or ``compute-class`` (one line if not)."""
    return rules.one_of("capacity_route", value, CAPACITY_ROUTES)


def compute_class_name(suffix: str) -> str:
    """The run's ComputeClass: ``tpu-rl-<run suffix>`` (a Kubernetes name, like its pools')."""
    return f"{TPU_POOL_PREFIX}{suffix}"


def compute_class_is_runs(obj: Mapping[str, Any] | None, suffix: str, bucket: str | None = None) -> bool:
    """Whether a ComputeClass object is provably run ``suffix``'s: its derived name and its labels
    (the run, the provider and, with ``bucket``, the run's bucket) — as :func:`pool_is_runs`."""
    if not obj:
        return False
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if meta.get("name") != compute_class_name(suffix):
        return False
    if bucket is not None and labels.get(BUCKET_LABEL) != bucket_label_value(bucket):
        return False
    return labels.get(RUN_LABEL) == suffix and labels.get(MANAGED_LABEL) == "true"


def served_kind(node_labels: Mapping[str, Any]) -> str:
    """The capacity kind a node is, from its GKE labels (on-demand: none of spot, flex-start,
    reservation)."""
    if str(node_labels.get(SPOT_NODE_LABEL, "")).lower() == "true":
        return SPOT
    if str(node_labels.get(FLEX_START_NODE_LABEL, "")).lower() == "true":
        return FLEX_START
    if node_labels.get(RESERVATION_NODE_LABEL):
        return RESERVATION
    return ON_DEMAND


@dataclass(frozen=True)
class ExistingCluster:
    """A GKE cluster the run names and neither deploys nor destroys."""

    project: str
    location: str
    name: str

    def __post_init__(self) -> None:
        rules.project_id("existing_cluster", self.project)
        if not (rules.REGION.fullmatch(self.location) or rules.ZONE.fullmatch(self.location)):
            raise SpecError(
                "existing_cluster", "the location must be a region or a zone, e.g. us-east5", self.location
            )
        rules.match("existing_cluster", self.name, EXISTING_CLUSTER_NAME, EXISTING_CLUSTER_RULE)

    @property
    def where(self) -> str:
        return f"{self.project}/{self.location}/{self.name}"

    @property
    def region(self) -> str:
        found = rules.ZONE.fullmatch(self.location)
        return found.group(1) if found else self.location


def parse_existing_cluster(value: Any) -> ExistingCluster:
    """``PROJECT/LOCATION/NAME`` → :class:`ExistingCluster` (one line if not)."""
    text = rules.require_str("existing_cluster", value)
    parts = text.split("/")
    if len(parts) != 3:
        raise SpecError("existing_cluster", f"must be {EXISTING_CLUSTER_RULE}", text)
    return ExistingCluster(*parts)


def cluster_mode(value: Any) -> str:
    """``create`` or ``existing`` (one line if not)."""
    return rules.one_of("cluster_mode", value, CLUSTER_MODES)


def tpu_pool_name(suffix: str, index: int) -> str:
    """The run's ``index``-th TPU node pool: ``tpu-rl-<run suffix>-tpu-<index>``."""
    return _pool_name(f"{TPU_POOL_PREFIX}{suffix}-tpu-{index}")


def cpu_pool_name(suffix: str) -> str:
    """The run's own CPU node pool (when it names none): ``tpu-rl-<run suffix>-cpu``."""
    return _pool_name(f"{TPU_POOL_PREFIX}{suffix}-cpu")


def _pool_name(name: str) -> str:
    rules.match("node_pool", name, K8S_NAME, "a node pool name like tpu-rl-1a2b3c-tpu-0")
    return rules.max_len("node_pool", name, 40)


@dataclass(frozen=True)
class RunPools:
    """The node pools one run creates in an existing cluster, and the labels that prove them its."""

    cluster: ExistingCluster
    suffix: str
    zone: str
    shape: SliceShape
    num_slices: int = 1
    # a CPU node pool of the cluster's the conversions run on; empty: the run creates its own
    cpu_pool: str = ""

    def __post_init__(self) -> None:
        rules.match("run_suffix", self.suffix, re.compile(r"^[0-9a-f]{6}$"), "six hex characters")
        rules.zone("zone", self.zone, self.cluster.region)
        rules.int_range("num_slices", self.num_slices, 1, 64)
        if self.cpu_pool:
            rules.match("cpu_node_pool", self.cpu_pool, K8S_NAME, "a node pool name like cpu-np")

    @property
    def tpu_pools(self) -> tuple[str, ...]:
        return tuple(tpu_pool_name(self.suffix, i) for i in range(self.num_slices))

    @property
    def created_cpu_pool(self) -> str:
        """The CPU pool the run creates (empty: it uses the cluster's ``cpu_pool``)."""
        return "" if self.cpu_pool else cpu_pool_name(self.suffix)

    @property
    def conversion_pool(self) -> str:
        return self.cpu_pool or cpu_pool_name(self.suffix)

    @property
    def owned(self) -> tuple[str, ...]:
        """Every pool this run creates, and so the only ones it may delete."""
        return (*self.tpu_pools, *((self.created_cpu_pool,) if self.created_cpu_pool else ()))

    def node_labels(self, role: str) -> dict[str, str]:
        """The Kubernetes labels of the pool's nodes (what a job's node selector may match)."""
        return {RUN_LABEL: self.suffix, POOL_ROLE_LABEL: role}


def pool_is_runs(pool: Mapping[str, Any], suffix: str, bucket: str | None = None) -> bool:
    """Whether a container v1 ``NodePool`` is provably run ``suffix``'s: one of its derived names,
    and its nodes' resource labels and Kubernetes labels both say the run and the provider. With
    ``bucket`` (the run's), the pool's bucket label must name it too (absent only when the bucket
    cannot be a label value): two Airflow deployments whose DAG and run ids match, and so whose
    suffixes do, never take each other's pools."""
    name = str(pool.get("name") or "")
    if not name.startswith(f"{TPU_POOL_PREFIX}{suffix}-"):
        return False
    config = pool.get("config") or {}
    resource = config.get("resourceLabels") or {}
    node = config.get("labels") or {}
    if bucket is not None and resource.get(BUCKET_LABEL) != bucket_label_value(bucket):
        return False
    return (
        resource.get(RUN_LABEL) == suffix
        and resource.get(MANAGED_LABEL) == "true"
        and node.get(RUN_LABEL) == suffix
    )


def bucket_label_value(bucket: str) -> str | None:
    """The bucket label a resource of a run in ``bucket`` carries: the name, or none when the name
    cannot be a label value (dotted names; labels are ``[a-z0-9_-]{1,63}``)."""
    return bucket if re.fullmatch(r"[a-z0-9_-]{1,63}", bucket) else None


def runs_pools(pools: Iterable[Mapping[str, Any]], suffix: str) -> list[str]:
    """The names of the pools in ``pools`` that are provably run ``suffix``'s (:func:`pool_is_runs`)."""
    return [str(p["name"]) for p in pools if pool_is_runs(p, suffix)]


_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-gke\.(\d+))?")


def gke_version(text: Any) -> tuple[int, int, int, int] | None:
    """``1.33.2-gke.1240000`` → ``(1, 33, 2, 1240000)``; None when it is not a GKE version."""
    found = _VERSION.match(str(text or ""))
    if found is None:
        return None
    major, minor, patch, gke = found.groups()
    return int(major), int(minor), int(patch), int(gke or 0)


def _version_text(version: tuple[int, int, int, int]) -> str:
    return f"{version[0]}.{version[1]}.{version[2]}-gke.{version[3]}"


@dataclass(frozen=True)
class ClusterNeeds:
    """What the run needs of the existing cluster (``capacities``: the ordered kinds of the
    ``compute-class`` route, its ComputeClass's priorities; empty on the ``pools`` route)."""

    cluster: ExistingCluster
    capacity: str
    cpu_pool: str = ""
    queue: str = ""
    capacities: tuple[str, ...] = ()


# The container v1 ClusterAutoscaling of ``clusters describe`` (gcloud 528's generated
# container_v1_messages.py: ``enableNodeAutoprovisioning``, ``resourceLimits`` of
# ``ResourceLimit{resourceType, minimum, maximum}``; direct). GKE's "Configure node pool
# auto-creation" (direct): "Any resource limits that you set for the cluster when you enable node
# auto-provisioning also apply to the node pools that GKE creates for ComputeClasses"; an
# accelerator with no limit there is one auto-provisioning may not create (GKE "Use node
# auto-provisioning", its accelerator limits; second-hand for TPUs).
def _auto_provisioning_blocks_tpus(described: Mapping[str, Any]) -> bool:
    autoscaling = described.get("autoscaling") or {}
    if not autoscaling.get("enableNodeAutoprovisioning"):
        return False
    limits = [r for r in autoscaling.get("resourceLimits") or [] if isinstance(r, Mapping)]
    return not any(
        str(r.get("resourceType")) == "tpu-v6e-slice" and int(r.get("maximum") or 0) > 0 for r in limits
    )


def compute_class_problems(needs: ClusterNeeds, described: Mapping[str, Any]) -> list[str]:
    """One line per thing the ``compute-class`` route needs of the cluster and it lacks: a GKE whose
    ComputeClasses create their own node pools (and that runs flex-start TPUs when a priority is
    flex-start), and no node auto-provisioning limits that leave TPU v6e out."""
    where = needs.cluster.where
    problems: list[str] = []
    version = gke_version(described.get("currentMasterVersion"))
    upgrade = (
        f"upgrade its control plane (gcloud container clusters upgrade {needs.cluster.name} --master "
        f"--location={needs.cluster.location} --cluster-version=...), or set capacity_route to pools"
    )
    shown = described.get("currentMasterVersion") or "of no known version"
    if version is None or version < AUTO_CREATION_MIN_VERSION:
        problems.append(
            f"cluster {where} runs GKE {shown}, older than {_version_text(AUTO_CREATION_MIN_VERSION)}, the "
            f"first whose ComputeClass creates its own node pools (nodePoolAutoCreation): {upgrade}"
        )
    if _auto_provisioning_blocks_tpus(described):
        problems.append(
            f"cluster {where} has node auto-provisioning on with no tpu-v6e-slice resource limit: its "
            "limits apply to the node pools GKE creates for a ComputeClass, so none of TPU v6e can be "
            "made; add a tpu-v6e-slice limit to its auto-provisioning, or set capacity_route to pools"
        )
    return problems


def cluster_problems(needs: ClusterNeeds, described: Mapping[str, Any] | None) -> list[str]:
    """One line per prerequisite the container v1 ``Cluster`` (``gcloud container clusters
    describe --format=json``) lacks, each naming what is missing and how to add it."""
    where = needs.cluster.where
    if described is None:
        return [
            f"cluster {where} does not exist (or this connection cannot see it): name a GKE cluster "
            "that exists, or set cluster_mode to create"
        ]
    problems: list[str] = []
    status = described.get("status")
    if status != "RUNNING":
        problems.append(
            f"cluster {where} is {status or 'in no known state'}, not RUNNING: wait until it is "
            "RUNNING (an upgrade or repair in progress ends) and run again"
        )
    if (described.get("autopilot") or {}).get("enabled"):
        problems.append(
            f"cluster {where} is an Autopilot cluster: it takes no node pool of the run's; use a "
            "Standard cluster"
        )
    version = gke_version(described.get("currentMasterVersion"))
    flex = FLEX_START in (needs.capacities or (needs.capacity,))
    minimum = FLEX_START_MIN_VERSION if flex else V6E_MIN_VERSION
    what = "flex-start TPU node pools" if flex else "TPU v6e"
    if version is None or version < minimum:
        problems.append(
            f"cluster {where} runs GKE {described.get('currentMasterVersion') or 'of no known version'}, "
            f"older than {_version_text(minimum)}, the first with {what}: upgrade its control plane "
            f"(gcloud container clusters upgrade {needs.cluster.name} --master "
            f"--location={needs.cluster.location} --cluster-version=...)"
        )
    if needs.capacities:
        problems += compute_class_problems(needs, described)
    pool = (described.get("workloadIdentityConfig") or {}).get("workloadPool")
    expected = f"{needs.cluster.project}.svc.id.goog"
    if pool != expected:
        problems.append(
            f"cluster {where} has Workload Identity off (no workload pool {expected}): the run's "
            f"pods read the HF token and the bucket through it; turn it on (gcloud container clusters "
            f"update {needs.cluster.name} --location={needs.cluster.location} --workload-pool={expected})"
        )
    if needs.cpu_pool:
        pools = {str(p.get("name")): p for p in described.get("nodePools") or [] if isinstance(p, Mapping)}
        found = pools.get(needs.cpu_pool)
        if found is None:
            problems.append(
                f"cluster {where} has no node pool {needs.cpu_pool} for the conversions and the export: "
                "name a CPU node pool it has in cpu_node_pool, or leave it empty (the run creates and "
                "deletes its own)"
            )
        elif str((found.get("config") or {}).get("machineType", "")).startswith("ct"):
            problems.append(
                f"cluster {where}'s node pool {needs.cpu_pool} is a TPU pool: cpu_node_pool must name a "
                "CPU node pool"
            )
    return problems


def served_group_versions(discovery: Mapping[str, Any]) -> set[str]:
    """The ``group/version`` pairs of an API discovery ``APIGroupList`` (``GET /apis``)."""
    served: set[str] = set()
    for group in discovery.get("groups") or []:
        if not isinstance(group, Mapping):
            continue
        for version in group.get("versions") or []:
            if isinstance(version, Mapping) and version.get("groupVersion"):
                served.add(str(version["groupVersion"]))
    return served


def kubernetes_problems(
    needs: ClusterNeeds, served: set[str], local_queues: Sequence[str] | None
) -> tuple[list[str], str | None]:
    """One line per controller or queue the run's jobs lack, and the LocalQueue they go to (None
    when anything is refused).

    ``local_queues``: the LocalQueues of namespace ``default`` (None: Kueue is not served)."""
    where = needs.cluster.where
    problems: list[str] = []
    if JOBSET_GROUP_VERSION not in served:
        problems.append(
            f"cluster {where} serves no {JOBSET_GROUP_VERSION} API: install the JobSet controller "
            "(kubernetes-sigs/jobset's release manifests); every job of the run is a JobSet"
        )
    if KUEUE_GROUP_VERSION not in served or local_queues is None:
        problems.append(
            f"cluster {where} serves no {KUEUE_GROUP_VERSION} API: install Kueue "
            "(kubernetes-sigs/kueue's release manifests) with a ClusterQueue and a LocalQueue in "
            f"namespace {QUEUE_NAMESPACE}; gcluster queues every job on one"
        )
        return problems, None
    if needs.queue:
        if needs.queue in local_queues:
            return problems, None if problems else needs.queue
        problems.append(
            f"cluster {where} has no LocalQueue {needs.queue} in namespace {QUEUE_NAMESPACE} (it has: "
            f"{', '.join(local_queues) or 'none'}): create it, or name one of those in kueue_queue"
        )
        return problems, None
    if len(local_queues) == 1:
        return problems, None if problems else local_queues[0]
    if not local_queues:
        problems.append(
            f"cluster {where} has no Kueue LocalQueue in namespace {QUEUE_NAMESPACE}: create one "
            "(pointing at a ClusterQueue with TPU v6e quota) and name it in kueue_queue"
        )
    else:
        problems.append(
            f"cluster {where} has several LocalQueues in namespace {QUEUE_NAMESPACE} "
            f"({', '.join(local_queues)}): name the one the run may use in kueue_queue"
        )
    return problems, None


def job_target_on(
    target: GkeJobTarget,
    cluster: ExistingCluster,
    suffix: str,
    cpu_pool: str = "",
    queue: str = "",
    route: str = POOLS_ROUTE,
) -> GkeJobTarget:
    """A job's target moved onto the existing cluster: a TPU job on the run's own pool(s) (their
    ``tpu-rl-run`` node label: every slice's pool carries it) with its Pathways head on the CPU
    pool, a CPU job on the CPU pool (``cpu_pool``, else the run's own); both queued on ``queue``
    (empty: the only LocalQueue). With the ``compute-class`` route a TPU job selects the run's
    ComputeClass (``cloud.google.com/compute-class``) instead: GKE makes its nodes. A CPU job runs
    as the namespace's default Kubernetes service account: the create mode's Workload Identity
    account is the toolkit cluster's."""
    if queue:
        rules.match("kueue_queue", queue, K8S_NAME, "a Kubernetes name like team-queue")
    conversion_pool = cpu_pool or cpu_pool_name(suffix)
    moved = replace(
        target, project=cluster.project, location=cluster.location, cluster_name=cluster.name, queue=queue
    )
    if target.tpu:
        selects = (
            (COMPUTE_CLASS_LABEL, compute_class_name(suffix))
            if capacity_route(route) == COMPUTE_CLASS_ROUTE
            else (RUN_LABEL, suffix)
        )
        return replace(moved, node_pool="", node_constraints=(selects,), head_node_pool=conversion_pool)
    return replace(moved, node_pool=conversion_pool, service_account="", node_constraints=())
