"""Which TPU capacity a zone cannot give now: the sandbox setting ``tpu_capacity_out`` ("<zone>/<kind>"
-> ``stockout`` or ``quota``), and the texts Compute Engine's refusal prints through gcloud.

A kind is what a ``compute instances create`` of a TPU VM (a ``ct*`` machine type) asks for: its
``--provisioning-model`` (``SPOT`` spot, ``FLEX_START`` flex-start, ``RESERVATION_BOUND`` or
``--reservation-affinity=specific`` reservation, else on-demand). A reservation with no room left
is not a setting here: it is the reservation's own ``count`` (``compute_reservations.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

KINDS: Final = ("on-demand", "reservation", "spot", "flex-start")
STOCKOUT: Final = "stockout"
QUOTA: Final = "quota"
# The quota a kind's TPU v6e chips take: Spot and flex-start VMs take the preemptible TPU quota
# (the provider's spec/preflight.py PREEMPTIBLE_TPU_V6E_QUOTA and its sources: Google's TPU Builders
# Program guide, second-hand; the flex-start VMs GA blog "consume preemptible quota", direct). A
# reservation's VMs take no quota of their own; on-demand v6e quota's metric name has no source we
# could read, so a quota refusal of on-demand (or reservation) is refused as a setting.
QUOTA_METRICS: Final[Mapping[str, str]] = {"spot": "PREEMPTIBLE_TPU_V6E", "flex-start": "PREEMPTIBLE_TPU_V6E"}


def check_setting(value: Mapping[str, str]) -> dict[str, str]:
    """``tpu_capacity_out`` checked: keys ``<zone>/<kind>``, values ``stockout`` or ``quota`` (a
    quota only of a kind with a known metric); a ValueError names a bad entry."""
    checked: dict[str, str] = {}
    for key, why in value.items():
        zone, _, kind = str(key).rpartition("/")
        if not zone or kind not in KINDS:
            raise ValueError(f"tpu_capacity_out: {key!r} is not <zone>/<one of {', '.join(KINDS)}>")
        if kind == "reservation":
            raise ValueError(f"tpu_capacity_out: {key!r}: a full reservation is its count in reservations")
        if why not in (STOCKOUT, QUOTA) or (why == QUOTA and kind not in QUOTA_METRICS):
            allowed = "stockout or quota" if kind in QUOTA_METRICS else "stockout"
            raise ValueError(f"tpu_capacity_out: {key!r} can be {allowed}, not {why!r}")
        checked[str(key)] = str(why)
    return checked


def requested_kind(provisioning_model: str, affinity: str | None) -> str:
    """The capacity kind a TPU VM's create asks for (its scheduling flags)."""
    if provisioning_model == "SPOT":
        return "spot"
    if provisioning_model == "FLEX_START":
        return "flex-start"
    if provisioning_model == "RESERVATION_BOUND" or affinity == "specific":
        return "reservation"
    return "on-demand"


def pool_kind(pool: Mapping[str, object]) -> str:
    """The capacity kind a GKE TPU node pool asks for (gke-node-pool settings, as the sandbox's
    gcluster reads them): spot, flex-start, a specific reservation, else on-demand."""
    consumption = pool.get("consumption")
    options = consumption if isinstance(consumption, Mapping) else {}
    if options.get("spot"):
        return "spot"
    if options.get("enable_flex_start"):
        return "flex-start"
    affinity = pool.get("reservation_affinity")
    if isinstance(affinity, Mapping) and affinity.get("type") == "SPECIFIC_RESERVATION":
        return "reservation"
    return "on-demand"


def pool_refusal(out: Mapping[str, str], zone: str, pools: list[dict[str, object]]) -> str | None:
    """Why the TPU node pool of ``pools`` cannot be created in ``zone`` (``tpu_capacity_out``):
    ``stockout`` or ``quota`` for a pool of static TPU nodes (its create waits for its nodes and
    fails with their instances' error), or None. A flex-start pool is created empty whatever the
    zone has (its nodes come when a pod asks: :func:`flex_scale_up_failure`)."""
    for pool in pools:
        if not str(pool.get("machine_type") or "").startswith("ct"):
            continue
        kind = pool_kind(pool)
        why = out.get(f"{zone}/{kind}")
        if kind != "flex-start" and why in (STOCKOUT, QUOTA):
            return why
    return None


