"""What a Secret Manager read returns in the sandbox: a stand-in value derived from the stored hash,
or the API's refusal (not found, disabled, permission denied)."""

from __future__ import annotations

import hashlib

from tpu_rl_sandbox.world.iam import iam_member, member_has_permission
from tpu_rl_sandbox.world.inventory import project_number
from tpu_rl_sandbox.world.store import StateStore

SECRET_VERSION_STATE = (
    "google.api_core.exceptions.FailedPrecondition: 400 Secret Version "
    "[projects/{number}/secrets/{secret}/versions/{version}] is in {state} state."
)
SECRET_NOT_FOUND = "google.api_core.exceptions.NotFound: 404 Secret [projects/{number}/secrets/{secret}] not found or has no versions."
# Secret Manager's answer to a caller without secretmanager.versions.access on the secret or its
# project, whether or not the secret exists (the API's google.rpc status, as the client libraries
# print it, e.g. googleapis/python-secret-manager#389: "403 Permission
# 'secretmanager.versions.access' denied for resource 'projects/…/versions/1' (or it may not exist).").
SECRET_ACCESS_DENIED = (
    "PERMISSION_DENIED: Permission 'secretmanager.versions.access' denied for resource "
    "'projects/{project}/secrets/{secret}/versions/{version}' (or it may not exist)."
)


def placeholder_token(sha256: str) -> str:
    """What a secret "contains" inside the sandbox: a stand-in derived from its hash."""
    return "hf_sandbox_" + hashlib.sha256(sha256.encode()).hexdigest()[:24]


def secret_value(store: StateStore, project: str, secret: str, version: str) -> tuple[str | None, str]:
    """``(stand-in value, "")`` for an enabled secret version, else ``(None, error text)``."""
    secrets = store.read("secrets")
    record = secrets.get(f"{project}/{secret}")
    number = project_number(project)
    if record is None:
        return None, SECRET_NOT_FOUND.format(number=number, secret=secret)
    versions = list(record.get("versions", []))
    # "latest" is the newest version whatever its state (Secret Manager's alias): a disabled one
    # is refused, never skipped for an older enabled one.
    if version == "latest":
        chosen = versions[-1] if versions else None
    else:
        chosen = next((v for v in versions if str(v.get("version")) == version), None)
    if chosen is None:
        return None, SECRET_NOT_FOUND.format(number=number, secret=secret)
    if chosen.get("state", "ENABLED") != "ENABLED":
        return None, SECRET_VERSION_STATE.format(
            number=number, secret=secret, version=chosen["version"], state=chosen.get("state")
        )
    return placeholder_token(str(chosen["sha256"])), ""


def pod_secret_value(
    store: StateStore, identity: str, project: str, secret: str, version: str
) -> tuple[str | None, str]:
    """:func:`secret_value` as a pod reads it: its identity (:func:`pod_identity`: a service
    account e-mail or a Workload Identity principal) needs ``secretmanager.versions.access`` on the
    secret or its project, granted long enough ago to be in effect (:func:`member_has_permission`),
    else Secret Manager's 403 (:data:`SECRET_ACCESS_DENIED`)."""
    member = iam_member(identity)
    resources = [f"projects/{project}/secrets/{secret}", f"projects/{project}"]
    if not member_has_permission(store, resources, member, "secretmanager.versions.access"):
        return None, SECRET_ACCESS_DENIED.format(project=project, secret=secret, version=version)
    return secret_value(store, project, secret, version)
