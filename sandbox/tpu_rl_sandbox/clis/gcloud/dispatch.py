"""The fake ``gcloud``'s process entry: one call imports only the command group it runs.

``python -m tpu_rl_sandbox.clis.gcloud ARGS`` (the ``<root>/bin/gcloud`` shim) runs :func:`main`. The
suite starts the fake thousands of times, so a call resolves its command first and joins
:class:`GcloudDispatch` (the dispatch, the checks before a handler) with the one mixin that holds
the command's ``cmd_<path>`` handler (:data:`HANDLER_MIXINS`), importing that module alone;
:class:`~tpu_rl_sandbox.clis.gcloud.app.Gcloud` joins every mixin for in-process use. No two
mixins define the same name (``tests/sandbox/test_gcloud_dispatch.py``), so a handler finds the
same methods either way.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from tpu_rl_sandbox.clis.gcloud.auth import ACCOUNT_FREE_COMMANDS, NO_ACTIVE_ACCOUNT
from tpu_rl_sandbox.clis.gcloud.call import RELEASE_TRACKS, GcloudCall, api_path
from tpu_rl_sandbox.clis.gcloud.commands import COMMANDS
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, StorageOpError
from tpu_rl_sandbox.clis.gcloud.parser import GcloudUsageError, gcloud_parse, gcloud_resolve
from tpu_rl_sandbox.world.calls import call_start, record_call
from tpu_rl_sandbox.world.faults import FAULT_ENV, parse_faults
from tpu_rl_sandbox.world.layout import layout_from_env
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.store import StateError

# The mixin (module of this package, class) holding each command group's handlers, by the group's
# first words after the release track; the longer key wins.
HANDLER_MIXINS: dict[tuple[str, ...], tuple[str, str]] = {
    ("artifacts",): ("artifacts", "ArtifactsCommands"),
    ("auth",): ("auth", "AuthCommands"),
    ("config",): ("auth", "AuthCommands"),
    ("version",): ("auth", "AuthCommands"),
    ("compute", "disks"): ("compute_instances", "InstancesCommands"),
    ("compute", "firewall-rules"): ("compute_networks", "NetworksCommands"),
    ("compute", "images"): ("compute_images", "ImagesCommands"),
    ("compute", "instances"): ("compute_instances", "InstancesCommands"),
    ("compute", "networks"): ("compute_networks", "NetworksCommands"),
    ("compute", "operations"): ("compute_operations", "OperationsCommands"),
    ("compute", "project-info"): ("compute_project_info", "ProjectInfoCommands"),
    ("compute", "regions"): ("compute_reservations", "ReservationsCommands"),
    ("compute", "reservations"): ("compute_reservations", "ReservationsCommands"),
    ("compute", "ssh"): ("compute_ssh", "SshCommand"),
    ("container", "clusters"): ("container_clusters", "ClustersCommands"),
    ("container", "images"): ("container_images", "ContainerImagesCommands"),
    ("container", "node-pools"): ("container_node_pools", "NodePoolsCommands"),
    ("projects",): ("projects", "ProjectsCommands"),
    ("secrets",): ("secrets", "SecretsCommands"),
    ("services",): ("services", "ServicesCommands"),
    ("storage",): ("storage", "StorageCommands"),
}


class GcloudDispatch(GcloudCall):
    """A call's dispatch: the release track, the command, its flags, the checks, its handler."""

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
        except StorageOpError as error:
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


def handler_mixin(path: Sequence[str]) -> type[GcloudCall]:
    """The mixin that holds the handler of command ``path`` (its module imported now)."""
    words = api_path(tuple(path))
    module, name = HANDLER_MIXINS.get(words[:2]) or HANDLER_MIXINS[words[:1]]
    # __import__, not importlib.import_module: -X importtime (the bench's module count) sees it
    mixin: type[GcloudCall] = getattr(__import__(f"{__package__}.{module}", fromlist=[name]), name)
    return mixin


def gcloud_class(argv: Sequence[str]) -> type[GcloudDispatch]:
    """The class one call needs: the dispatch with its command's mixin; the dispatch alone when
    the command does not resolve (:meth:`GcloudDispatch.run` then fails as gcloud does)."""
    try:
        command, _ = gcloud_resolve(COMMANDS, argv)
    except GcloudUsageError:
        return GcloudDispatch
    return type("Gcloud", (GcloudDispatch, handler_mixin(command.path)), {})


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
        app = gcloud_class(args)(layout, env, stdin=read_stdin, stdout=out, stderr=err)
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
