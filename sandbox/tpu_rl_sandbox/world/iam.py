"""Who may do what in the fake cloud: IAM policies of projects, secrets and buckets, the roles that
hold a permission, when a grant takes effect, and who a pod is to Google APIs."""

from __future__ import annotations

import time
from typing import Any

from tpu_rl_sandbox.world.inventory import project_number
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.store import StateStore

WRITE_ROLES = {
    "roles/storage.admin",
    "roles/storage.objectAdmin",
    "roles/storage.objectCreator",
    "roles/storage.objectUser",
    "roles/owner",
    "roles/editor",
}


def account_can_write(store: StateStore, cluster: dict[str, Any], account: str) -> bool:
    """Whether the cluster's ``account`` (``node_pool`` or ``workload``) may create GCS objects: a
    writing role from its blueprint module, or one bound on the project."""
    granted = cluster.get(f"{account}_roles", [])
    roles = {f"roles/{r}" if not r.startswith("roles/") else r for r in granted}
    if roles & WRITE_ROLES:
        return True
    member = "serviceAccount:" + cluster.get("service_accounts", {}).get(account, "")
    bindings = store.read("iam").get("project_bindings", {}).get(cluster.get("project", ""), {})
    return any(member in bindings.get(role, []) for role in WRITE_ROLES)


def pod_identity(
    cluster: dict[str, Any], job: dict[str, Any], pool: dict[str, Any] | None = None
) -> tuple[str, str | None]:
    """Who a job's program is to Google APIs, and which of the cluster's accounts that is.

    TPU pods use the host network, so the node's service account: the one of the TPU pool they run
    on (``pool``, the pool's ``config.serviceAccount``: ``--service-account`` of ``gcloud container
    node-pools create``, else the Compute Engine default service account; container v1
    ``NodeConfig.serviceAccount``, direct), else the cluster's TPU pool account. Other pods get
    Workload Identity (the cluster's node pools run GKE_METADATA): their Kubernetes service
    account's Google service account, which only ``configure_workload_identity_sa``'s
    ``workload-identity-k8s-sa`` has (bound to the workload account); any other is the bare
    Workload Identity principal, with no role but those granted to it.
    """
    accounts = cluster.get("service_accounts", {})
    if job.get("tpu"):
        node_pool_account = accounts.get("node_pool", "")
        own = str((pool or {}).get("service_account") or node_pool_account)
        return own, "node_pool" if own == node_pool_account else None
    ksa = str(job.get("service_account") or "default")
    if ksa == cluster.get("workload_identity_ksa"):
        return accounts.get("workload", ""), "workload"
    project = cluster.get("project", "")
    return (
        f"principal://iam.googleapis.com/projects/{project_number(project)}/locations/global/workloadIdentityPools/{project}.svc.id.goog/subject/ns/default/sa/{ksa}",
        None,
    )


def iam_member(identity: str) -> str:
    """The IAM policy member of a pod's identity: a Workload Identity principal as it is, a
    service account e-mail as ``serviceAccount:<e-mail>``."""
    return identity if identity.startswith("principal://") else f"serviceAccount:{identity}"


def identity_can_write(
    store: StateStore, cluster: dict[str, Any], account: str | None, identity: str, bucket: str
) -> bool:
    """Whether a pod (``identity``, the cluster's ``account`` when it is one of them) may create
    objects in ``bucket``: its account's roles (:func:`account_can_write`), or a writing role bound
    to it on the bucket or the cluster's project (a platform team's grant)."""
    if account is not None and account_can_write(store, cluster, account):
        return True
    if not identity:
        return False
    resources = [f"b/{bucket}", f"projects/{cluster.get('project', '')}"]
    return member_has_permission(store, resources, iam_member(identity), "storage.objects.create")


# ====================================================================================== IAM
# The conditional binding a project's policy holds when ``settings.conditional_bindings`` is on
# (what makes gcloud refuse a binding without ``--condition`` in non-interactive mode).
PROJECT_CONDITIONAL_BINDING: dict[str, Any] = {
    "role": "roles/compute.viewer",
    "members": ["group:sandbox-auditors@example.com"],
    "condition": {
        "title": "until-2030",
        "expression": 'request.time < timestamp("2030-01-01T00:00:00Z")',
    },
}
# Predefined roles that hold a permission (the subset the fakes check), from Google's IAM roles
# reference: roles/editor has the storage object permissions but not secretmanager.versions.access.
PERMISSION_ROLES: dict[str, frozenset[str]] = {
    "secretmanager.versions.access": frozenset(
        {"roles/secretmanager.secretAccessor", "roles/secretmanager.admin", "roles/owner"}
    ),
    "storage.objects.create": frozenset(WRITE_ROLES),
    "storage.objects.delete": frozenset(
        {
            "roles/storage.admin",
            "roles/storage.objectAdmin",
            "roles/storage.objectUser",
            "roles/owner",
            "roles/editor",
        }
    ),
}


