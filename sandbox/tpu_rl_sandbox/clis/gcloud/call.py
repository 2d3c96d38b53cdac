"""One ``gcloud`` invocation: its environment and streams, the project, zone and account it
resolves, and the checks every API call makes (the service enabled, the caller's permission)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tpu_rl_sandbox.clis.gcloud.output import GcloudError, Write, api_error_text
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse
from tpu_rl_sandbox.world.faults import FaultGate
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.store import StateStore

if TYPE_CHECKING:  # the file views and the emulator's client: only commands that move files
    from tpu_rl_sandbox.machines.fsview import Router

# The API behind each command group (a disabled one fails the group's API calls).
API_OF_GROUP: dict[str, tuple[str, str]] = {
    "secrets": ("secretmanager.googleapis.com", "Secret Manager API"),
    "compute": ("compute.googleapis.com", "Compute Engine API"),
    "container": ("container.googleapis.com", "Kubernetes Engine API"),
    "artifacts": ("artifactregistry.googleapis.com", "Artifact Registry API"),
}
# Commands of a group that call none of its API: get-credentials writes a kubeconfig, images
# describe and add-tag talk to the images' registries (Docker Registry API).
LOCAL_COMMANDS = {
    ("container", "clusters", "get-credentials"),
    ("container", "images", "describe"),
    ("container", "images", "add-tag"),
}
# The release tracks a command path may start with (``gcloud alpha compute ...``).
RELEASE_TRACKS = ("alpha", "beta")
IMPERSONATE_ENV = "CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT"  # the auth/impersonate_service_account property


def api_path(path: tuple[str, ...]) -> tuple[str, ...]:
    """The command path without its release track: the API it calls is the same."""
    return path[1:] if path[:1] and path[0] in RELEASE_TRACKS else path


class GcloudCall:
    """One ``gcloud`` invocation; the command groups' mixins add its ``cmd_*`` handlers."""

    def __init__(
        self,
        layout: SandboxLayout,
        env: Mapping[str, str],
        stdin: Callable[[], bytes],
        stdout: Write,
        stderr: Write,
    ) -> None:
        self.layout = layout
        self.env = env
        self.read_stdin = stdin
        self.out = stdout
        self.err = stderr
        self.store = StateStore(layout)
        self._router: Router | None = None
        self._impersonated: str | None = None

    @property
    def router(self) -> Router:
        if self._router is None:
            from tpu_rl_sandbox.apis import gcs_emulator
            from tpu_rl_sandbox.machines.fsview import GcsStore, LocalStore, Router

            self._router = Router(GcsStore(gcs_emulator.api_for(self.layout)), LocalStore(Path("/")))
        return self._router

    def project(self, parsed: GcloudParse) -> str:
        project = parsed.get("project") or self.env.get("CLOUDSDK_CORE_PROJECT")
        if not project:
            raise GcloudError(
                "The required property [project] is not currently set.\nIt can be set on a per-command basis by "
                "re-running your command with the [--project] flag.\n\nYou may set it for your current workspace by "
                "running:\n\n  $ gcloud config set project VALUE"
            )
        return str(project)

    def zone(self, parsed: GcloudParse, resource: str) -> str:
        zone = parsed.get("zone") or self.env.get("CLOUDSDK_COMPUTE_ZONE")
        if not zone:
            raise GcloudError(f"Underspecified resource [{resource}]. Specify the [--zone] flag.")
        return str(zone)

    def faults(self) -> FaultGate:
        return FaultGate.from_env(self.store, self.env)

    def account(self) -> str:
        """Who the API calls run as: the impersonated target while impersonating, else the account."""
        return self._impersonated or self.env.get("CLOUDSDK_CORE_ACCOUNT", "sandbox-user@example.com")

    def impersonation(self, parsed: GcloudParse) -> tuple[str, list[str]] | None:
        """``(target, delegates)`` of the ``auth/impersonate_service_account`` property: the
        ``--impersonate-service-account`` flag, else ``CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT``
        (a flag sets its property for the invocation; properties.py reads ``CLOUDSDK_<SECTION>_<NAME>``).
        A comma-separated list is a delegation chain, the last account the target
        (googlecloudsdk/core/credentials/store.py ``ParseImpersonationAccounts``)."""
        value = parsed.get("impersonate-service-account") or self.env.get(IMPERSONATE_ENV)
        if not value:
            return None
        accounts = [account.strip() for account in str(value).split(",")]
        return accounts[-1], accounts[:-1]

    def _require_service(self, path: tuple[str, ...], parsed: GcloudParse) -> None:
        """An API call to a service disabled in the project (``settings.disabled_services``) fails
        with the API's 403 SERVICE_DISABLED text (gcloud does not offer to enable it without a
        terminal: googlecloudsdk/api_lib/util/api_enablement.py)."""
        service = API_OF_GROUP.get(path[0])
        project = parsed.get("project") or self.env.get("CLOUDSDK_CORE_PROJECT")
        if service is None or not project or path in LOCAL_COMMANDS:
            return
        if service[0] not in load_settings(self.layout).disabled_services:
            return
        from tpu_rl_sandbox.world import inventory  # here: a disabled service is rare

        number = inventory.project_number(str(project))
        message = (
            f"PERMISSION_DENIED: {service[1]} has not been used in project {number} before or it is disabled. "
            f"Enable it by visiting https://console.developers.google.com/apis/api/{service[0]}/overview?project={number} "
            "then retry. If you enabled this API recently, wait a few minutes for the action to propagate to our "
            "systems and retry."
        )
        raise GcloudError(api_error_text(message, self.account()))

    def _require_permission(self, permission: str, project: str, resource: str = "") -> None:
        """Refuse when the caller lacks ``permission`` (``settings.denied_permissions``), with the
        API's 403 text as gcloud prints it."""
        if permission not in load_settings(self.layout).denied_permissions:
            return
        if permission.startswith("compute."):
            raise GcloudError(
                f"Could not fetch resource:\n - Required '{permission}' permission for '{resource or 'projects/' + project}'"
            )
        if permission == "serviceusage.services.list":
            from tpu_rl_sandbox.world import inventory  # here: a denied permission is rare

            message = (
                "PERMISSION_DENIED: Permission denied to list services for consumer container "
                f"[projects/{inventory.project_number(project)}]"
            )
            raise GcloudError(api_error_text(message, self.account()))
        verb = permission.rsplit(".", 1)[-1]
        raise GcloudError(
            f"[{self.account()}] does not have permission to access projects instance [{project}:{verb}] "
            "(or it may not exist): The caller does not have permission"
        )