# The cluster autoscaler's failure text of a scale-up whose instances the zone refused, as GKE's
# autoscaler emits it on the pods (k8s.io/gke-autoscaling cluster-autoscaler, package events:
# ``outOfResourcesMessage``, ``quotaExceededMessage``; direct, read as the code corpus stores it).
SCALE_UP_FAILURES: Final[Mapping[str, str]] = {STOCKOUT: "GCE out of resources", QUOTA: "GCE quota exceeded"}


def flex_scale_up_failure(out: Mapping[str, str], zone: str, pool: Mapping[str, object]) -> str | None:
    """The autoscaler's failure text when a pod asks for the nodes of flex-start TPU ``pool`` and
    ``zone`` has no flex-start capacity (``tpu_capacity_out``), or None (its nodes come)."""
    if pool_kind(pool) != "flex-start":
        return None
    why = out.get(f"{zone}/flex-start")
    return SCALE_UP_FAILURES.get(why) if why else None


def pool_reservation_full(
    reservations: Mapping[str, Mapping[str, object]], zone: str, pools: list[dict[str, object]]
) -> str | None:
    """The name of the reservation a static TPU node pool of ``pools`` consumes whose ``count``
    (settings ``reservations``) holds fewer VMs than the pool's nodes, or None. Others' use of the
    reservation is not counted here: a reservation smaller than the slice is the world a test sets."""
    for pool in pools:
        if not str(pool.get("machine_type") or "").startswith("ct") or pool_kind(pool) != "reservation":
            continue
        name = str(pool.get("reservation") or "").rsplit("/", 1)[-1]
        found = reservations.get(f"{zone}/{name}")
        nodes = pool.get("nodes")
        if found is not None and isinstance(nodes, int) and int(str(found.get("count", 0))) < nodes:
            return name
    return None


def refusal(
    out: Mapping[str, str], project: str, zone: str, kind: str, quota_limits: Mapping[str, float]
) -> str | None:
    """What the insert's failed operation says when ``kind`` is out in ``zone`` (gcloud prints it
    after ``Could not fetch resource:`` as `` - <message>``: api_lib/compute/utils.py
    RaiseException/ConstructList, gcloud 528, direct), or None.

    - stockout: ZONE_RESOURCE_POOL_EXHAUSTED's message, "The zone '<zone URL>' does not have enough
      resources available to fulfill the request.  Try a different zone, or try again later." (Compute
      Engine's resource-availability troubleshooting page quotes it; the sandbox's deploy fault and
      kubernetes/autoscaler's gce client tests use the same text: indirect).
    - quota: QUOTA_EXCEEDED's message "Quota '<METRIC>' exceeded.  Limit: <limit> in region <region>."
      with gcloud's quotaInfo lines after it (utils.py CreateQuotaExceededMsg: metric name, limit
      name, limit, dimensions, then "Try your request in another zone, or view documentation on how
      to increase quotas: https://cloud.google.com/compute/quotas."; direct). The message's shape
      is Compute Engine's as public error reports quote it ("Quota 'SSD_TOTAL_GB' exceeded.  Limit:
      500.0 in region asia-northeast3.", limit name "CPUS-per-project-region"): indirect.
    """
    why = out.get(f"{zone}/{kind}")
    if why == STOCKOUT:
        return (
            f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
            "fulfill the request.  Try a different zone, or try again later."
        )
    if why == QUOTA:
        metric = QUOTA_METRICS[kind]
        region = zone.rsplit("-", 1)[0]
        limit = float(quota_limits.get(metric, 0.0))
        return (
            f"Quota '{metric}' exceeded.  Limit: {limit} in region {region}.\n"
            f"\tmetric name = compute.googleapis.com/{metric.lower()}\n"
            f"\tlimit name = {metric.replace('_', '-')}-per-project-region\n"
            f"\tlimit = {limit}\n"
            f"\tdimensions = region: {region}\n"
            "Try your request in another zone, or view documentation on how to increase quotas: "
            "https://cloud.google.com/compute/quotas."
        )
    return None