def parse_iam_resource(resource: str) -> tuple[str, str, str]:
    """``"projects/P"`` -> ``("project", "P", "")``, ``"projects/P/secrets/S"`` ->
    ``("secret", "P", "S")``, ``"b/BUCKET"`` -> ``("bucket", "", "BUCKET")``."""
    parts = resource.strip("/").split("/")
    if len(parts) == 2 and parts[0] == "projects":
        return "project", parts[1], ""
    if len(parts) == 4 and parts[0] == "projects" and parts[2] == "secrets":
        return "secret", parts[1], parts[3]
    if len(parts) == 2 and parts[0] == "b":
        return "bucket", "", parts[1]
    raise ValueError(f"unknown IAM resource {resource!r}: use projects/P, projects/P/secrets/S or b/BUCKET")


def policy_from_docs(
    docs: dict[str, dict[str, Any]], resource: str, conditional_project: bool
) -> tuple[dict[str, list[str]], list[dict[str, Any]]]:
    """``(unconditional role -> members, conditional bindings)`` of ``resource`` from the state
    documents ``iam``, ``secrets`` and ``buckets`` (copies; no lock taken here)."""
    kind, project, name = parse_iam_resource(resource)
    if kind == "project":
        iam = docs.get("iam", {})
        plain = iam.get("project_bindings", {}).get(project, {})
        conditional = list(iam.get("project_conditional", {}).get(project, []))
        if conditional_project:
            conditional.insert(0, PROJECT_CONDITIONAL_BINDING)
    else:
        record = (
            docs.get("secrets", {}).get(f"{project}/{name}")
            if kind == "secret"
            else docs.get("buckets", {}).get(name)
        ) or {}
        plain = record.get("bindings", {})
        conditional = list(record.get("conditional_bindings", []))
    return (
        {role: list(members) for role, members in plain.items()},
        [
            {"role": b["role"], "members": list(b["members"]), "condition": dict(b["condition"])}
            for b in conditional
        ],
    )


def iam_bindings(layout: SandboxLayout, resource: str) -> dict[str, list[str]]:
    """The unconditional bindings (role -> members) of an IAM policy in the sandbox.

    ``resource`` is ``"projects/P"`` (the project's policy), ``"projects/P/secrets/S"`` (a Secret
    Manager secret) or ``"b/BUCKET"`` (a bucket). Conditional bindings grant nothing
    unconditionally and are left out (:func:`iam_policy` has them).
    """
    return iam_policy(layout, resource)[0]


def iam_policy(layout: SandboxLayout, resource: str) -> tuple[dict[str, list[str]], list[dict[str, Any]]]:
    """``(unconditional role -> members, conditional bindings)`` of ``resource``."""
    settings = load_settings(layout)
    with StateStore(layout).txn() as txn:
        docs = {name: txn.doc(name) for name in ("iam", "secrets", "buckets")}
        return policy_from_docs(docs, resource, settings.conditional_bindings)


def member_has_permission(store: StateStore, resources: list[str], member: str, permission: str) -> bool:
    """Whether ``member`` holds a role with ``permission`` on any of ``resources`` (a resource and
    its ancestors, e.g. a secret and its project), unconditionally and in effect now: a binding
    with a recorded grant time counts only once ``iam_propagation_seconds`` have passed since it
    was added (IAM is eventually consistent: "Changes to allow or deny policies typically
    propagate in 2 minutes, but could potentially take 7 minutes or longer", Google Cloud IAM docs,
    "Access change propagation"). Only a secret's bindings carry a grant time
    (``gcloud secrets add-iam-policy-binding``), the grant a workload uses right after it is made."""
    roles = PERMISSION_ROLES[permission]
    delay = load_settings(store.layout).iam_propagation_seconds
    now = time.time()
    with store.txn() as txn:
        docs = {name: txn.doc(name) for name in ("iam", "secrets", "buckets")}
        for resource in resources:
            plain, _ = policy_from_docs(docs, resource, conditional_project=False)
            granted_at = grant_times(docs, resource)
            for role in roles:
                if member in plain.get(role, []) and now >= granted_at.get(role, {}).get(member, 0.0) + delay:
                    return True
    return False


def grant_times(docs: dict[str, dict[str, Any]], resource: str) -> dict[str, dict[str, float]]:
    """``role -> member -> time.time()`` of the bindings of ``resource`` whose grant time was
    recorded (a secret's, see :data:`GRANTED_AT`); the others have been in effect all along."""
    kind, project, name = parse_iam_resource(resource)
    if kind != "secret":
        return {}
    record = docs.get("secrets", {}).get(f"{project}/{name}") or {}
    return {role: dict(members) for role, members in (record.get(GRANTED_AT) or {}).items()}


# The key of a secret record that holds when each unconditional binding was added.
GRANTED_AT = "granted_at"
