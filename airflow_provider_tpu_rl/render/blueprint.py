"""Structured edits of the Cluster Toolkit ``gke-tpu-v6e-advanced.yaml`` blueprint."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from airflow_provider_tpu_rl.spec.cluster import FLEX_START, ON_DEMAND, RESERVATION, SPOT
from airflow_provider_tpu_rl.spec.presets import BlueprintEdits

BLUEPRINT_RELPATH = "examples/gke-tpu-v6e/gke-tpu-v6e-advanced.yaml"
BLUEPRINT_FILENAME = "gke-tpu-v6e-advanced.yaml"
NODE_POOL_SA_MODULE = "node_pool_service_account"
# What a custom node service account needs for image streaming, in the image's project.
STREAMING_ROLE = "serviceusage.serviceUsageConsumer"
KUBECTL_APPLY_SOURCE = "modules/management/kubectl-apply"
NODE_POOL_SOURCE = "modules/compute/gke-node-pool"
GKE_CLUSTER_SOURCE = "modules/scheduler/gke-cluster"
# GKE's node label value for TPU v6e (the example's vars.accelerator_type from v1.92.0 on; before,
# the pool's output tpu_accelerator_type, which gke-node-pool derives from ct6e machine types).
V6E_ACCELERATOR = "tpu-v6e-slice"
RESERVATION_VAR = "$(vars.reservation)"
TPU_MACHINE_VAR = "$(vars.machine_type)"
# The deployment group the TPU node pool is moved to: deployed after the conversion, destroyed
# once the actor checkpoint is committed (``gcluster deploy/destroy --only=tpu``).
TPU_GROUP = "tpu"
# The example's one group: everything but the TPU pool stays there.
PRIMARY_GROUP = "primary"
# Upstream modules that only benchmark the TPU pool's disks (the advanced example's fio job template).
BENCHMARK_MODULES = ("fio-bench-job-template",)
# Every variable the Kueue templates of Cluster Toolkit's TPU v6e examples and of kubectl-apply's
# kueue/ folder use (read at v1.85.0 ... v1.95.0 and develop c765092), with the value each gets when
# the blueprint's config_template_vars lack it. Terraform's templatefile fails on a template that
# refers to a key its vars map lacks and ignores the extra ones, so all are passed:
# ``namespace`` (examples/gke-tpu-v6e/kueue-configuration.yaml.tftpl since v1.92.0, its LocalQueue),
# ``tpu_topology`` (examples/gke-consumption-options/dws-flex-start-queued-provisioning/
# tpu-dws-queues.yaml.tftpl l.47 at c765092); ``accelerator_type`` and ``tpu_quota`` are the
# example's own and required. The module's defaults (pathways_* and tpu_flavor_* quotas at develop)
# are left to it.
KUEUE_TEMPLATE_FALLBACKS: dict[str, str] = {
    "namespace": "$(vars.user_namespace)",
    "tpu_topology": "$(vars.tpu_topology)",
}
# kubectl-apply's Kueue default for Pathways clusters, used when the blueprint names no config_path
# (modules/management/kubectl-apply/main.tf l.22-24 at v1.92.0); added by cluster-toolkit #5628
# (962b1d303, 2026-05-19), first in release v1.92.0. Relative to the module's folder.
KUEUE_DEFAULT_TEMPLATE = "kueue/kueue-configuration-pathways.yaml.tftpl"
KUEUE_DEFAULT_RELEASE = "v1.92.0"
KUEUE_DEFAULT_NAMESPACE = "default"  # the example's LocalQueue namespace before vars.user_namespace
_MODULE_REF = re.compile(r"\b([A-Za-z][A-Za-z0-9_-]*)\.[A-Za-z_][A-Za-z0-9_]*")
_EXPRESSION = re.compile(r"\$\(([^)]*)\)")


class BlueprintError(ValueError):
    """The blueprint does not have the shape the edits expect."""


class QuotedStr(str):
    """A string always written in double quotes.

    gcluster reads blueprints with Go's yaml.v3 (YAML 1.2), where a plain ``123e45`` is a float;
    PyYAML (YAML 1.1) writes it unquoted. A run suffix or an expiry label can look like that.
    """

    __slots__ = ()


class _BlueprintDumper(yaml.SafeDumper):
    pass


_BlueprintDumper.add_representer(
    QuotedStr, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style='"')
)


def _modules(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    groups = doc.get("deployment_groups")
    if not isinstance(groups, list):
        raise BlueprintError("blueprint has no deployment_groups list")
    return [m for g in groups for m in (g.get("modules") or []) if isinstance(m, dict)]


def customize_blueprint(
    text: str,
    edits: BlueprintEdits,
    labels: Mapping[str, str] | None = None,
    *,
    reservation: bool = True,
    tpu_quota: int | None = None,
    capacity: str = RESERVATION,
    slice_vms: int | None = None,
    stream_image: bool = False,
) -> str:
    """Apply the tutorial edits to the blueprint text and return the new YAML.

    ``reservation=False``: the run names no reservation, so the TPU node pool consumes none.
    ``capacity`` ``on-demand``: the pool consumes no reservation and sets no consumption option
    (gke-node-pool's defaults: ``spot = false``, no flex-start). ``spot`` or ``flex-start``: the TPU
    node pool's provisioning (:func:`set_capacity`; ``slice_vms``, the VMs of one slice, bounds a
    flex-start pool's autoscaling).
    ``tpu_quota`` (the slices' chips): the TPU node pool moves to its own deployment group
    ``tpu`` (:func:`split_tpu_group`), deployed and destroyed on its own around the training.
    ``stream_image``: the TPU node pool streams its image (:func:`stream_tpu_pool_image`).
    """
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("vars"), dict):
        raise BlueprintError("blueprint must be a mapping with a 'vars' mapping")
    modules = _modules(doc)
    if edits.grant_storage_admin:
        sa = next((m for m in modules if m.get("id") == NODE_POOL_SA_MODULE), None)
        if sa is None:
            raise BlueprintError(f"blueprint has no module with id {NODE_POOL_SA_MODULE!r}")
        roles = list(sa.setdefault("settings", {}).get("project_roles") or [])
        if "storage.objectViewer" in roles:
            roles[roles.index("storage.objectViewer")] = "storage.admin"
        elif "storage.admin" not in roles:
            roles.append("storage.admin")
        sa["settings"]["project_roles"] = roles
    if edits.system_node_pool_machine_type is not None or edits.pin_system_node_pool_zone:
        cluster = next(
            (m for m in modules if "system_node_pool_machine_type" in (m.get("settings") or {})), None
        )
        if cluster is None:
            raise BlueprintError("blueprint has no module setting system_node_pool_machine_type")
        if edits.system_node_pool_machine_type is not None:
            cluster["settings"]["system_node_pool_machine_type"] = edits.system_node_pool_machine_type
        if edits.pin_system_node_pool_zone:
            cluster["settings"]["system_node_pool_zones"] = ["$(vars.zone)"]
    _queue_cpu_jobs(doc, modules)
    _drop_unset_static_node_count(doc, modules)
    if not reservation or capacity != RESERVATION:
        _consume_no_reservation(modules)
    if capacity in (SPOT, FLEX_START):
        set_capacity(_tpu_pool(modules), capacity, slice_vms)
    if stream_image:
        stream_tpu_pool_image(modules)
    if tpu_quota is not None:
        split_tpu_group(doc, tpu_quota)
    _drop_unused_empty_vars(doc)
    if labels:
        merged = dict(doc["vars"].get("labels") or {})
        merged.update(labels)
        doc["vars"]["labels"] = {key: QuotedStr(value) for key, value in merged.items()}
    return yaml.dump(doc, Dumper=_BlueprintDumper, sort_keys=False, default_flow_style=False)


def stream_tpu_pool_image(modules: list[dict[str, Any]]) -> None:
    """Image streaming on the TPU node pool: gke-node-pool's ``enable_gcfs`` (``gcfs_config {
    enabled = true }``; variables.tf l.74-78, main.tf l.237-242 at v1.95.0), and Service Usage
    Consumer for the pool's custom account ``gke-np-sa`` (GKE's image streaming page, "Requirements":
    a custom node account needs it in the project hosting the image; the copy is in the run's own
    project, where the service-account module grants its ``project_roles``: main.tf l.36,
    ``"${var.project_id}=>roles/${role}"``). The account already reads Artifact Registry
    (``artifactregistry.reader`` in the example)."""
    sa = next((m for m in modules if m.get("id") == NODE_POOL_SA_MODULE), None)
    if sa is None:
        raise BlueprintError(f"blueprint has no module with id {NODE_POOL_SA_MODULE!r}")
    roles = list(sa.setdefault("settings", {}).get("project_roles") or [])
    if STREAMING_ROLE not in roles:
        sa["settings"]["project_roles"] = [*roles, STREAMING_ROLE]
    _tpu_pool(modules).setdefault("settings", {})["enable_gcfs"] = True


def _pathways_enabled(doc: Mapping[str, Any], modules: list[dict[str, Any]]) -> bool:
    """The blueprint turns Pathways on for its TPUs: ``vars.enable_pathways_for_tpus`` (v1.91.0 on)
    or the gke-cluster module's own ``enable_pathways_for_tpus: true`` (v1.86.0 ... v1.90.0)."""
    if doc["vars"].get("enable_pathways_for_tpus") is True:
        return True
    return any(
        str(m.get("source", "")).endswith(GKE_CLUSTER_SOURCE)
        and (m.get("settings") or {}).get("enable_pathways_for_tpus") is True
        for m in modules
    )


