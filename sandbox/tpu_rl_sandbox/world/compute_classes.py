"""GKE's ComputeClass in the sandbox: the custom resource its Kubernetes API keeps, and GKE's choice
among its priorities when a pending pod selects it.

Written from GKE's ComputeClass CRD reference (kubernetes-engine/docs/reference/crds/computeclass,
direct), "About custom compute classes" (direct) and "About node pool auto-creation" (direct):

- ``cloud.google.com/v1`` ``ComputeClass``, cluster-scoped, served from GKE 1.30.3-gke.1451000
  ("Custom compute classes are available ... in version 1.30.3-gke.1451000 and later");
- ``spec.priorities``: an ordered list; "if the most preferred configuration is unavailable, GKE
  automatically chooses the next configuration in the hierarchy"; a TPU priority is
  ``tpu: {type, count, topology}`` with ``spot``, ``flexStart.enabled`` or ``reservations``;
- ``spec.nodePoolAutoCreation.enabled``: GKE creates a node pool for a priority itself; in a
  Standard cluster without cluster-level node auto-provisioning from 1.33.3-gke.1136000 (Google's
  gke-compute-classes skill quoting "Configure node pool auto-creation": second-hand);
- ``spec.whenUnsatisfiable``: ``DoNotScaleUp`` leaves the pod pending when no priority can be had,
  ``ScaleUpAnyway`` makes a default node (the sandbox makes none for it either: no default TPU node
  exists).

What a zone cannot give is the sandbox setting ``tpu_capacity_out`` (``<zone>/<kind>``), and a
reservation too small for the slice its ``count`` in ``reservations`` (world/capacity.py). A
refused priority is one ``FailedScaleUp`` event on the pod with the autoscaler's zonal text
(world/capacity.py ``SCALE_UP_FAILURES``; for a reservation with no room the stockout's text, which
no source ties to it: indirect). The pool GKE creates is named ``nap-<machine type>-<8 characters>``
(node auto-provisioning's pools as GKE names them, as clusters show them: second-hand) and its
nodes carry the class's label and their kind's: ``cloud.google.com/gke-spot: "true"``,
``cloud.google.com/gke-flex-start: "true"`` or ``cloud.google.com/reservation-name`` (GKE's node
selectors for each: "Spot VMs", "About flex-start provisioning mode", "Consuming reserved zonal
resources"; direct in wording).

Scale-down: an auto-created pool whose nodes no pod uses is removed after the cluster autoscaler's
``scale-down-unneeded-time`` (10 minutes: kubernetes/autoscaler cluster-autoscaler/FAQ.md, direct;
``timescale.CAPACITY_MINUTES["scale_down_unneeded"]``, none with the time scale off), and GKE
deletes the empty pool ("About node pool auto-creation": GKE deletes "the entire node pool when it's
no longer needed", direct).
"""

from __future__ import annotations

import re
import secrets
import string
import time
from collections.abc import Mapping
from typing import Any, Final

from tpu_rl_sandbox.world import capacity, gke_nodes, timescale
from tpu_rl_sandbox.world.gke_nodes import matching_tpu_pool
from tpu_rl_sandbox.world.inventory import PODS_DOC, cluster_jobs, project_number

DOC: Final = "compute_classes"
GROUP, VERSION, PLURAL = "cloud.google.com", "v1", "computeclasses"
API: Final = f"{GROUP}/{VERSION}"
CLASS_LABEL: Final = "cloud.google.com/compute-class"
SPOT_LABEL: Final = "cloud.google.com/gke-spot"
FLEX_START_LABEL: Final = "cloud.google.com/gke-flex-start"
RESERVATION_LABEL: Final = "cloud.google.com/reservation-name"
SERVED_FROM: Final = (1, 30, 3, 1451000)
AUTO_CREATION_FROM: Final = (1, 33, 3, 1136000)
WHEN_UNSATISFIABLE: Final = ("DoNotScaleUp", "ScaleUpAnyway")
AFFINITIES: Final = ("Specific", "AnyBestEffort", "None")
# TPU v6e machine types by chips per node (GKE's TPU page: ct6e-standard-1t, -4t, -8t)
V6E_MACHINES: Final = {1: "ct6e-standard-1t", 4: "ct6e-standard-4t", 8: "ct6e-standard-8t"}
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-gke\.(\d+))?")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _version(text: str) -> tuple[int, ...]:
    found = _VERSION.match(text)
    return tuple(int(x or 0) for x in found.groups()) if found else (0, 0, 0, 0)


def served(cluster: Mapping[str, Any]) -> bool:
    """Whether the cluster's Kubernetes API serves ComputeClasses (its GKE version)."""
    return _version(gke_nodes.gke_version(cluster)) >= SERVED_FROM


