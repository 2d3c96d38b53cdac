"""Fake ``gcloud``: the subset the provider uses, with gcloud's argument rules and messages.

Run as ``python -m tpu_rl_sandbox.clis.gcloud ARGS`` (through the ``<root>/bin/gcloud`` shim). The
command groups live in a module each; :class:`Gcloud` joins them and dispatches a call to its
``cmd_<path>`` handler. Buckets and objects live in fake-gcs-server; everything else (secrets,
IAM, VMs, clusters) in the sandbox state.
"""

from __future__ import annotations

import os
import sys
import time

from tpu_rl_sandbox.clis.gcloud import storage_ops
from tpu_rl_sandbox.clis.gcloud.artifacts import ArtifactsCommands
from tpu_rl_sandbox.clis.gcloud.auth import ACCOUNT_FREE_COMMANDS, NO_ACTIVE_ACCOUNT, AuthCommands
from tpu_rl_sandbox.clis.gcloud.call import RELEASE_TRACKS, api_path
from tpu_rl_sandbox.clis.gcloud.commands import COMMANDS
from tpu_rl_sandbox.clis.gcloud.compute_instances import InstancesCommands
from tpu_rl_sandbox.clis.gcloud.compute_networks import NetworksCommands
from tpu_rl_sandbox.clis.gcloud.compute_operations import OperationsCommands
from tpu_rl_sandbox.clis.gcloud.compute_project_info import ProjectInfoCommands
from tpu_rl_sandbox.clis.gcloud.compute_reservations import ReservationsCommands
from tpu_rl_sandbox.clis.gcloud.compute_ssh import SshCommand
from tpu_rl_sandbox.clis.gcloud.container_clusters import ClustersCommands
from tpu_rl_sandbox.clis.gcloud.container_images import ContainerImagesCommands
from tpu_rl_sandbox.clis.gcloud.container_node_pools import NodePoolsCommands
from tpu_rl_sandbox.clis.gcloud.output import GcloudError
from tpu_rl_sandbox.clis.gcloud.parser import GcloudUsageError, gcloud_parse, gcloud_resolve
from tpu_rl_sandbox.clis.gcloud.projects import ProjectsCommands
from tpu_rl_sandbox.clis.gcloud.secrets import SecretsCommands
from tpu_rl_sandbox.clis.gcloud.services import ServicesCommands
from tpu_rl_sandbox.clis.gcloud.storage import StorageCommands
from tpu_rl_sandbox.world.calls import call_start, record_call
from tpu_rl_sandbox.world.faults import FAULT_ENV, parse_faults
from tpu_rl_sandbox.world.layout import layout_from_env
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.store import StateError


class Gcloud(
    StorageCommands,
    AuthCommands,
    ProjectsCommands,
    SecretsCommands,
    SshCommand,
    InstancesCommands,  # with ImagesCommands (instances boot from images)
    OperationsCommands,
    ReservationsCommands,
    NetworksCommands,
    ProjectInfoCommands,
    ServicesCommands,
    ClustersCommands,
    NodePoolsCommands,
    ContainerImagesCommands,
    ArtifactsCommands,
):
    """One ``gcloud`` invocation, every command group the sandbox knows."""

    def run(self, argv: list[str]) -> int:
        track = argv[0] if argv and argv[0] in RELEASE_TRACKS else None
        if track is not None and track not in load_settings(self.layout).gcloud_components:
            return self.refuse_missing_component(track)
        command, rest = gcloud_resolve(COMMANDS, argv)
        parsed = gcloud_parse(command, rest)
        handler = getattr(self, "cmd_" + "_".join(part.replace("-", "_") for part in command.path))
        try:
            parse_faults(self.env.get(FAULT_ENV))
            loads_credentials = command.path not in ACCOUNT_FREE_COMMANDS
            if loads_credentials and not load_settings(self.layout).gcloud_logged_in:
                raise GcloudError(NO_ACTIVE_ACCOUNT)
            impersonated = self.impersonation(parsed) if loads_credentials else None
            if impersonated is not None:
                # store.py Load(): said on stderr whenever credentials are loaded while impersonating
                self._impersonated = impersonated[0]
                self.err(
                    "WARNING: This command is using service account impersonation. All API calls will be "
                    f"executed as [{impersonated[0]}].\n"
                )
            self._require_service(api_path(command.path), parsed)
            result: int = handler(parsed)
        except GcloudError as error:
            self.err(f"ERROR: ({command.dotted}) {error.message}\n")
            return error.code
        except storage_ops.StorageOpError as error:
            self.err(f"ERROR: ({command.dotted}) {error}\n")
            return 1
        except StateError as error:
            self.err(f"ERROR: ({command.dotted}) sandbox: {error}\n")
            return 1
        return result

    def refuse_missing_component(self, component: str) -> int:
        """``gcloud alpha|beta …`` without that component: the parser finds the group missing and
        asks the update manager to install it (calliope/parser_extensions.py, the "You do not
        currently have this command group installed" message); with prompts off that goes ahead,
        and on an SDK the user cannot write it stops (updater ``EnsureSDKWriteAccess``:
        core/exceptions.py ``RequiresAdminRightsError``), exit 1. The sandbox's SDK is not the
        caller's to write, as in the provider's toolchain image."""
        root = str(self.layout.bin_dir.parent / "google-cloud-sdk")
        self.err(
            "You do not currently have this command group installed.  Using it requires the installation "
            f"of components: [{component}]\n"
        )
        self.err(
            "ERROR: (gcloud) You cannot perform this action because you do not have permission to modify "
            f"the Google Cloud SDK installation directory [{root}].\n\nRe-run the command with sudo: sudo "
            f"{root}/bin/gcloud ...\n"
        )
        return 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of the fake ``gcloud``; records the call in ``<root>/calls.jsonl``."""
    args = list(sys.argv[1:] if argv is None else argv)
    start = call_start(os.environ, time.time())
    env = dict(os.environ)
    try:
        layout = layout_from_env(env)
    except Exception as error:
        sys.stderr.write(f"ERROR: (gcloud) {error}\n")
        return 1
    code = 1

    def read_stdin() -> bytes:
        return sys.stdin.buffer.read() if sys.stdin is not None else b""

    def out(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def err(text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    try:
        app = Gcloud(layout, env, stdin=read_stdin, stdout=out, stderr=err)
        try:
            code = app.run(args)
        except GcloudUsageError as error:
            sys.stderr.write(error.render())
            code = 2
        except GcloudError as error:
            sys.stderr.write(f"ERROR: (gcloud) {error.message}\n")
            code = error.code
        except StateError as error:
            sys.stderr.write(f"ERROR: (gcloud) sandbox: {error}\n")
            code = 1
        return code
    finally:
        record_call(layout, "gcloud", args, env, os.getcwd(), code, start, time.time())
        sys.stdout.flush()