def _queue_cpu_jobs(doc: dict[str, Any], modules: list[dict[str, Any]]) -> None:
    """Let Kueue admit the CPU jobs (the conversions) on the CPU node pool.

    The example's own ``kueue-configuration.yaml.tftpl`` gives the ClusterQueue quota for
    ``google.com/tpu`` only, so a job asking for CPUs is never admitted. ``cpu-np`` exists only
    with Pathways on (gke-cluster ``cpu_np``). Two shapes of the example and its kubectl-apply
    module are handled (cluster-toolkit, read at each tag):

    - v1.92.0 on (develop c765092): the kueue ``accelerator_type`` is ``$(vars.accelerator_type)``;
      without ``config_path`` the module applies its default for Pathways clusters
      (``kueue/kueue-configuration-pathways.yaml.tftpl``: the same TPU quota and a ``cpu``/``memory``
      flavor pinned to ``cpu-np``), from the ``config_template_vars`` the example sets. The
      ``config_path`` is dropped.
    - up to v1.91.0 (the issue's commit 0145844 is this shape: v1.86.0 ... v1.89.0): the
      ``accelerator_type`` is the pool's output ``tpu_accelerator_type``; the module has no such
      default, but with ``kueue.enable_pathways_for_tpus`` it adds ``kueue/pathways.yaml.tftpl``
      (a ``cpu``/``memory`` flavor on ``cpu-np`` in a ClusterQueue named ``cluster-queue``) and
      merges it with the example's ``cluster-queue`` by name (kubectl-apply main.tf l.17-45 at
      v1.89.0). The ``config_path`` stays and that switch is set.
    """
    if not _pathways_enabled(doc, modules):
        raise BlueprintError(
            "blueprint must set enable_pathways_for_tpus: true (in vars or on its gke-cluster module; it "
            "adds the cpu-np node pool the conversions run on)"
        )
    kubectl = next((m for m in modules if str(m.get("source", "")).endswith(KUBECTL_APPLY_SOURCE)), None)
    kueue = ((kubectl or {}).get("settings") or {}).get("kueue")
    if not isinstance(kueue, dict):
        raise BlueprintError(f"blueprint has no {KUBECTL_APPLY_SOURCE} module with kueue settings")
    template_vars = dict(kueue.get("config_template_vars") or {})
    if "accelerator_type" not in template_vars or "tpu_quota" not in template_vars:
        raise BlueprintError("the kueue config_template_vars must set accelerator_type and tpu_quota")
    for key, value in KUEUE_TEMPLATE_FALLBACKS.items():
        if key in template_vars:
            continue
        variable = value[len("$(vars.") : -1]
        if variable in doc["vars"]:
            template_vars[key] = value
        elif key == "namespace":
            template_vars[key] = KUEUE_DEFAULT_NAMESPACE
        else:
            raise BlueprintError(f"blueprint has no vars.{variable} for the kueue template variable {key}")
    accelerator = str(template_vars["accelerator_type"])
    if accelerator.startswith("$(") and "vars." not in accelerator:
        # up to v1.91.0: the pool's output; a literal, so that Kueue does not depend on the pool
        # (which moves to a later group), and the module's own Pathways queue merged in
        template_vars["accelerator_type"] = V6E_ACCELERATOR
        kueue["enable_pathways_for_tpus"] = True
        if not kueue.get("config_path"):
            raise BlueprintError("the kueue settings name no config_path (the example's TPU queue template)")
    else:
        kueue.pop("config_path", None)
    kueue["config_template_vars"] = template_vars


