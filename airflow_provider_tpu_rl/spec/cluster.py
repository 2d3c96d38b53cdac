"""The GKE cluster (Cluster Toolkit deployment) and the single-host TPU VM."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, dataclass, field, replace
from types import MappingProxyType
from typing import Any, ClassVar, Final, Self

from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.spec.presets import BlueprintEdits

CHIPS_PER_VM: Final = MappingProxyType({"ct6e-standard-1t": 1, "ct6e-standard-4t": 4, "ct6e-standard-8t": 8})
# v6e slice shapes (chips = product of the topology).
V6E_TOPOLOGIES: Final = frozenset({"1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"})
SYSTEM_MACHINE_TYPE = rules.re.compile(r"^[a-z][a-z0-9]*-[a-z]+(?:-[0-9]+)?$")
# Where the CPU programs (the checkpoint conversions) run on the GKE cluster: the CPU node pool the
# advanced blueprint's gke-cluster module adds for Pathways (`enable_pathways_for_tpus`:
# google_container_node_pool "cpu_np", n4-standard-64, autoscaling 0-100), as the Kubernetes
# service account `configure_workload_identity_sa` binds to the workload service account
# (Workload Identity; CPU pods get no host network, so not the node's account).
CPU_COMPUTE_TYPE: Final = "n4-standard-64"
CPU_NODE_POOL: Final = "cpu-np"
WORKLOAD_KSA: Final = "workload-identity-k8s-sa"
NODE_POOL_LABEL: Final = "cloud.google.com/gke-nodepool"
K8S_NAME = rules.re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# A node label as gcluster's --node-constraint takes it (a key of the provider's, a label value).
NODE_CONSTRAINT = rules.re.compile(
    r"^[a-z0-9.-]+(?:/[a-z0-9-]+)?=[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
# How the TPUs are provisioned: on demand (no reservation, the list price), from a reservation (the
# seeds), as Spot VMs (preemptible, no reservation) or with DWS flex-start (queued until capacity is
# free, then a bounded run time).
ON_DEMAND: Final = "on-demand"
RESERVATION: Final = "reservation"
SPOT: Final = "spot"
FLEX_START: Final = "flex-start"
CAPACITIES: Final = (ON_DEMAND, RESERVATION, SPOT, FLEX_START)


# The boot disk type the provider renders (``--boot-disk-type``) for each machine series it creates
# VMs of. Compute Engine's default is pd-standard (compute v1 AttachedDiskInitializeParams.diskType,
# gcloud 528's generated compute_v1_messages.py: "If not specified, the default is pd-standard"), an
# HDD that reads a >10 GB image slowly, and some series take no Persistent Disk at all:
# - ct6e (TPU v6e): Hyperdisk Balanced. Cloud TPU "Storage options for TPU data"
#   (docs.cloud.google.com/tpu/docs/storage-options): v6e supports Hyperdisk Balanced and Hyperdisk
#   ML, "Persistent Disk is not supported for the latest machine series, including Cloud TPU v6e";
#   Compute Engine "About Hyperdisk Balanced": Hyperdisk Balanced (and its HA variant) are the only
#   Hyperdisk boot disk types, "including for TPU VMs". Direct: Google's pages.
# - n4, c4: Hyperdisk only. Indirect: Red Hat OpenShift's GCP PD CSI page ("regular persistent disks
#   are not available on N4/C3 VMs"), nextflow-io/nextflow#6841 ("C4, C4A, C4D, N4, N4A, N4D ... do
#   not support pd-balanced"), DataBiosphere/dsub#301 (n4 with pd-standard refused by the API).
# - c3: Hyperdisk Balanced, which every source agrees it takes (GoogleCloudPlatform/cluster-toolkit
#   #1601 refuses only pd-standard on c3; Red Hat says no Persistent Disk at all).
# - n1, n2, n2d, e2: Balanced Persistent Disk (SSD-backed). Compute Engine "Storage options": "for
#   earlier generation machine series, the most common solution is ... a Balanced Persistent Disk";
#   its Hyperdisk page lists no Hyperdisk Balanced for them (nextflow#6841 reads it the same way).
# A series not listed is refused (one line): a guessed type fails the create or is the slow default.
HYPERDISK_BALANCED: Final = "hyperdisk-balanced"
PD_BALANCED: Final = "pd-balanced"
BOOT_DISK_TYPES: Final = MappingProxyType(
    {
        "ct6e": HYPERDISK_BALANCED,
        "n4": HYPERDISK_BALANCED,
        "c4": HYPERDISK_BALANCED,
        "c3": HYPERDISK_BALANCED,
        "n1": PD_BALANCED,
        "n2": PD_BALANCED,
        "n2d": PD_BALANCED,
        "e2": PD_BALANCED,
    }
)


def boot_disk_type(name: str, machine_type: str) -> str:
    """The boot disk type of ``machine_type``'s series (:data:`BOOT_DISK_TYPES`); a series it does not
    list is refused in one line, ``name`` the field."""
    series = machine_type.split("-", 1)[0]
    if series not in BOOT_DISK_TYPES:
        raise SpecError(
            name,
            f"machine series {series} has no known boot disk type; use one of {sorted(BOOT_DISK_TYPES)}",
            machine_type,
        )
    return BOOT_DISK_TYPES[series]


def capacity_order(value: object) -> tuple[str, ...]:
    """``capacity`` as the ordered kinds a create tries: one kind (a string, today's meaning), or a
    list of them tried in order (each refused for lack of capacity moves to the next). One line
    each for an empty list, a kind not in :data:`CAPACITIES` and a kind listed twice."""
    if isinstance(value, str):
        kinds: tuple[object, ...] = (value,)
    elif isinstance(value, list | tuple):
        if not value:
            raise SpecError(
                "capacity", "an empty list names no capacity: give one kind or an ordered list", value
            )
        kinds = tuple(value)
    else:
        raise SpecError("capacity", f"must be one of {list(CAPACITIES)} or an ordered list of them", value)
    for kind in kinds:
        if kind not in CAPACITIES:
            raise SpecError("capacity", f"must be one of {list(CAPACITIES)}", kind)
    for index, kind in enumerate(kinds):
        if kind in kinds[:index]:
            raise SpecError("capacity", f"{kind} is listed twice: each kind is tried once", kind)
    return tuple(str(kind) for kind in kinds)


FALLBACK: Final = "capacity_fallback"


def with_fallback(capacity: object, fallback: object) -> tuple[str, ...]:
    """The ordered kinds of ``capacity`` (:func:`capacity_order`) followed by those of
    ``capacity_fallback``: the kinds tried after it, in order. The forms' one-kind-per-line field
    leaves blank lines and spaces, which mean nothing here; null is no fallback. One line naming
    ``capacity_fallback`` for an unknown kind or one tried already."""
    kinds = capacity_order(capacity)
    if fallback is None:
        return kinds
    if not isinstance(fallback, list | tuple) or not all(isinstance(k, str) for k in fallback):
        raise SpecError(FALLBACK, "must be a list of capacity kinds, one a line in the form", fallback)
    for kind in (k.strip() for k in fallback if k.strip()):
        if kind not in CAPACITIES:
            raise SpecError(FALLBACK, f"must list kinds of {list(CAPACITIES)}", kind)
        if kind in kinds:
            raise SpecError(
                FALLBACK,
                f"{kind} is tried already (capacity, or listed twice): each kind is tried once",
                kind,
            )
        kinds = (*kinds, kind)
    return kinds


def capacity_value(kinds: tuple[str, ...]) -> str | list[str]:
    """The conf's spelling of ``kinds``: the kind itself when there is one, else the ordered list."""
    return kinds[0] if len(kinds) == 1 else list(kinds)


def check_capacity(capacity: object, reservation: str) -> str | list[str]:
    """``capacity`` (one kind of :data:`CAPACITIES` or an ordered list, :func:`capacity_order`)
    agrees with ``reservation`` (one line if not): only ``reservation`` consumes one. Returns the
    conf's spelling (:func:`capacity_value`)."""
    kinds = capacity_order(capacity)
    if RESERVATION not in kinds and reservation:
        named = kinds[0] if len(kinds) == 1 else ", ".join(kinds)
        raise SpecError(
            "capacity",
            f"{named} capacity consumes no reservation: clear reservation ({reservation}) "
            f"or set capacity to {RESERVATION}" + ("" if len(kinds) == 1 else " or list it"),
            capacity_value(kinds),
        )
    return capacity_value(kinds)


def require_reservation_name(capacity: object, reservation: str | None) -> None:
    """``reservation`` capacity (alone or in the list) names its reservation (one line if not):
    what creates the TPUs."""
    kinds = capacity_order(capacity)
    if RESERVATION in kinds and not reservation:
        raise SpecError(
            "capacity",
            f"{RESERVATION} capacity needs a reservation: name it in reservation, or set capacity to "
            f"{ON_DEMAND} (no reservation)"
            + ("" if len(kinds) == 1 else f" or leave {RESERVATION} out of the list"),
            capacity_value(kinds),
        )


def default_capacity(reservation: str | None) -> str:
    """The capacity of a create that names none: the reservation's when one is named, else on-demand."""
    return RESERVATION if reservation else ON_DEMAND


class OrderedCapacity:
    """The ordered capacity of a TPU create (a GKE TPU node pool, a TPU VM): ``capacity`` first,
    then the kinds of ``fallback``. Mixed into frozen dataclasses (``replace`` makes an attempt)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]
    capacity: str
    fallback: tuple[str, ...]
    reservation: str

    @property
    def capacities(self) -> tuple[str, ...]:
        """The kinds its create tries, in order: ``capacity``, then ``fallback``."""
        return (self.capacity, *self.fallback)

    def attempt(self, kind: str) -> Self:
        """This spec as one attempt of its create with ``kind`` alone (the reservation only with
        ``reservation``)."""
        reservation = self.reservation if kind == RESERVATION else ""
        return replace(self, capacity=kind, fallback=(), reservation=reservation)


@dataclass(frozen=True)
class SliceShape:
    """A TPU v6e slice: compute type x topology, checked for consistency."""

    compute_type: str
    topology: str

    def __post_init__(self) -> None:
        if self.compute_type not in CHIPS_PER_VM:
            raise SpecError("compute_type", f"must be one of {sorted(CHIPS_PER_VM)}", self.compute_type)
        rules.match("topology", self.topology, rules.TOPOLOGY, "topology must look like 4x8")
        if self.topology not in V6E_TOPOLOGIES:
            raise SpecError(
                "topology", f"not a v6e slice shape; choose one of {sorted(V6E_TOPOLOGIES)}", self.topology
            )
        per_vm = CHIPS_PER_VM[self.compute_type]
        chips = self.chips
        if chips > 8 and per_vm != 4:
            raise SpecError(
                "topology",
                f"multi-host v6e-{chips} ({self.topology}) needs ct6e-standard-4t VMs, not {self.compute_type}",
                self.topology,
            )
        if chips <= 8 and per_vm != chips:
            raise SpecError(
                "topology",
                f"single-host v6e-{chips} ({self.topology}) needs a VM with {chips} chips, "
                f"{self.compute_type} has {per_vm}",
                self.topology,
            )

    @property
    def chips(self) -> int:
        a, b = self.topology.split("x")
        return int(a) * int(b)

    @property
    def chips_per_vm(self) -> int:
        return CHIPS_PER_VM[self.compute_type]

    @property
    def vms(self) -> int:
        return self.chips // self.chips_per_vm

    @property
    def tpu_type(self) -> str:
        return f"v6e-{self.chips}"


def _labels(value: Mapping[str, str]) -> MappingProxyType[str, str]:
    for key, val in value.items():
        rules.match("labels", key, rules.GCE_NAME, "label keys must match [a-z]([-a-z0-9]{0,61}[a-z0-9])?")
        rules.match("labels", val, rules.LABEL_VALUE, "label values must match [a-z0-9_-]{0,63}")
    return MappingProxyType(dict(value))


@dataclass(frozen=True)
class ClusterSpec(OrderedCapacity):
    """A Cluster Toolkit GKE deployment with one or more TPU v6e slices."""

    project: str
    region: str
    zone: str
    cluster_name: str
    bucket: str
    reservation: str = ""
    capacity: str = ON_DEMAND
    # the kinds the TPU node pool's deploy falls through to, in order (``capacity`` refused first)
    fallback: tuple[str, ...] = ()
    compute_type: str = "ct6e-standard-4t"
    topology: str = "4x8"
    num_slices: int = 1
    authorized_cidr: str = "0.0.0.0/0"
    blueprint: BlueprintEdits = field(default_factory=BlueprintEdits)
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rules.project_id("project", self.project)
        rules.region("region", self.region)
        rules.zone("zone", self.zone, self.region)
        rules.gke_cluster_name("cluster_name", self.cluster_name)
        rules.bucket_name("bucket", self.bucket)
        if self.reservation:
            rules.gce_name("reservation", self.reservation, "reservation name")
        else:
            rules.require_str("reservation", self.reservation)
        # an ordered list given as ``capacity`` is split into the first kind and its fallback
        kinds = capacity_order(self.capacity) + tuple(self.fallback)
        object.__setattr__(self, "capacity", kinds[0])
        object.__setattr__(self, "fallback", kinds[1:])
        check_capacity(list(kinds), self.reservation)
        require_reservation_name(list(kinds), self.reservation)
        SliceShape(self.compute_type, self.topology)
        rules.int_range("num_slices", self.num_slices, 1, 64)
        rules.cidr("authorized_cidr", self.authorized_cidr)
        if self.blueprint.system_node_pool_machine_type is not None:
            rules.match(
                "system_node_pool_machine_type",
                self.blueprint.system_node_pool_machine_type,
                SYSTEM_MACHINE_TYPE,
                "machine type must look like e2-standard-8",
            )
        object.__setattr__(self, "labels", _labels(self.labels))

    @property
    def shape(self) -> SliceShape:
        return SliceShape(self.compute_type, self.topology)

    @property
    def total_chips(self) -> int:
        return self.shape.chips * self.num_slices

    @property
    def workload_service_account(self) -> str:
        return f"{self.cluster_name}-gke-wl-sa@{self.project}.iam.gserviceaccount.com"

    @property
    def node_pool_service_account(self) -> str:
        return f"{self.cluster_name}-gke-np-sa@{self.project}.iam.gserviceaccount.com"


@dataclass(frozen=True)
class GkeJobTarget:
    """Where a ``gcluster job submit`` runs: the cluster, the machines of its pods (a TPU slice
    shape, or a CPU machine type with no topology), the image, the node pool and the pods'
    Kubernetes service account."""

    project: str
    location: str
    cluster_name: str
    image: str
    compute_type: str = "ct6e-standard-4t"
    topology: str = "4x8"
    num_slices: int = 1
    node_pool: str = ""
    service_account: str = ""
    # more node labels the pods must run on (an existing cluster: the run's own pool's tpu-rl-run)
    node_constraints: tuple[tuple[str, str], ...] = ()
    # the Kueue LocalQueue (`--queue`); empty: gcluster picks the only one
    queue: str = ""
    # a Pathways job's head pool (`--pathways-head-np`); empty: gcluster's cpu-np or pathways-np
    head_node_pool: str = ""

    def __post_init__(self) -> None:
        rules.project_id("project_id", self.project)
        if not rules.ZONE.fullmatch(self.location or ""):  # a zonal existing cluster's location
            rules.region("location", self.location)
        # A job needs a GKE cluster name: ≤ 40 characters (container v1 Cluster.name, gcloud 528's
        # container_v1_messages.py; direct). The 20 of rules.gke_cluster_name is Cluster Toolkit's
        # deployment name's, which ClusterSpec keeps; a cluster the run does not own has none.
        rules.max_len(
            "cluster_name",
            rules.match(
                "cluster_name", self.cluster_name, rules.GKE_CLUSTER_NAME, rules.GKE_CLUSTER_NAME_RULE
            ),
            40,
        )
        for key, value in self.node_constraints:
            rules.match("node_constraints", f"{key}={value}", NODE_CONSTRAINT, "key=value of a node label")
        if self.queue:
            rules.match("kueue_queue", self.queue, K8S_NAME, "a Kubernetes name like team-queue")
        rules.image("image", self.image)
        rules.int_range("num_slices", self.num_slices, 1, 64)
        if self.tpu:
            SliceShape(self.compute_type, self.topology)
        else:
            rules.match(
                "compute_type", self.compute_type, SYSTEM_MACHINE_TYPE, "a machine type like n4-standard-64"
            )
            if self.topology:
                # gcluster: "topology is not allowed for GPU and CPU jobs" (addTopologyLabel)
                raise SpecError("topology", "must be empty for a CPU machine type", self.topology)
            if self.num_slices != 1:
                raise SpecError("num_slices", "a CPU job runs on one node", str(self.num_slices))
        for name in ("node_pool", "service_account", "head_node_pool"):
            value = getattr(self, name)
            if value:
                rules.match(name, value, K8S_NAME, "a Kubernetes name like cpu-np")

    @property
    def tpu(self) -> bool:
        """Whether the pods run on TPU VMs (``ct6e-…``)."""
        return self.compute_type.startswith("ct")

    def on_cpu(self, compute_type: str = CPU_COMPUTE_TYPE) -> GkeJobTarget:
        """The same cluster and image, on the CPU node pool as the workload's Kubernetes service
        account: where the conversions run."""
        return replace(
            self,
            compute_type=compute_type,
            topology="",
            num_slices=1,
            node_pool=CPU_NODE_POOL,
            service_account=WORKLOAD_KSA,
        )

    @property
    def where(self) -> str:
        """``project/location/cluster``: where a run directory's writer claim says the job runs."""
        return f"{self.project}/{self.location}/{self.cluster_name}"

    def at(self, where: str) -> GkeJobTarget | None:
        """This target moved to the cluster ``where`` names; None when it names no valid cluster."""
        parts = where.split("/")
        if len(parts) != 3:
            return None
        try:
            return replace(self, project=parts[0], location=parts[1], cluster_name=parts[2])
        except SpecError:
            return None


@dataclass(frozen=True)
class TpuVmSpec(OrderedCapacity):
    """One TPU VM (seed 002: ct6e-standard-8t, v6e-8, topology 2x4), reservation-bound by default.

    An empty ``reservation`` is a spec of a VM that exists already (stages, delete); a create with
    ``reservation`` capacity needs one (``tpu_vm_pipeline_from_conf``).

    ``max_run_hours``: how long a flex-start VM may run (Compute Engine ends it then).
    ``fallback``: the kinds its create tries, in order, when ``capacity``'s is refused for lack of
    capacity (a stockout, a quota, a full reservation): ``render.tpu_vm.capacity_attempts``.
    """

    project: str
    zone: str
    vm_name: str
    reservation: str
    bucket: str
    capacity: str = RESERVATION
    fallback: tuple[str, ...] = ()
    max_run_hours: int = 72
    machine_type: str = "ct6e-standard-8t"
    topology: str = "2x4"
    image_project: str = "ubuntu-os-accelerator-images"
    image_family: str = "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
    boot_disk_size: str = "200GB"
    labels: Mapping[str, str] = field(default_factory=dict)
    # A custom image of the VM's project it boots from instead of ``image_family`` (the baked boot
    # image: render/boot_image.py); empty: the family's newest image.
    boot_image: str = ""

    def __post_init__(self) -> None:
        rules.project_id("project", self.project)
        rules.zone("zone", self.zone, None)
        rules.gce_name("vm_name", self.vm_name, "VM name")
        if self.boot_image:
            rules.gce_name("boot_image", self.boot_image, "image name")
        if self.reservation:  # empty: a spec for a VM that exists already (stages, delete)
            rules.gce_name("reservation", self.reservation, "reservation name")
        else:
            rules.require_str("reservation", self.reservation)
        check_capacity([self.capacity, *self.fallback], self.reservation)
        rules.int_range("max_run_hours", self.max_run_hours, 1, 24 * 7)
        rules.bucket_name("bucket", self.bucket)
        SliceShape(self.machine_type, self.topology)
        boot_disk_type("machine_type", self.machine_type)
        rules.gce_name("image_project", self.image_project, "image project")
        rules.gce_name("image_family", self.image_family, "image family")
        rules.match(
            "boot_disk_size", self.boot_disk_size, rules.re.compile(r"^[1-9][0-9]{1,4}GB$"), "like 200GB"
        )
        object.__setattr__(self, "labels", _labels(self.labels))

    @property
    def shape(self) -> SliceShape:
        return SliceShape(self.machine_type, self.topology)

    @property
    def boot_disk_type(self) -> str:
        """The boot disk type its machine series takes (:data:`BOOT_DISK_TYPES`)."""
        return boot_disk_type("machine_type", self.machine_type)

    @property
    def chips(self) -> int:
        return self.shape.chips


# The CPU VM of the single-host pipeline: MaxText's converters force JAX onto the CPU
# (maxtext-v0.2.4 to_maxtext.py l.1190 / to_huggingface.py l.589 `jax_platforms=cpu`), so they run
# there instead of on the billed TPU VM. n2-highmem-32: 256 GB of RAM (an eager load of the bf16
# weights holds about twice their size, ~32 GB for 8B; there is no official figure).
CPU_VM_MACHINE_TYPE: Final = "n2-highmem-32"
CPU_VM_SUFFIX: Final = "-cpu"
# The VM the TPU VM's boot image is baked on (render/boot_image.py): no TPU, booted from the TPU
# VM's own image family; it installs Docker and pulls the workload image, so 8 vCPUs (docker
# unpacks the layers' gzip on one core each, three at a time) and 32 GB.
BAKE_VM_MACHINE_TYPE: Final = "n2-standard-8"
BAKE_VM_PREFIX: Final = "tpu-rl-bake-"


def bake_vm_name(suffix: str) -> str:
    """The bake VM's name: ``tpu-rl-bake-<run suffix>``, one per DAG run, so a run's teardown only
    ever deletes its own."""
    return rules.gce_name("bake_vm_name", BAKE_VM_PREFIX + suffix, "VM name")


def cpu_vm_name(tpu_vm_name: str) -> str:
    """The CPU VM's name, derived from the TPU VM's: ``<vm_name>-cpu`` (a valid GCE name: the TPU
    VM's is cut so the whole stays within 63 characters)."""
    return tpu_vm_name[: 63 - len(CPU_VM_SUFFIX)].rstrip("-") + CPU_VM_SUFFIX


@dataclass(frozen=True)
class CpuVmSpec:
    """The CPU Compute Engine VM the conversions run on (no TPU, no reservation)."""

    project: str
    zone: str
    vm_name: str
    bucket: str
    machine_type: str = CPU_VM_MACHINE_TYPE
    image_project: str = "ubuntu-os-cloud"
    image_family: str = "ubuntu-2204-lts"
    boot_disk_size: str = "200GB"
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rules.project_id("project", self.project)
        rules.zone("zone", self.zone, None)
        rules.gce_name("cpu_vm_name", self.vm_name, "VM name")
        rules.bucket_name("bucket", self.bucket)
        if self.machine_type.startswith("ct"):
            raise SpecError(
                "cpu_machine_type",
                "must be a CPU machine type (like n2-highmem-32), not a TPU one: the converters run on the CPU",
                self.machine_type,
            )
        rules.match(
            "cpu_machine_type",
            self.machine_type,
            SYSTEM_MACHINE_TYPE,
            "a CPU machine type like n2-highmem-32",
        )
        boot_disk_type("cpu_machine_type", self.machine_type)
        rules.gce_name("image_project", self.image_project, "image project")
        rules.gce_name("image_family", self.image_family, "image family")
        rules.match(
            "boot_disk_size", self.boot_disk_size, rules.re.compile(r"^[1-9][0-9]{1,4}GB$"), "like 200GB"
        )
        object.__setattr__(self, "labels", _labels(self.labels))

    @property
    def boot_disk_type(self) -> str:
        """The boot disk type its machine series takes (:data:`BOOT_DISK_TYPES`)."""
        return boot_disk_type("cpu_machine_type", self.machine_type)
