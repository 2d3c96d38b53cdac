"""The read-only gcloud calls that read the TPU machines' own clocks (``ledger/billing.py``): an
instance's description, a GKE TPU node pool's node VMs, and the zone operations on instances.

Every flag is checked against gcloud 528's parser (``tests/render/test_real_gcloud.py``) and every
filter against its filter engine (``googlecloudsdk.core.resource.resource_filter``), on sample
resources: a ``~`` pattern holding parentheses is quoted (gcloud's filter lexer reads an unquoted
``(`` as the start of a value list), and ``~`` is used rather than ``=`` for the target's URL
(gcloud 528 warns that its ``=`` on such a value "is changing for consistency across Google APIs").
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.spec import rules

# The labels GKE sets on a node VM (Cloud Billing's cost table documents them for GKE resources:
# "goog-k8s-cluster-name: Filter GKE resources by cluster", "goog-k8s-node-pool-name: Filter
# cluster resources by node pool").
CLUSTER_LABEL = "goog-k8s-cluster-name"
NODE_POOL_LABEL = "goog-k8s-node-pool-name"
# A managed instance group names its VMs "<baseInstanceName>-<four random characters>" (compute v1
# InstanceGroupManager.baseInstanceName).
MIG_SUFFIX = "-[a-z0-9]{4}"


def _names(field: str, names: Sequence[str]) -> list[str]:
    if not names:
        raise ValueError(f"{field}: at least one name")
    for name in names:
        rules.match(field, name, rules.GCE_NAME, "a Compute Engine resource name")
    return list(names)


def describe_instance(project: str, zone: str, name: str) -> Command:
    """The instance as JSON: its ``id``, ``status``, ``lastStartTimestamp``, ``machineType``."""
    return Command(
        ("gcloud", "compute", "instances", "describe", name, f"--zone={zone}", f"--project={project}",
         "--format=json"),
        description=f"read when VM {name} last started (its billed time)",
    )  # fmt: skip


def list_pool_nodes(project: str, zone: str, cluster: str, pools: Sequence[str] = ()) -> Command:
    """The node VMs GKE labels with ``cluster`` (and one of ``pools``; none: any pool), as JSON.

    Anchored patterns, not ``=``: gcloud 528 warns that its ``=`` on a hyphenated value "currently
    does not match but will match in the near future" (``c1`` would match cluster ``c1-b``)."""
    wanted = f'labels.{CLUSTER_LABEL}~"^{_names("cluster", [cluster])[0]}$"'
    if pools:
        wanted += f' AND labels.{NODE_POOL_LABEL}~"^({"|".join(_names("pools", pools))})$"'
    return Command(
        ("gcloud", "compute", "instances", "list", f"--project={project}", f"--zones={zone}",
         f"--filter={wanted}", "--format=json"),
        description=f"list the node VMs of cluster {cluster}'s TPU node pool (their billed time)",
    )  # fmt: skip


def list_instance_operations(
    project: str, zone: str, names: Sequence[str], *, group_bases: bool = False
) -> Command:
    """The zone operations on the instances ``names`` (``group_bases``: on every VM of the managed
    instance groups whose base names these are), as JSON: inserts, starts, stops, preemptions and
    deletes, with their times."""
    pattern = "|".join(_names("names", names)) if not group_bases else "|".join(_names("bases", names))
    suffix = MIG_SUFFIX if group_bases else ""
    return Command(
        ("gcloud", "compute", "operations", "list", f"--project={project}", f"--zones={zone}",
         f'--filter=targetLink~"/instances/({pattern}){suffix}$"', "--format=json"),
        description="read the zone operations that started and ended the TPU machines (their billed time)",
    )  # fmt: skip