# The example's empty vars an edit may leave unreferenced: the reservation (no pool bound to it)
# and, up to v1.89.0, static_node_count (its setting dropped).
EDITED_AWAY_VARS = ("reservation", "static_node_count")


def _drop_unused_empty_vars(doc: dict[str, Any]) -> None:
    """Drop an empty var of :data:`EDITED_AWAY_VARS` that no module refers to any more: gcluster
    refuses a blueprint var left null, "deployment variable X was not set" (cluster-toolkit
    ``pkg/config/validate.go`` ``validateVars`` at v1.95.0), and the run passes no value for it."""
    text = yaml.safe_dump(doc["deployment_groups"])
    for name in EDITED_AWAY_VARS:
        if name in doc["vars"] and doc["vars"][name] is None and not re.search(rf"\bvars\.{name}\b", text):
            del doc["vars"][name]


def _drop_unset_static_node_count(doc: dict[str, Any], modules: list[dict[str, Any]]) -> None:
    """Up to v1.89.0 the TPU pool sets ``static_node_count: $(vars.static_node_count)`` and leaves
    that variable empty (the tutorials pass none): a null, the module's default. The setting goes,
    so that an autoscaling capacity (spot, flex-start) is not refused for it."""
    if doc["vars"].get("static_node_count") is not None:
        return
    for pool in modules:
        settings = pool.get("settings") or {}
        if (
            str(pool.get("source", "")).endswith(NODE_POOL_SOURCE)
            and settings.get("machine_type") == TPU_MACHINE_VAR
            and settings.get("static_node_count") == "$(vars.static_node_count)"
        ):
            del settings["static_node_count"]