def problems(body: Any) -> list[tuple[str, str]]:
    """The CRD schema's refusals of a ComputeClass ``body``: (field, why) each."""
    if not isinstance(body, dict):
        return [("", "the body must be a ComputeClass object")]
    found: list[tuple[str, str]] = []
    if body.get("apiVersion") != API or body.get("kind") != "ComputeClass":
        found.append(("apiVersion", f"must be {API} ComputeClass"))
    name = str((body.get("metadata") or {}).get("name") or "")
    if not name or not _NAME.match(name) or len(name) > 253:
        found.append(("metadata.name", f'Invalid value: "{name}": a lowercase RFC 1123 subdomain'))
    spec = body.get("spec") or {}
    priorities = spec.get("priorities")
    if not isinstance(priorities, list) or not priorities:
        found.append(("spec.priorities", "Required value"))
        priorities = []
    when = spec.get("whenUnsatisfiable")
    if when is not None and when not in WHEN_UNSATISFIABLE:
        found.append(("spec.whenUnsatisfiable", f'Unsupported value: "{when}"'))
    for index, priority in enumerate(priorities):
        where = f"spec.priorities[{index}]"
        if not isinstance(priority, dict):
            found.append((where, "must be an object"))
            continue
        tpu = priority.get("tpu")
        if tpu is not None and not (
            isinstance(tpu, dict)
            and tpu.get("type")
            and isinstance(tpu.get("count"), int)
            and tpu.get("topology")
        ):
            found.append((f"{where}.tpu", "Required value: type, count and topology"))
        if "spot" in priority and not isinstance(priority["spot"], bool):
            found.append((f"{where}.spot", "must be a boolean"))
        reservations = priority.get("reservations")
        if reservations is not None:
            affinity = (reservations or {}).get("affinity")
            if affinity not in AFFINITIES:
                found.append((f"{where}.reservations.affinity", f'Unsupported value: "{affinity}"'))
            elif affinity == "Specific" and not all(
                isinstance(r, dict) and r.get("name") for r in reservations.get("specific") or [None]
            ):
                found.append((f"{where}.reservations.specific", "Required value: the reservations' names"))
    return found