def _consume_no_reservation(modules: list[dict[str, Any]]) -> None:
    """Switch the node pools bound to ``vars.reservation`` to ``NO_RESERVATION``.

    The example binds its TPU pool with ``SPECIFIC_RESERVATION`` and ``name: $(vars.reservation)``;
    with an empty name, gke-node-pool's reservation precondition fails at plan time
    (``modules/compute/gke-node-pool/main.tf``: a ``specific_reservations`` entry must name a
    reservation that exists in the pool's zones), after the network is made. ``NO_RESERVATION``
    (with no ``specific_reservations``, the other precondition there) takes on-demand capacity.
    """
    bound = [
        m
        for m in modules
        if str(m.get("source", "")).endswith(NODE_POOL_SOURCE)
        and any(
            isinstance(r, dict) and r.get("name") == RESERVATION_VAR
            for r in ((m.get("settings") or {}).get("reservation_affinity") or {}).get(
                "specific_reservations"
            )
            or []
        )
    ]
    if not bound:
        raise BlueprintError(f"blueprint has no {NODE_POOL_SOURCE} module reserved by {RESERVATION_VAR}")
    for module in bound:
        module["settings"]["reservation_affinity"] = {"consume_reservation_type": "NO_RESERVATION"}


def capacity_settings(capacity: str, slice_vms: int | None) -> dict[str, Any]:
    """The gke-node-pool settings of a TPU node pool with ``capacity`` (on-demand, spot or flex-start).

    ``on-demand``: ``NO_RESERVATION`` alone; the module's other consumption options keep their
    defaults, off (``modules/compute/gke-node-pool/variables.tf``: ``spot`` default ``false``,
    ``reservation_affinity`` default ``NO_RESERVATION``), so GKE creates standard (on-demand) nodes.

    gke-node-pool's preconditions (``modules/compute/gke-node-pool/main.tf`` l.415-438 at
    cluster-toolkit 1047080): spot and flex-start only with ``NO_RESERVATION``, never both;
    flex-start with ``auto_repair: false`` and no ``static_node_count``. A flex-start pool starts
    empty and scales up to its slice when the training's pods ask for it: per-zone autoscaling
    limits, as ``examples/gke-consumption-options/dws-flex-start/gke-tpu-v6e/`` sets them (main.tf
    l.111-112: they work around a Terraform provider bug with TPU flex-start).
    """
    no_reservation = {"reservation_affinity": {"consume_reservation_type": "NO_RESERVATION"}}
    if capacity == ON_DEMAND:
        return no_reservation
    if capacity == SPOT:
        return {**no_reservation, "spot": True}
    if capacity == FLEX_START:
        if slice_vms is None:
            raise BlueprintError("flex-start capacity needs the VMs of one slice (slice_vms)")
        return {
            **no_reservation,
            "enable_flex_start": True,
            "auto_repair": False,
            "autoscaling_min_node_count": 0,
            "autoscaling_max_node_count": slice_vms,
        }
    raise BlueprintError(f"no node pool settings for capacity {capacity!r}")


def set_capacity(pool: dict[str, Any], capacity: str, slice_vms: int | None) -> None:
    """Provision the TPU node pool with Spot VMs or DWS flex-start (:func:`capacity_settings`)."""
    settings = pool.setdefault("settings", {})
    if settings.get("static_node_count") is not None:
        raise BlueprintError(
            f"the TPU node pool sets static_node_count; {capacity} capacity needs autoscaling"
        )
    settings.update(capacity_settings(capacity, slice_vms))


def _tpu_pool(modules: list[dict[str, Any]]) -> dict[str, Any]:
    pools = [
        m
        for m in modules
        if str(m.get("source", "")).endswith(NODE_POOL_SOURCE)
        and (m.get("settings") or {}).get("machine_type") == TPU_MACHINE_VAR
    ]
    if len(pools) != 1:
        raise BlueprintError(
            f"blueprint must have exactly one {NODE_POOL_SOURCE} module with machine_type "
            f"{TPU_MACHINE_VAR} (the TPU node pool), found {len(pools)}"
        )
    return pools[0]


def tpu_pool_names(text: str, num_slices: int) -> list[str]:
    """The GKE names of the blueprint's TPU node pools: the gke-node-pool module's ``name``, with
    ``-<index>`` per slice when there are several (``modules/compute/gke-node-pool/main.tf`` l.106
    at cluster-toolkit c765092: ``join("-", [coalesce(var.name, …), count.index])`` when
    ``num_slices`` > 1); both spellings with several slices, so either GKE naming is found. Empty
    when the module names none (its default holds gcluster's module id hash)."""
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict):
        return []
    name = (_tpu_pool(_modules(doc)).get("settings") or {}).get("name")
    if not isinstance(name, str) or not name:
        return []
    return [name] if num_slices <= 1 else [name, *(f"{name}-{index}" for index in range(num_slices))]