def stored(body: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The object as the API stores and returns it."""
    obj = dict(body)
    metadata = dict(obj.get("metadata") or {})
    metadata.setdefault("uid", secrets.token_hex(16))
    metadata.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)))
    metadata["resourceVersion"] = str(int(now * 1000))
    obj["metadata"] = metadata
    return obj


def priority_kind(priority: Mapping[str, Any]) -> str:
    """The capacity kind a priority asks for."""
    if priority.get("spot"):
        return "spot"
    if (priority.get("flexStart") or {}).get("enabled"):
        return "flex-start"
    if ((priority.get("reservations") or {}).get("affinity")) == "Specific":
        return "reservation"
    return "on-demand"


def _shape(priority: Mapping[str, Any]) -> tuple[str, int, str] | None:
    """A TPU v6e priority's machine type, node count and topology (None: not one)."""
    tpu = priority.get("tpu") or {}
    machine = V6E_MACHINES.get(int(tpu.get("count") or 0))
    if tpu.get("type") != "tpu-v6e-slice" or machine is None:
        return None
    topology = str(tpu.get("topology") or "")
    a, _, b = topology.partition("x")
    if not (a.isdigit() and b.isdigit()):
        return None
    return machine, max(1, int(a) * int(b) // int(tpu["count"])), topology


def _pool_name(machine: str) -> str:
    tail = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    return f"nap-{machine}-{tail}"


def auto_creates(cluster: Mapping[str, Any], klass: Mapping[str, Any]) -> bool:
    """Whether GKE creates node pools for the class in this cluster."""
    enabled = bool(((klass.get("spec") or {}).get("nodePoolAutoCreation") or {}).get("enabled"))
    # node auto-provisioning's resource limits apply to the pools GKE creates for a ComputeClass
    # ("Configure node pool auto-creation", direct): with limits and none for TPU v6e, none is made
    autoscaling = cluster.get("autoscaling") or {}
    limits = autoscaling.get("resourceLimits") or []
    tpu_limited = autoscaling.get("enableNodeAutoprovisioning") and not any(
        r.get("resourceType") == "tpu-v6e-slice" and int(r.get("maximum") or 0) > 0 for r in limits
    )
    return enabled and not tpu_limited and _version(gke_nodes.gke_version(cluster)) >= AUTO_CREATION_FROM


def scale_up(
    txn: Any, key: str, cluster: dict[str, Any], klass: Mapping[str, Any], settings: Any, now: float
) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
    """GKE's choice for a pending pod selecting ``klass``: the first priority the zone can give gets a
    node pool auto-created (its nodes made at once); each refused one is a ``FailedScaleUp``
    event. The pool (None: every priority refused, or no auto-creation) and the events."""
    events: list[tuple[str, str]] = []
    if not auto_creates(cluster, klass):
        return None, events
    spec = klass.get("spec") or {}
    name = str(klass["metadata"]["name"])
    default_zones = ((spec.get("priorityDefaults") or {}).get("location") or {}).get("zones") or []
    for priority in spec.get("priorities") or []:
        shape = _shape(priority)
        if shape is None:
            continue
        machine, nodes, topology = shape
        zones = ((priority.get("location") or {}).get("zones")) or default_zones or [cluster.get("zone")]
        zone = str(zones[0])
        kind = priority_kind(priority)
        reservation = ""
        why: str | None
        if kind == "reservation":
            reservation = str(((priority.get("reservations") or {}).get("specific") or [{}])[0].get("name"))
            found = settings.reservation(zone, reservation)
            why = capacity.STOCKOUT if found is None or int(found.get("count", 0)) < nodes else None
        else:
            why = settings.tpu_capacity_out.get(f"{zone}/{kind}")
        if why:
            # GKE's cluster autoscaler (k8s.io/gke-autoscaling cluster-autoscaler, package events:
            # reason FailedScaleUp, zonalErrorMessageTemplate; as apis/kube_api.py create_pod)
            events.append(
                (
                    "FailedScaleUp",
                    f"Node scale up in zones {zone} associated with this pod failed: "
                    f"{capacity.SCALE_UP_FAILURES[why]}. Pod is at risk of not being scheduled.",
                )
            )
            continue
        labels = {CLASS_LABEL: name}
        if kind == "spot":
            labels[SPOT_LABEL] = "true"
        elif kind == "flex-start":
            labels[FLEX_START_LABEL] = "true"
        elif kind == "reservation":
            labels[RESERVATION_LABEL] = reservation
        pool: dict[str, Any] = {
            "name": _pool_name(machine),
            "machine_type": machine,
            "nodes": nodes,
            "zones": [zone],
            "topology": topology,
            "num_slices": 1,
            "node_labels": labels,
            "resource_labels": {},
            "reservation": reservation or None,
            "reservation_affinity": {"type": "SPECIFIC_RESERVATION" if reservation else "NO_RESERVATION"},
            "created_by": "gke-node-pool-auto-creation",
            "compute_class": name,
            "service_account": f"{project_number(str(cluster['project']))}-compute@developer.gserviceaccount.com",
        }
        if kind in ("spot", "flex-start"):
            pool["consumption"] = {"spot": kind == "spot", "enable_flex_start": kind == "flex-start"}
        before = list(cluster.get("node_pools") or [])
        cluster["node_pools"] = [*before, pool]
        txn.doc("clusters")[key] = cluster
        txn.save("clusters")
        gke_nodes.record_pool_events(txn, key, before, cluster["node_pools"], now)
        # the autoscaler's event on the pod that triggered it (cluster-autoscaler's
        # "pod triggered scale-up: [{<group> <from>-><to> (max: <max>)}]"; direct in wording)
        events.append(
            ("TriggeredScaleUp", f"pod triggered scale-up: [{{{pool['name']} 0->{nodes} (max: {nodes})}}]")
        )
        return pool, events
    return None, events


def scale_down(store: Any, key: str, settings: Any, now: float | None = None) -> list[str]:
    """Remove the auto-created pools of cluster ``key`` no pod has used for the autoscaler's
    ``scale-down-unneeded-time``; their names."""
    now = time.time() if now is None else now
    cluster_now = store.read("clusters").get(key) or {}
    if not any(p.get("compute_class") for p in cluster_now.get("node_pools") or []):
        return []
    vms = store.read("vms")
    pods = [r for r in store.read(PODS_DOC).values() if r.get("cluster_key") == key and r.get("node")]
    jobs = [j for j in cluster_jobs(store, key) if j.get("status") not in ("Succeeded", "Failed")]
    unneeded = timescale.capacity_seconds(
        settings.minute_seconds, "scale_down_unneeded", dict(settings.capacity_minutes)
    )
    removed: list[str] = []
    with store.txn() as txn:
        cluster = txn.doc("clusters").get(key)
        if cluster is None:
            return []
        before = list(cluster.get("node_pools") or [])
        kept: list[dict[str, Any]] = []
        for pool in before:
            if not pool.get("compute_class"):
                kept.append(pool)
                continue
            nodes = {
                str(r["name"])
                for r in vms.values()
                if (r.get("labels") or {}).get(gke_nodes.POOL_LABEL) == pool["name"]
            }
            busy = any(p["node"] in nodes for p in pods) or any(
                (matching_tpu_pool(cluster, job) or {}).get("name") == pool["name"] for job in jobs
            )
            if busy:
                pool.pop("idle_since", None)
            else:
                pool.setdefault("idle_since", now)
                if now - float(pool["idle_since"]) >= unneeded:
                    removed.append(str(pool["name"]))
                    continue
            kept.append(pool)
        cluster["node_pools"] = kept
        txn.doc("clusters")[key] = cluster
        txn.save("clusters")
        if removed:
            gke_nodes.record_pool_events(txn, key, before, kept, now)
    return removed