def module_references(module: Mapping[str, Any]) -> set[str]:
    """The module ids a module refers to: its ``use`` list and the ``module.output`` names in the
    ``$(...)`` expressions of its settings (``vars.x`` is not a module)."""
    found = {str(u) for u in module.get("use") or []}

    def walk(value: Any) -> None:
        if isinstance(value, str):
            for expression in _EXPRESSION.findall(value):
                found.update(name for name in _MODULE_REF.findall(expression) if name != "vars")
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(module.get("settings") or {})
    return found


def split_tpu_group(doc: dict[str, Any], tpu_quota: int) -> None:
    """Move the TPU node pool into a deployment group ``tpu`` of its own, after the others.

    ``gcluster deploy --skip=tpu`` then makes the network, the cluster, ``cpu-np`` and Kueue, and
    ``gcluster deploy/destroy --only=tpu`` creates and deletes the TPU capacity alone
    (cluster-toolkit ``cmd/utils.go`` ``addGroupSelectionFlags``). A group may only refer to
    earlier groups (``pkg/config/expand.go`` ``validateModuleReference``: "references to outputs
    from other groups must be to earlier groups"), so Kueue's ``tpu_quota``, which the example
    computes from the pool's outputs, becomes the literal chip count, and the fio benchmark job
    template (it uses the pool; it only benchmarks) is dropped.
    """
    if not isinstance(tpu_quota, int) or isinstance(tpu_quota, bool) or tpu_quota < 1:
        raise BlueprintError(f"tpu_quota must be a positive chip count, got {tpu_quota!r}")
    groups: list[dict[str, Any]] = doc["deployment_groups"]
    if any(g.get("group") == TPU_GROUP for g in groups):
        raise BlueprintError(f"blueprint already has a deployment group {TPU_GROUP!r}")
    pool = _tpu_pool(_modules(doc))
    pool_id = str(pool.get("id"))
    for group in groups:
        group["modules"] = [
            m for m in group.get("modules") or [] if m is not pool and m.get("id") not in BENCHMARK_MODULES
        ]
    kubectl = next(
        (m for m in _modules(doc) if str(m.get("source", "")).endswith(KUBECTL_APPLY_SOURCE)), None
    )
    template_vars = (((kubectl or {}).get("settings") or {}).get("kueue") or {}).get("config_template_vars")
    if not isinstance(template_vars, dict) or "tpu_quota" not in template_vars:
        raise BlueprintError("the kueue config_template_vars must set tpu_quota")
    template_vars["tpu_quota"] = tpu_quota
    referring = sorted(str(m.get("id")) for m in _modules(doc) if pool_id in module_references(m))
    if referring:
        raise BlueprintError(
            f"modules {referring} refer to the TPU node pool {pool_id!r}, which moves to the later group "
            f"{TPU_GROUP!r} (gcluster: references to outputs from other groups must be to earlier groups)"
        )
    groups[:] = [g for g in groups if g.get("modules")]
    groups.append({"group": TPU_GROUP, "modules": [pool]})


def kueue_default_template(text: str) -> str | None:
    """The kubectl-apply file the edited blueprint ``text`` takes its Kueue queue from when it
    names no ``config_path`` (:data:`KUEUE_DEFAULT_TEMPLATE`); ``None`` when it names one."""
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict):
        raise BlueprintError("blueprint must be a mapping")
    kubectl = next(
        (m for m in _modules(doc) if str(m.get("source", "")).endswith(KUBECTL_APPLY_SOURCE)), None
    )
    kueue = ((kubectl or {}).get("settings") or {}).get("kueue")
    if not isinstance(kueue, dict):
        raise BlueprintError(f"blueprint has no {KUBECTL_APPLY_SOURCE} module with kueue settings")
    return None if kueue.get("config_path") else KUEUE_DEFAULT_TEMPLATE
