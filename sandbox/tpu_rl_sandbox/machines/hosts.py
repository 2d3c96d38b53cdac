"""The machines the rendered scripts run on: a GKE pod (workload image) and a TPU VM.

A machine's files live in a host folder; :mod:`~tpu_rl_sandbox.machines.machine` runs the real ``/bin/bash`` over them in
private namespaces. This module says what each machine holds (its mounts, its fake tools, the
image's files) and implements the fake tools that run in the supervisor (the tool server calls
:meth:`MachineHost.run_tool`). The pod's image already has MaxText; the VM starts as a bare
Ubuntu image and only gets ``uv``, a venv, MaxText and its extra dependencies when the script
installs them (``~/.local/bin`` and the venv are only on ``$PATH`` after ``source``-ing their
scripts, as in a real non-login SSH session).
"""

from __future__ import annotations

import base64
import contextlib
import json
import posixpath
import re
import shlex
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_rl_sandbox.apis.gcs_client import GcsApi, split_gs_url
from tpu_rl_sandbox.clis.gcloud.in_machine import run_on_vm
from tpu_rl_sandbox.clis.gcloud.parser import GcloudUsageError
from tpu_rl_sandbox.machines import dockerd, maxtext_sim, pod_image
from tpu_rl_sandbox.machines.fsview import GcsStore, LocalStore, Router, StorageError
from tpu_rl_sandbox.machines.machine import (
    MACHINE_PATH,
    TOOLS_DIR,
    Machine,
    MachineSpec,
    ToolCall,
    Write,
    machine_timeout,
    shim_text,
)
from tpu_rl_sandbox.world import secret_values
from tpu_rl_sandbox.world.faults import FaultSpec
from tpu_rl_sandbox.world.registry import digest_of, image_parts
from tpu_rl_sandbox.world.timescale import DOCKER_INSTALL, INSTALL, PULL, stage_real_minutes

UV_INSTALLER_URL_RE = re.compile(r"^https://astral\.sh/uv/(?:[0-9.]+/)?install\.sh$")
SECRET_ACCESS_RE = re.compile(
    r"^https://secretmanager\.googleapis\.com/v1/projects/([^/]+)/secrets/([^/]+)/versions/([^/:]+):access$"
)
METADATA_PROJECT_URL = "http://metadata.google.internal/computeMetadata/v1/project/project-id"
METADATA_TOKEN_URL = (
    "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
)
# The GKE metadata server's answer to a token request while the pod's Kubernetes service account is
# not yet bound to its IAM service account (the symptom Google's gke-workload-identity skill lists:
# "Permission 'iam.serviceAccounts.getAccessToken' denied on resource (or it may not exist)").
WORKLOAD_IDENTITY_NOT_EFFECTIVE = (
    "Unable to generate access token; IAM returned 403 Forbidden: Permission "
    "'iam.serviceAccounts.getAccessToken' denied on resource (or it may not exist)."
)
UV_VERSION = "0.9.7"
VENV_PYTHON = "3.12"
SITE = f"lib/python{VENV_PYTHON}/site-packages"

SecretAccess = Callable[[str, str, str], tuple[str | None, str]]


# (permission, resources) -> whether the machine's service account holds it on one of them
Authorize = Callable[[str, list[str]], bool]


@dataclass
class MachineServices:
    """What a machine can reach outside itself.

    ``authorize`` (set for a TPU VM) checks the IAM policy of the machine's service account;
    ``bucket_project`` names the project a bucket belongs to (its policy is inherited).
    """

    gcs: GcsStore
    secret_access: SecretAccess
    fault: Callable[[str], FaultSpec | None]
    seed: str
    step_seconds: float
    hold_file: str | None
    cancelled: Callable[[], bool]
    default_project: str = ""
    authorize: Authorize | None = None
    bucket_project: Callable[[str], str | None] | None = None
    minute_seconds: float = 0.0  # the time scale (settings.SandboxSettings.minute_seconds)
    # stages' real minutes that replace the time scale's (settings.SandboxSettings.stage_minutes)
    stage_minutes: Mapping[str, float] = field(default_factory=dict)
    hold_seconds: float = 120.0  # the longest a hold lasts (settings.SandboxSettings.hold_seconds)
    # (run directory, its committed checkpoints, steps trained past the newest) -> the machine is
    # lost now (settings' preempt_after_checkpoints, preempt_steps_after; the caller remembers
    # that it fired)
    preempt: Callable[[str, int, int], bool] = lambda run_dir, committed, past: False
    # Told of every simulated MaxText program the machine starts (its module, the runtime it ran
    # in: the machine's ``runtime``, and the MaxText release it imports): the sandbox's record of
    # which VM ran what, and how.
    on_program: Callable[[str, str, str], None] | None = None
    # A GKE pod's Workload Identity binding is in effect (settings' workload_identity_effective,
    # read at each token request); until then the metadata server refuses the pod a token.
    workload_identity_effective: Callable[[], bool] = lambda: True


SCOPE_DENIED = "Access denied. Provided scope(s) are not authorized."
STORAGE_WRITE_SCOPES = frozenset({"cloud-platform", "storage-rw", "storage-full"})


class IamGcsStore(GcsStore):
    """GCS as a VM's service account sees it: the access scopes first, then IAM on the bucket or
    its project (``storage.objects.create`` for a new object, also ``storage.objects.delete`` to
    replace or delete one), with Cloud Storage's 403 texts."""

    def __init__(
        self,
        api: GcsApi,
        identity: str,
        scopes: list[str],
        authorize: Authorize,
        bucket_project: Callable[[str], str | None],
    ) -> None:
        super().__init__(
            api,
            identity=identity,
            can_write=lambda bucket: bool(STORAGE_WRITE_SCOPES & set(scopes)),
            denied_detail=SCOPE_DENIED,
        )
        self._scopes = scopes
        self._authorize = authorize
        self._bucket_project = bucket_project

    def _resources(self, bucket: str) -> list[str]:
        project = self._bucket_project(bucket)
        return [f"b/{bucket}", *([f"projects/{project}"] if project else [])]

    def _require(self, permission: str, bucket: str, key: str, method: str) -> None:
        if self._authorize(permission, self._resources(bucket)):
            return
        url = (
            f"https://storage.googleapis.com/upload/storage/v1/b/{bucket}/o?uploadType=resumable"
            if method == "POST"
            else f"https://storage.googleapis.com/storage/v1/b/{bucket}/o/{key}"
        )
        raise StorageError(
            f"google.api_core.exceptions.Forbidden: 403 {method} {url}: {self.identity} does not have "
            f"{permission} access to the Google Cloud Storage object. Permission '{permission}' denied on "
            "resource (or it may not exist)."
        )

    def write(self, path: str, data: bytes) -> None:
        bucket, key = split_gs_url(path)
        if STORAGE_WRITE_SCOPES & set(self._scopes):
            self._require("storage.objects.create", bucket, key, "POST")
            if self.exists(path):
                self._require("storage.objects.delete", bucket, key, "POST")
        super().write(path, data)

    def delete(self, path: str) -> None:
        bucket, key = split_gs_url(path)
        self.check_delete(bucket, key)
        super().delete(path)

    def check_delete(self, bucket: str, key: str) -> None:
        """Raise :class:`StorageError` unless the account may delete ``gs://bucket/key``."""
        if not STORAGE_WRITE_SCOPES & set(self._scopes):
            raise StorageError(
                "google.api_core.exceptions.Forbidden: 403 DELETE "
                f"https://storage.googleapis.com/storage/v1/b/{bucket}/o/{key}: {SCOPE_DENIED}"
            )
        self._require("storage.objects.delete", bucket, key, "DELETE")


class MachineStore(LocalStore):
    """A machine's files as the supervisor sees them: its mounts map into its host folder.

    Paths outside the machine's own mounts are the host's read-only system directories there:
    they can be read (at the same host path) but not written (``EROFS``, as in the machine).
    """

    def __init__(self, root: Path, mounts: tuple[str, ...]) -> None:
        super().__init__(root)
        self.mounts = mounts

    def own(self, path: str) -> bool:
        clean = posixpath.normpath("/" + path.lstrip("/"))
        return any(clean == m or clean.startswith(m.rstrip("/") + "/") for m in self.mounts)

    def host_path(self, path: str) -> Path:
        if self.own(path):
            return super().host_path(path)
        return Path(posixpath.normpath("/" + path.lstrip("/")))

    def write(self, path: str, data: bytes) -> None:
        if not self.own(path):
            raise StorageError(f"OSError: [Errno 30] Read-only file system: '{path}'")
        super().write(path, data)

    def delete(self, path: str) -> None:
        if not self.own(path):
            raise StorageError(f"OSError: [Errno 30] Read-only file system: '{path}'")
        super().delete(path)

    def make_dir(self, path: str) -> None:
        if not self.own(path):
            raise StorageError(f"OSError: [Errno 30] Read-only file system: '{path}'")
        super().make_dir(path)

    def rename_dir(self, src: str, dst: str) -> None:
        if not (self.own(src) and self.own(dst)):
            raise StorageError(f"OSError: [Errno 30] Read-only file system: '{dst}'")
        super().rename_dir(src, dst)


class MachineHost:
    """Mounts, fake tools and the tool implementations shared by the pod and the VM."""

    platform = "gke"
    runtime = "image"  # what MaxText runs from: the pod's image, a VM's venv or a container on a VM
    mounts: tuple[str, ...] = ("/tmp", "/root", "/usr/local", "/dev/shm")  # noqa: S108 (machine paths)
    tools: dict[str, str] = {}
    python_path = ""
    hidden: tuple[str, ...] = ()  # host paths the machine does not have (MachineSpec.hidden)

    def __init__(self, fs_root: Path, services: MachineServices, hostname: str) -> None:
        self.fs = MachineStore(fs_root, self.mounts)
        self.services = services
        self.hostname = hostname
        self.router = Router(services.gcs, self.fs)
        self.preempted = False
        for directory in self.mounts:
            self.fs.host_path(directory).mkdir(parents=True, exist_ok=True)

    # -- running --------------------------------------------------------------------------
    def run(
        self,
        argv: list[str],
        stdin: bytes | None,
        stdout: int | Write,
        stderr: int | Write,
        env: dict[str, str],
        cwd: str = "/",
        caller_env: Mapping[str, str] | None = None,
    ) -> int:
        """Run ``argv`` (``bash -c ...``) on the machine with ``env``; its exit status."""
        spec = MachineSpec(
            root=self.fs.root,
            hostname=self.hostname,
            mounts=self.mounts,
            tools=dict(self.tools),
            python_path=self.python_path,
            env=env,
            cwd=cwd,
            argv=argv,
            timeout=machine_timeout(dict(caller_env) if caller_env is not None else None),
            hidden=self.hidden,
            devices=self.devices(),
        )
        return Machine(spec, self.run_tool, self.services.cancelled).run(stdin, stdout, stderr)

    def devices(self) -> tuple[str, ...]:
        """The machine's device paths under /dev beyond the standard ones (none)."""
        return ()

    # Every tool call on the machine, with the NAMES of its environment (never values), one JSON
    # line each, in the machine's own file system: what a test reads to check which process saw a
    # secret (``/tmp/.sandbox-tool-calls.jsonl``, in the machine's own /tmp).
    TOOL_CALL_LOG = "/tmp/.sandbox-tool-calls.jsonl"  # noqa: S108  (a path inside the machine)

    def log_call(self, call: ToolCall) -> None:
        """Append ``call`` to :attr:`TOOL_CALL_LOG` (its environment's names only)."""
        if self.fs.own(self.TOOL_CALL_LOG):
            log = self.fs.host_path(self.TOOL_CALL_LOG)
            log.parent.mkdir(parents=True, exist_ok=True)
            entry = {"tool": call.tool, "argv": call.argv[:4], "env_names": sorted(call.env)}
            with log.open("a") as handle:
                handle.write(json.dumps(entry) + "\n")

    def run_tool(self, call: ToolCall) -> int:
        """Dispatch one fake-tool call by its kind (the ``TOOL`` of its shim)."""
        self.log_call(call)
        handler = {
            "python": self.tool_python,
            "pip": self.tool_pip,
            "gcloud": self.tool_gcloud,
            "gsutil": self.tool_gsutil,
            "curl": self.tool_curl,
            "wget": self.tool_wget,
            "http": self.tool_http,
        }.get(call.tool)
        if handler is None:
            call.err(f"sandbox: no {call.tool!r} on this machine\n")
            return 127
        return handler(call)

    def tpu_chips(self) -> int | None:
        """The machine's TPU chips (``None``: not modelled, a GKE pod placed by its node pool)."""
        return None

    # -- python ---------------------------------------------------------------------------
    def python_packages(self, call: ToolCall) -> set[str] | None:
        """Distributions importable by the calling interpreter (``None`` = the image's: all)."""
        return None

    def maxtext_version(self, call: ToolCall) -> str:
        """The MaxText release the calling interpreter imports: the ``tpu_post_training`` image's."""
        return maxtext_sim.GKE_MAXTEXT_VERSION

    def tool_python(self, call: ToolCall) -> int:
        """``python3 -m MODULE``: MaxText's entry points are simulated (:mod:`maxtext_sim`), pip
        goes to :meth:`tool_pip`; any other module is refused as not simulated."""
        args = call.argv[1:]
        while args and args[0] != "-m":
            args = args[1:]
        if len(args) < 2:
            call.err(f"{call.argv[0]}: Argument expected for the -m option\n")
            return 2
        module = args[1]
        packages = self.python_packages(call)
        top = module.split(".", 1)[0]
        if packages is not None and top not in packages:
            call.err(
                f"{call.path}: Error while finding module specification for '{module}' "
                f"(ModuleNotFoundError: No module named '{top}')\n"
            )
            return 1
        if module == "pip":
            return self.tool_pip(ToolCall(**{**call.__dict__, "argv": ["pip", *args[2:]]}))
        if module == maxtext_sim.TRAIN_RL and packages is not None and "tunix" not in packages:
            call.err("Traceback (most recent call last):\nModuleNotFoundError: No module named 'tunix'\n")
            return 1
        if module not in maxtext_sim.MODULES:
            call.err(f"sandbox: python3 -m {module} is not simulated\n")
            return 1
        services = self.services
        if services.on_program is not None:
            services.on_program(module, self.runtime, self.maxtext_version(call))
        if module == maxtext_sim.TRAIN_RL and self.tpu_chips() == 0:
            # JAX on a machine without TPU chips, asked for the TPU (TPU_* set, as train_rl's
            # McJAX run does): the backend cannot start; MaxText's trainer needs it.
            call.err(maxtext_sim.NO_TPU_ERROR + "\n")
            return 1
        ctx = maxtext_sim.SimContext(
            router=self.router,
            write=call.out,
            platform=self.platform,
            seed=services.seed,
            maxtext_version=self.maxtext_version(call),
            fault=services.fault,
            cancelled=call.cancelled,
            step_seconds=services.step_seconds,
            minute_seconds=services.minute_seconds,
            stage_minutes=services.stage_minutes,
            hold_file=services.hold_file,
            hold_seconds=services.hold_seconds,
            preempt=services.preempt,
            tpu_chips=self.tpu_chips(),
        )
        try:
            return maxtext_sim.run(module, args[2:], call.env, ctx)
        except maxtext_sim.Cancelled:
            return 137
        except maxtext_sim.Preempted:
            self.preempted = True  # the machine went away under the workload
            return 137

    def tool_pip(self, call: ToolCall) -> int:
        """The image's pip: every requirement of the workload is already installed."""
        args = call.argv[1:]
        if not args or args[0] not in ("install", "list", "show", "freeze", "--version"):
            call.err(f'ERROR: unknown command "{args[0] if args else ""}"\n')
            return 1
        if args[0] == "--version":
            call.out("pip 25.1.1 from /usr/local/lib/python3.12/site-packages/pip (python 3.12)\n")
            return 0
        call.out("Requirement already satisfied\n")
        return 0

    # -- network --------------------------------------------------------------------------
    def tool_curl(self, call: ToolCall) -> int:
        """curl(1) without network: only the uv installer URL answers (VM); any other host does
        not resolve (exit 6, curl's CURLE_COULDNT_RESOLVE_HOST)."""
        urls = [a for a in call.argv[1:] if a.startswith(("http://", "https://"))]
        if not urls:
            call.err(
                "curl: no URL specified!\ncurl: try 'curl --help' or 'curl --manual' for more information\n"
            )
            return 2
        installer = self.uv_installer(urls[0])
        if installer is not None:
            call.out(installer)
            return 0
        host = urls[0].split("/")[2]
        if not any(a.startswith("-") and "s" in a and not a.startswith("--") for a in call.argv[1:]) or any(
            a.startswith("-") and "S" in a and not a.startswith("--") for a in call.argv[1:]
        ):
            call.err(f"curl: (6) Could not resolve host: {host}\n")
        return 6

    def uv_installer(self, url: str) -> str | None:
        return None

    def tool_wget(self, call: ToolCall) -> int:
        """wget(1) without network: name resolution fails (exit 4, wget's network failure)."""
        urls = [a for a in call.argv[1:] if "://" in a]
        if not urls:
            call.err("wget: missing URL\nUsage: wget [OPTION]... [URL]...\n")
            return 1
        host = urls[0].split("/")[2]
        call.err(f"Resolving {host} ({host})... failed: Temporary failure in name resolution.\n")
        call.err(f"wget: unable to resolve host address '{host}'\n")
        return 4

    def tool_gsutil(self, call: ToolCall) -> int:
        """gsutil is not simulated: Google documents ``gcloud storage`` as its replacement, and the
        rendered scripts use only that; a call is refused rather than half-simulated."""
        call.err("sandbox: gsutil is not simulated; use `gcloud storage`\n")
        return 1

    # -- google cloud ---------------------------------------------------------------------
    def identity(self) -> str:
        return self.services.gcs.identity

    def project(self) -> str:
        return self.services.default_project

    def secret_access(self, project: str, secret: str, version: str) -> tuple[str | None, str]:
        return self.services.secret_access(project, secret, version)

    def gcs_for_gcloud(self) -> GcsStore:
        return self.services.gcs

    def tool_gcloud(self, call: ToolCall) -> int:
        """The machine's own gcloud (storage copies, Secret Manager reads) with its identity."""
        router = Router(self.gcs_for_gcloud(), self.fs)

        def absolute_path(path: str) -> str:
            return path if path.startswith("gs://") else call.absolute(path)

        reads_stdin = "-" in call.argv[1:] or "--data-file=-" in call.argv[1:]
        try:
            return run_on_vm(
                call.argv[1:],
                router=router,
                to_absolute=absolute_path,
                secret_access=self.secret_access,
                default_project=self.project(),
                stdout=call.out,
                stderr=call.err,
                stdin=call.read_stdin().decode("utf-8", "replace") if reads_stdin else "",
            )
        except GcloudUsageError as error:
            call.err(error.render())
            return 2

    def tool_http(self, call: ToolCall) -> int:
        """HTTP answers for in-machine client libraries: Secret Manager ``versions/*:access``
        (REST v1: ``{"name", "payload": {"data": base64}}`` or a google.rpc error body) and the
        metadata server's project id and service account token (each needs
        ``Metadata-Flavor: Google``, else 403; a GKE pod's token also its Workload Identity binding
        in effect, else 403)."""
        method, url = call.argv[0], call.argv[1]
        headers = json.loads(call.argv[2]) if len(call.argv) > 2 else {}
        if url == METADATA_PROJECT_URL or url.split("?", 1)[0] == METADATA_TOKEN_URL:
            if headers.get("Metadata-Flavor") != "Google":
                call.data = "Missing Metadata-Flavor:Google header."
                return 403
            if url == METADATA_PROJECT_URL:
                call.data = self.project()
                return 200
            if self.platform == "gke" and not self.services.workload_identity_effective():
                call.data = WORKLOAD_IDENTITY_NOT_EFFECTIVE
                return 403
            call.data = json.dumps(
                {"access_token": "sandbox-token", "expires_in": 3599, "token_type": "Bearer"}
            )
            return 200
        match = SECRET_ACCESS_RE.match(url)
        if method != "GET" or match is None:
            call.data = json.dumps({"error": {"code": 404, "message": "Not Found", "status": "NOT_FOUND"}})
            return 404
        project, secret, version = match.groups()
        value, problem = self.secret_access(project, secret, version)
        if value is None:
            denied = "PERMISSION_DENIED" in problem
            code = 403 if denied else 404
            message = problem.split(": ", 1)[-1]
            message = re.sub(r"^\d{3} ", "", message)
            call.data = json.dumps(
                {
                    "error": {
                        "code": code,
                        "message": message,
                        "status": "PERMISSION_DENIED" if denied else "NOT_FOUND",
                    }
                }
            )
            return code
        payload = base64.b64encode(value.encode()).decode()
        call.data = json.dumps(
            {"name": f"projects/{project}/secrets/{secret}/versions/{version}", "payload": {"data": payload}}
        )
        return 200


class PodHost(MachineHost):
    """The Pathways head / main container of a GKE job (``tpu_post_training`` image).

    Python 3.12 image (``python:3.12-slim-bookworm``) with MaxText in ``/deps`` (its WORKDIR),
    tunix and google-auth in site-packages, gcloud installed; runs as root.
    """

    platform = "gke"
    mounts = ("/tmp", "/root", "/usr/local", "/deps", "/dev/shm", "/sys/fs/cgroup")  # noqa: S108
    tools = {
        "python3": "python",
        "python": "python",
        "pip": "pip",
        "pip3": "pip",
        "gcloud": "gcloud",
        "gsutil": "gsutil",
        "curl": "curl",
        "wget": "wget",
    }
    python_path = pod_image.SITE_PACKAGES
    image_env = {
        "MAXTEXT_ASSETS_ROOT": "/deps/src/maxtext/assets",
        "MAXTEXT_PKG_DIR": "/deps/src/maxtext",
        "MAXTEXT_REPO_ROOT": "/deps",
        "LANG": "C.UTF-8",
        "PYTHON_VERSION": "3.12.11",
    }
    workdir = "/deps"

    def __init__(
        self, fs_root: Path, services: MachineServices, job_name: str, tpu_chips: int | None = None
    ) -> None:
        super().__init__(fs_root, services, f"{job_name}-0")
        for path, text in pod_image.POD_FILES.items():
            self.fs.write(path, text.encode())
        # cgroup v2 as a container sees it: no limit until someone writes one.
        self.fs.write("/sys/fs/cgroup/memory.max", b"max\n")
        self.chips = tpu_chips

    def tpu_chips(self) -> int | None:
        """The chips the pod's node gives it: 0 on a CPU node pool, the VM's on a TPU one."""
        return self.chips

    def base_env(self) -> dict[str, str]:
        return {"PATH": MACHINE_PATH, "HOME": "/root", "HOSTNAME": self.hostname, **self.image_env}


class ContainerHost(PodHost):
    """A container ``docker run`` starts on a VM from the post-training image: the image's files
    (as a GKE pod's), the VM's hostname and network (``--net=host``: its service account through
    the metadata server, so GCS as the VM sees it), and the VM's TPU chips only when privileged
    (docker gives a container no host device otherwise: no /dev/vfio, /dev/accel*)."""

    platform = "vm"
    runtime = "container"

    def __init__(self, fs_root: Path, services: MachineServices, hostname: str, tpu_chips: int) -> None:
        MachineHost.__init__(self, fs_root, services, hostname)
        for path, text in pod_image.POD_FILES.items():
            self.fs.write(path, text.encode())
        self.fs.write("/sys/fs/cgroup/memory.max", b"max\n")
        self.chips = tpu_chips


DOCKER_VERSION = "Docker version 24.0.7, build 24.0.7-0ubuntu2~22.04.1"  # jammy-updates' docker.io
DOCKER_SOCKET = "unix:///var/run/docker.sock"
# docker run's flags the rendered scripts may use; others are refused as not simulated.
DOCKER_RUN_SWITCHES = ("--rm", "--privileged", "-i", "--interactive", "-t", "--tty", "--init")
DOCKER_RUN_VALUES = (
    "--name", "--net", "--network", "--ipc", "-e", "--env", "-w", "--workdir", "--shm-size", "-l", "--label",
)  # fmt: skip
# docker logs' flags beyond --follow (docs.docker.com/reference/cli/docker/container/logs/): real,
# but not simulated here.
DOCKER_LOGS_UNSIMULATED = ("--details", "--since", "--until", "-n", "--tail", "-t", "--timestamps")


# The one ``--format`` of ``docker image inspect`` the sandbox plays (the bake and the boot check).
IMAGE_ID_FORMAT = "{{.Id}}"


def image_id(digest: str) -> str:
    """A pulled image's id (its config's digest) in the sandbox: derived from its manifest digest."""
    import hashlib

    return "sha256:" + hashlib.sha256(digest.encode()).hexdigest()


def docker_socket_denied(endpoint: str, method: str = "Post") -> str:
    """The docker client's error for a user outside the ``docker`` group (the socket is root:docker
    660): moby's ``client/request.go`` ``doRequest`` of the 23.x/24.x clients wraps the dial error
    as "permission denied while trying to connect to the Docker daemon socket at %v" (older ones
    began with "Got")."""
    return (
        f"permission denied while trying to connect to the Docker daemon socket at {DOCKER_SOCKET}: "
        f'{method} "http://%2Fvar%2Frun%2Fdocker.sock/v1.24/{endpoint}": dial unix /var/run/docker.sock: '
        "connect: permission denied\n"
    )


APT_LISTS_LOCK = "/var/lib/apt/lists/lock"
DPKG_FRONTEND_LOCK = "/var/lib/dpkg/lock-frontend"
BOOT_APT_PID, UPGRADES_PID = 812, 1033


def _apt_arguments(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """apt's command line without its ``-o NAME=VALUE`` options, and those options (names
    lower-cased: apt's configuration names are case-insensitive)."""
    args: list[str] = []
    options: dict[str, str] = {}
    items = iter(argv)
    for arg in items:
        if arg in ("-o", "--option"):
            setting = next(items, "")
        elif arg.startswith("-o") and len(arg) > 2 and not arg.startswith("--"):
            setting = arg[2:]
        elif arg.startswith("--option="):
            setting = arg.split("=", 1)[1]
        else:
            args.append(arg)
            continue
        name, _, value = setting.partition("=")
        options[name.lower()] = value
    return args, options


class VmHost(MachineHost):
    """A Compute Engine VM reached over SSH as ``user``: a TPU VM (``ct6e-*``, Ubuntu 22.04
    accelerator image) or a CPU VM (any other machine type: no TPU chips)."""

    platform = "vm"
    runtime = "install"
    mounts = ("/home", "/tmp", "/root", "/usr/local", "/dev/shm")  # noqa: S108 (machine paths)
    tools = {
        "python3": "python",
        "sudo": "sudo",
        "apt": "apt",
        "apt-get": "apt",
        "curl": "curl",
        "wget": "wget",
        "gcloud": "gcloud",
        "gsutil": "gsutil",
    }

    def __init__(
        self,
        fs_root: Path,
        services: MachineServices,
        vm_name: str,
        user: str,
        project: str,
        scopes: list[str],
        apt_busy_until: tuple[float, float] = (0.0, 0.0),
        sudoer: bool = True,
        machine_type: str = "ct6e-standard-8t",
        zone: str = "",
        layout_root: Path | None = None,
        credential_helper: bool = True,
        tpu_vfio: bool = True,
    ) -> None:
        super().__init__(fs_root, services, vm_name)
        # the boot disk has Cloud TPU's udev rule binding the chips to vfio-pci
        # (clis/gcloud/compute_images.py binds_tpu_vfio)
        self.tpu_vfio = tpu_vfio
        if credential_helper:
            # google-cloud-cli's /usr/bin/docker-credential-gcloud: on every PATH, sudo's too
            self.tools = {**self.tools, "docker-credential-gcloud": "docker-credential-gcloud"}
        else:  # nor the host's (the machine's /usr is the host's, read-only)
            self.hidden = (*self.hidden, "/usr/bin/docker-credential-gcloud")
        self.machine_type = machine_type
        self.zone = zone
        self.layout_root = layout_root  # the sandbox's folder: the daemon's containers rebuild services
        self.caller_env: dict[str, str] = {}
        self.user = user
        if not sudoer:
            # An OS Login user without admin login (compute.instances.osAdminLogin) is in no
            # sudoers file (the guest's google_oslogin_nss writes /var/google-sudoers.d only for
            # admins): sudo wants a password it cannot read without a terminal.
            self.tools = {**self.tools, "sudo": "sudo-denied"}
        self.vm_project = project
        self.scopes = scopes
        # The image's own apt work after boot: apt-daily's update holds apt's lists lock until the
        # first time, then unattended-upgrades holds dpkg's frontend lock until the second.
        self.lists_busy_until, self.dpkg_busy_until = apt_busy_until
        self.fs.host_path(self.home).mkdir(parents=True, exist_ok=True)
        for directory in ("bin", "lib", "sbin", "share"):
            self.fs.host_path(f"/usr/local/{directory}").mkdir(parents=True, exist_ok=True)

    @property
    def home(self) -> str:
        return f"/home/{self.user}"

    def tpu_chips(self) -> int:
        """The machine type decides the devices: ``ct6e-standard-Nt`` has N TPU chips, others none."""
        return tpu_chips_of(self.machine_type)

    def devices(self) -> tuple[str, ...]:
        """A TPU VM's chips as VFIO devices (``/dev/vfio/vfio`` and a group per chip, as tpu-info
        opens them), when its boot disk has the udev rule that binds them; none otherwise."""
        chips = self.tpu_chips()
        if not chips or not self.tpu_vfio:
            return ()
        return ("/dev/vfio/vfio", *(f"/dev/vfio/{chip}" for chip in range(chips)))

    def login_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """What sshd gives a session: HOME, USER, LOGNAME, SHELL, PATH (plus the client's LANG)."""
        env = {
            "HOME": self.home,
            "USER": self.user,
            "LOGNAME": self.user,
            "PATH": MACHINE_PATH,
            "SHELL": "/bin/bash",
            "SSH_CONNECTION": "10.128.0.1 50022 10.128.0.5 22",
        }
        env.update({k: v for k, v in base.items() if k in ("LANG", "LC_ALL", "TERM")})
        return env

    def run_session(
        self, argv: list[str], stdin: bytes, out: Write, err: Write, caller_env: Mapping[str, str]
    ) -> int:
        self.caller_env = {k: v for k, v in caller_env.items() if k.startswith("TPU_RL_SANDBOX_")}
        return self.run(argv, stdin, out, err, self.login_env(caller_env), self.home, caller_env)

    def run_tool(self, call: ToolCall) -> int:
        handler = {
            "apt": self.tool_apt,
            "uv": self.tool_uv,
            "extra-deps": self.tool_extra_deps,
            "venv-pip": self.tool_pip,
            "sudo-denied": self.tool_sudo_denied,
            "docker": self.tool_docker,
            "docker-credential-gcloud": self.tool_credential_helper,
        }.get(call.tool)
        if handler is None:
            return super().run_tool(call)
        self.log_call(call)
        return handler(call)

    # -- installed software ---------------------------------------------------------------
    @staticmethod
    def _venv_of(path: str) -> str | None:
        directory = posixpath.dirname(path)
        return posixpath.dirname(directory) if directory.endswith("/bin") else None

    def is_venv(self, venv: str | None) -> bool:
        return venv is not None and (self.fs.host_path(venv) / "pyvenv.cfg").is_file()

    def venv_packages(self, venv: str) -> set[str]:
        site = self.fs.host_path(f"{venv}/{SITE}")
        if not site.is_dir():
            return set()
        return {p.name.split("-", 1)[0].lower() for p in site.iterdir() if p.name.endswith(".dist-info")}

    def add_packages(self, venv: str, packages: Mapping[str, str]) -> None:
        """Record installed distributions the way pip does: ``<name>-<version>.dist-info`` (one
        version of a distribution at a time: installing another replaces it, as pip's
        ``install_given_reqs`` uninstalls the installed version of a requirement it reinstalls,
        pip ``_internal/req/__init__.py`` and ``req_install.py``'s ``InstallRequirement.uninstall``)."""
        for name, version in packages.items():
            normalized = re.sub(r"[-_.]+", "_", name).lower()
            for old in self.fs.host_path(f"{venv}/{SITE}").glob(f"{normalized}-*.dist-info"):
                if old.name != f"{normalized}-{version}.dist-info":
                    shutil.rmtree(old)
            self.fs.write(
                f"{venv}/{SITE}/{normalized}-{version}.dist-info/METADATA",
                f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
            )
            self.fs.write(f"{venv}/{SITE}/{normalized}-{version}.dist-info/INSTALLER", b"uv\n")

    def python_packages(self, call: ToolCall) -> set[str] | None:
        venv = self._venv_of(call.path)
        if self.is_venv(venv):
            assert venv is not None
            return self.venv_packages(venv)
        return set()  # the image's /usr/bin/python3: standard library only

    def maxtext_version(self, call: ToolCall) -> str:
        """The version pip (uv) installed into the calling interpreter's venv (its dist-info)."""
        site = self.fs.host_path(f"{self._venv_of(call.path)}/{SITE}")
        installed = sorted(p.name for p in site.glob("maxtext-*.dist-info"))
        return installed[-1][len("maxtext-") : -len(".dist-info")] if installed else "(not installed)"

    def _install(self, path: str, tool: str) -> None:
        target = self.fs.host_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(shim_text(tool))
        target.chmod(0o755)

    def uv_installer(self, url: str) -> str | None:
        """The uv installer script (``curl -LsSf https://astral.sh/uv/install.sh | sh``): puts ``uv``
        and ``uvx`` into ``$HOME/.local/bin`` and writes ``$HOME/.local/bin/env`` (the PATH
        snippet of cargo-dist installers), then prints what the real installer prints."""
        if not UV_INSTALLER_URL_RE.match(url):
            return None
        shim = shim_text("uv")
        env_script = (
            "#!/bin/sh\n# add binaries to PATH if they aren't added yet\n"
            "# affix colons on either side of $PATH to simplify matching\n"
            'case ":${PATH}:" in\n    *:"$HOME/.local/bin":*)\n        ;;\n    *)\n'
            "        # Prepending path in case a system-installed binary needs to be overridden\n"
            '        export PATH="$HOME/.local/bin:$PATH"\n        ;;\nesac\n'
        )
        return (
            "#!/bin/sh\n# uv installer (tpu-rl-sandbox stand-in for astral.sh/uv/install.sh)\nset -eu\n"
            'dir="${XDG_BIN_HOME:-$HOME/.local/bin}"\n'
            f'echo "downloading uv {UV_VERSION} x86_64-unknown-linux-gnu"\n'
            'echo "no checksums to verify"\necho "installing to $dir"\nmkdir -p "$dir"\n'
            f"for tool in uv uvx; do\ncat > \"$dir/$tool\" <<'TPU_RL_SANDBOX_EOF'\n{shim}TPU_RL_SANDBOX_EOF\n"
            'chmod +x "$dir/$tool"\necho "  $tool"\ndone\n'
            f"cat > \"$dir/env\" <<'TPU_RL_SANDBOX_EOF'\n{env_script}TPU_RL_SANDBOX_EOF\n"
            'echo "everything\'s installed!"\necho\n'
            'echo "To add $dir to your PATH, either restart your shell or run:"\necho\n'
            'echo "    source $dir/env (sh, bash, zsh)"\n'
        )

    def tool_uv(self, call: ToolCall) -> int:
        """uv's ``--version``, ``python install``, ``venv`` and ``pip install`` (uv 0.9 rules:
        ``pip install`` needs a virtual environment (``VIRTUAL_ENV`` or ``./.venv``) unless
        ``--system``; ``venv`` refuses an existing non-empty directory without
        ``--allow-existing``/``--clear``); other sub-commands are refused like clap does."""
        args = call.argv[1:]
        if args in (["--version"], ["-V"], ["version"]):
            call.out(f"uv {UV_VERSION}\n")
            return 0
        home = call.env.get("HOME", self.home)
        if args[:2] == ["python", "install"]:
            for version in args[2:] or [VENV_PYTHON]:
                base = f"{home}/.local/share/uv/python/cpython-{version}.9-linux-x86_64-gnu"
                self._install(f"{base}/bin/python{version}", "python")
                call.err(f"Installed Python {version}.9 in 2.31s\n + cpython-{version}.9-linux-x86_64-gnu\n")
            return 0
        if args and args[0] == "venv":
            return self.uv_venv(call, args[1:])
        if args[:2] == ["pip", "install"]:
            venv = call.env.get("VIRTUAL_ENV") or call.absolute(".venv")
            if "--system" in args or not self.is_venv(venv):
                call.err(
                    "error: No virtual environment found; run `uv venv` to create an environment, or pass "
                    "`--system` to install into a non-virtual environment\n"
                )
                return 2
            return self.pip_install(call, venv, args[2:])
        command = args[0] if args else ""
        call.err(
            f"error: unrecognized subcommand '{command}'\n\nUsage: uv [OPTIONS] <COMMAND>\n\n"
            "For more information, try '--help'.\n"
            if command
            else "Usage: uv [OPTIONS] <COMMAND>\n"
        )
        return 2

    def uv_venv(self, call: ToolCall, args: list[str]) -> int:
        names: list[str] = []
        flags: set[str] = set()
        skip = False
        for item in args:
            if skip:
                skip = False
                continue
            if item in ("--python", "-p", "--prompt"):
                skip = True
                continue
            if item.startswith("-"):
                if item.split("=", 1)[0] not in (
                    "--python",
                    "--seed",
                    "--allow-existing",
                    "--clear",
                    "--prompt",
                    "-q",
                    "--quiet",
                ):
                    call.err(
                        f"error: unexpected argument '{item}' found\n\nUsage: uv venv [OPTIONS] [PATH]\n"
                    )
                    return 2
                flags.add(item.split("=", 1)[0])
                continue
            names.append(item)
        if len(names) > 1:
            call.err(f"error: unexpected argument '{names[1]}' found\n\nUsage: uv venv [OPTIONS] [PATH]\n")
            return 2
        shown = names[0] if names else ".venv"
        venv = call.absolute(shown)
        target = self.fs.host_path(venv)
        if not self.fs.own(venv):
            call.err(f"error: Failed to create directory `{venv}`: Read-only file system (os error 30)\n")
            return 2
        if target.exists() and any(target.iterdir()) and not flags & {"--allow-existing", "--clear"}:
            call.err(
                f"error: Failed to create virtual environment\n  Caused by: A directory already exists at: {shown}\n\n"
                "hint: Use the `--clear` flag or set `UV_VENV_CLEAR=1` to replace the existing directory\n"
                "hint: Use the `--allow-existing` flag or set `UV_VENV_ALLOW_EXISTING=1` to update the existing "
                "directory\n"
            )
            return 2
        call.err(
            f"Using CPython {VENV_PYTHON}.9\nCreating virtual environment with seed packages at: {shown}\n"
        )
        self.fs.write(
            f"{venv}/pyvenv.cfg",
            f"home = {call.env.get('HOME', self.home)}/.local/share/uv/python/cpython-{VENV_PYTHON}.9-linux-x86_64-gnu/bin\n"
            f"implementation = CPython\nuv = {UV_VERSION}\nversion_info = {VENV_PYTHON}.9\n"
            "include-system-site-packages = false\n".encode(),
        )
        for name in ("python", "python3", f"python{VENV_PYTHON}"):
            self._install(f"{venv}/bin/{name}", "python")
        self.fs.write(f"{venv}/bin/activate", activate_script(venv, posixpath.basename(venv)).encode())
        self.fs.host_path(f"{venv}/{SITE}").mkdir(parents=True, exist_ok=True)
        if "--seed" in flags:
            self._install(f"{venv}/bin/pip", "venv-pip")
            self.add_packages(venv, {"pip": "25.3"})
            call.err(" + pip==25.3\n")
        call.err(f"Activate with: source {shown}/bin/activate\n")
        return 0

    def pip_install(self, call: ToolCall, venv: str, args: list[str]) -> int:
        requested: dict[str, str] = {}
        for item in args:
            if item.startswith("-"):
                continue
            name = re.split(r"[\[=<>~! ;]", item, maxsplit=1)[0]
            pinned = re.search(r"==\s*([0-9][^,; ]*)", item)
            requested[name.lower()] = pinned.group(1) if pinned else "1.0.0"
        if not requested:
            call.err(
                "error: the following required arguments were not provided:\n  <PACKAGE|--requirements <REQUIREMENTS>>\n"
            )
            return 2
        self.add_packages(venv, requested)
        if "maxtext" in requested:
            # the install from sources takes its real minutes when the time scale is on
            if not self.wait_minutes(call, self.stage_minutes(INSTALL)):
                return 137
            self._install(f"{venv}/bin/install_tpu_post_train_extra_deps", "extra-deps")
            self.add_packages(
                venv,
                {"jax": "0.8.1", "orbax-checkpoint": "0.11.28", "transformers": "4.57.1", "torch": "2.9.0"},
            )
        call.err(f"Resolved 212 packages in 3.1s\nInstalled {len(requested) + 200} packages in 41.2s\n")
        return 0

    def stage_minutes(self, stage: str) -> float:
        """Real minutes of one of the VM's own stages (install, pull, Docker install)."""
        return stage_real_minutes(stage, overrides=self.services.stage_minutes) or 0.0

    def wait_minutes(self, call: ToolCall, minutes: float) -> bool:
        """Last ``minutes`` real minutes on the time scale (none when it is off); False if cancelled."""
        deadline = time.monotonic() + minutes * self.services.minute_seconds
        while time.monotonic() < deadline:
            if call.cancelled():
                return False
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        return True

    def tool_pip(self, call: ToolCall) -> int:
        """A venv's seeded pip (``<venv>/bin/pip``); the bare image has no pip."""
        venv = self._venv_of(call.path)
        if not self.is_venv(venv) or "pip" not in self.venv_packages(str(venv)):
            call.err(f"{call.argv[0]}: No module named pip\n")
            return 1
        assert venv is not None
        if call.argv[1:2] == ["install"]:
            return self.pip_install(call, venv, call.argv[2:])
        return super().tool_pip(call)

    def tool_extra_deps(self, call: ToolCall) -> int:
        """MaxText's ``install_tpu_post_train_extra_deps``: tunix, vllm, tpu-inference from GitHub."""
        venv = self._venv_of(call.path)
        if not self.is_venv(venv):
            call.err("install_tpu_post_train_extra_deps: MaxText's virtual environment is gone\n")
            return 1
        assert venv is not None
        self.add_packages(
            venv, {"google-tunix": "0.1.7", "tunix": "0.1.7", "vllm": "0.11.1", "tpu_inference": "0.11.1"}
        )
        call.out("Installing post-training extra dependencies (tunix, vllm, tpu-inference)...\nDone.\n")
        return 0

    # -- system tools ---------------------------------------------------------------------
    @staticmethod
    def tool_sudo_denied(call: ToolCall) -> int:
        """sudo 1.9 (Ubuntu 22.04) for a user without a sudoers entry and no terminal: tgetpass.c's
        "a terminal is required..." then check.c's "a password is required", exit 1."""
        call.err(
            "sudo: a terminal is required to read the password; either use the -S option to read from "
            "standard input or configure an askpass helper\nsudo: a password is required\n"
        )
        return 1

    def tool_apt(self, call: ToolCall) -> int:
        """apt/apt-get: root only (dpkg's frontend lock), ``update``/``upgrade``/``install``;
        without ``-y`` (or ``DEBIAN_FRONTEND=noninteractive``... which does not answer the
        prompt either) an install that needs confirmation aborts as on a non-terminal stdin."""
        args, options = _apt_arguments(call.argv[1:])
        if call.env.get("USER") != "root":
            call.err(
                "E: Could not open lock file /var/lib/dpkg/lock-frontend - open (13: Permission denied)\n"
                "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), are you root?\n"
            )
            return 100
        action = next((a for a in args if not a.startswith("-")), "")
        assume_yes = any(
            a in ("-y", "--yes", "--assume-yes") or (re.fullmatch(r"-[a-z]*y[a-z]*", a) is not None)
            for a in args
        )
        if action == "update" and time.time() < self.lists_busy_until:
            # apt-pkg/contrib/fileutl.cc GetLock: the lists lock is taken without waiting,
            # whatever DPkg::Lock::Timeout says (that one is dpkg's lock only).
            call.out("Reading package lists...\n")
            call.err(
                f"E: Could not get lock {APT_LISTS_LOCK}. It is held by process {BOOT_APT_PID} (apt-get)\n"
                "E: Unable to lock directory /var/lib/apt/lists/\n"
            )
            return 100
        if action != "update" and not self._dpkg_lock(call, options):
            return 100
        if action == "update":
            call.out(
                "Hit:1 http://us-central1.gce.archive.ubuntu.com/ubuntu jammy InRelease\nReading package lists... Done\n"
            )
            return 0
        if action in ("upgrade", "install", "dist-upgrade", "full-upgrade"):
            call.out("Reading package lists... Done\nBuilding dependency tree... Done\n")
            if not assume_yes:
                call.out("Do you want to continue? [Y/n] Abort.\n")
                return 1
            packages = [a for a in args if not a.startswith("-") and a != action]
            if action == "install" and "docker.io" in packages:
                if not self.wait_minutes(call, self.stage_minutes(DOCKER_INSTALL)):
                    return 137
                # Ubuntu's docker.io: /usr/bin/docker and dockerd (the sandbox's /usr is the host's,
                # read-only: the client goes to /usr/local/bin, also on every PATH and sudo's)
                self._install("/usr/local/bin/docker", "docker")
            call.out(f"Setting up {', '.join(packages) or 'upgrades'} ...\n")
            return 0
        call.err(f"E: Invalid operation {action}\n")
        return 100

    def _dpkg_lock(self, call: ToolCall, options: Mapping[str, str]) -> bool:
        """dpkg's frontend lock, waited for up to ``DPkg::Lock::Timeout`` seconds (apt-pkg's
        debSystem::Lock: "Waiting for cache lock: …" while it waits), else refused at once."""
        held_by = (
            f"Could not get lock {DPKG_FRONTEND_LOCK}. It is held by process {UPGRADES_PID} (unattended-upgr)"
        )
        try:
            wait = max(0.0, float(options.get("dpkg::lock::timeout", "0")))
        except ValueError:
            wait = 0.0
        deadline = time.time() + wait
        while time.time() < self.dpkg_busy_until:
            if time.time() >= deadline:
                call.err(
                    f"E: {held_by}\n"
                    f"E: Unable to acquire the dpkg frontend lock ({DPKG_FRONTEND_LOCK}), is another process "
                    "using it?\n"
                )
                return False
            call.out(f"Waiting for cache lock: {held_by}...\n")
            time.sleep(min(0.5, max(0.01, self.dpkg_busy_until - time.time())))
        return True

    # -- docker ---------------------------------------------------------------------------
    @property
    def docker_state_file(self) -> Path:
        """The daemon's own state (``/var/lib/docker``: the images pulled), outside the machine's mounts."""
        return self.fs.root / ".sandbox-dockerd.json"

    def docker_images(self) -> dict[str, str]:
        try:
            return dict(json.loads(self.docker_state_file.read_text()).get("images", {}))
        except (OSError, ValueError):
            return {}

    def docker_config(self, env: Mapping[str, str]) -> dict[str, object]:
        """The client's ``config.json``: ``$DOCKER_CONFIG`` or ``$HOME/.docker`` (root's under sudo)."""
        directory = env.get("DOCKER_CONFIG") or f"{env.get('HOME', '/root')}/.docker"
        try:
            loaded = json.loads(self.fs.host_path(f"{directory}/config.json").read_text())
        except (OSError, ValueError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def tool_docker(self, call: ToolCall) -> int:
        """Ubuntu's docker.io client and its daemon: ``pull``, ``run``, ``rm``, ``inspect``,
        ``logs``, ``wait``, ``--version``.

        Root only (the login user is in no ``docker`` group). A pull needs credentials for the
        image's registry in the client's config (gcloud's helper or an ``auths`` entry) and an image
        the sandbox's registry holds (``world/registry.py``), with Artifact Registry's answers
        otherwise. ``tag`` and ``image inspect`` work on the daemon's images.
        """
        args = call.argv[1:]
        if args in (["--version"], ["-v"]):
            call.out(DOCKER_VERSION + "\n")
            return 0
        command = args[0] if args else ""
        if command == "image" and args[1:2] == ["inspect"]:
            command, args = "image-inspect", ["image-inspect", *args[2:]]
        commands = ("pull", "run", "rm", "inspect", "logs", "wait", "tag", "image-inspect", "login", "logout")
        if command not in commands:
            call.err(f"docker: '{command}' is not a docker command.\nSee 'docker --help'\n")
            return 1
        if call.env.get("USER") != "root":
            endpoint = {
                "pull": "images/create",
                "run": "containers/create",
                "rm": "containers/x",
                "inspect": "containers/x/json",
                "logs": "containers/x/logs",
                "wait": "containers/x/wait",
                "tag": "images/x/tag",
                "image-inspect": "images/x/json",
                "login": "auth",
                "logout": "auth",
            }[command]
            call.err(docker_socket_denied(endpoint, "Get" if command == "logs" else "Post"))
            return 1
        if command == "pull":
            if len(args) != 2 or args[1].startswith("-"):
                call.err("\"docker pull\" requires exactly 1 argument.\nSee 'docker pull --help'.\n")
                return 1
            return self.docker_pull(call, args[1])
        if command == "login":
            return self.docker_login(call, args[1:])
        if command == "logout":
            return self.docker_logout(call, args[1:])
        if command == "rm":
            return self.docker_rm(call, args[1:])
        if command == "inspect":
            return self.docker_inspect(call, args[1:])
        if command == "logs":
            return self.docker_logs(call, args[1:])
        if command == "wait":
            return self.docker_wait(call, args[1:])
        if command == "tag":
            return self.docker_tag(call, args[1:])
        if command == "image-inspect":
            return self.docker_image_inspect(call, args[1:])
        return self.docker_run(call, args[1:])

    def image_digest(self, reference: str) -> str | None:
        """The digest of the daemon's image ``reference`` names (a tag it has, or the digest of an
        image it has: a pull by tag records the repository's digest too), None if it has none."""
        images = self.docker_images()
        if reference in images:
            return images[reference]
        host, path, ref = image_parts(reference)
        if ref.startswith("sha256:"):
            held = {(*image_parts(name)[:2], digest) for name, digest in images.items()}
            return ref if (host, path, ref) in held else None
        return None

    def docker_tag(self, call: ToolCall, args: list[str]) -> int:
        """``docker tag SOURCE TARGET``: another name of an image the daemon has (moby's 404 else)."""
        if len(args) != 2 or any(arg.startswith("-") for arg in args):
            call.err("\"docker tag\" requires exactly 2 arguments.\nSee 'docker tag --help'.\n")
            return 1
        digest = self.image_digest(args[0])
        if digest is None:
            call.err(f"Error response from daemon: No such image: {args[0]}\n")
            return 1
        images = self.docker_images()
        images[args[1]] = digest
        self.docker_state_file.write_text(json.dumps({"images": images}))
        return 0

    def docker_image_inspect(self, call: ToolCall, args: list[str]) -> int:
        """``docker image inspect --format={{.Id}} IMAGE...``: each image's id (the one format the
        sandbox plays); moby client's "Error: No such image: REF" for one the daemon has not."""
        parsed = _inspect_arguments(call, args, "docker image inspect")
        if parsed is None:
            return 125
        form, names = parsed
        if form != IMAGE_ID_FORMAT:
            call.err(f"sandbox: docker image inspect --format {form!r} is not simulated\n")
            return 125
        code = 0
        for name in names:
            digest = self.image_digest(name)
            if digest is None:
                call.err(f"Error: No such image: {name}\n")
                code = 1
                continue
            call.out(image_id(digest) + "\n")
        return code

    def docker_rm(self, call: ToolCall, args: list[str]) -> int:
        """``docker rm [--force] NAME...``: a running container only with ``--force`` (its
        processes killed first), as the daemon answers otherwise."""
        force = any(a in ("-f", "--force") for a in args)
        unknown = [a for a in args if a.startswith("-") and a not in ("-f", "--force")]
        if unknown:
            call.err(f"unknown flag: {unknown[0]}\nSee 'docker rm --help'.\n")
            return 125
        code = 0
        for name in [a for a in args if not a.startswith("-")]:
            record = dockerd.containers(self.fs.root).get(name)
            if record is None:
                call.err(f"Error response from daemon: No such container: {name}\n")
                code = 1
            elif dockerd.running(record) and not force:
                call.err(
                    f"Error response from daemon: You cannot remove a running container {record['id']}. "
                    "Stop the container before attempting removal or force remove\n"
                )
                code = 1
            else:
                dockerd.stop(self.fs.root, name)
                call.out(f"{name}\n")
        return code

    def docker_inspect(self, call: ToolCall, args: list[str]) -> int:
        """``docker inspect --format FORMAT NAME...``, for a template of the actions the sandbox
        plays (:func:`dockerd.render_inspect`: the id, the state's running, status and start, the
        command, a label); "Error: No such object" for a name the daemon has not."""
        parsed = _inspect_arguments(call, args, "docker inspect")
        if parsed is None:
            return 125
        form, names = parsed
        if form is None:
            call.err("sandbox: docker inspect without --format (its JSON document) is not simulated\n")
            return 125
        code = 0
        for name in names:
            record = dockerd.containers(self.fs.root).get(name)
            if record is None:
                call.err(f"Error: No such object: {name}\n")
                code = 1
                continue
            shown = dockerd.render_inspect(form, record)
            if shown is None:
                call.err(f"sandbox: docker inspect --format {form!r} is not simulated\n")
                return 125
            call.out(shown + "\n")
        return code

    def docker_logs(self, call: ToolCall, args: list[str]) -> int:
        """``docker logs [--follow] NAME`` (docs.docker.com/reference/cli/docker/container/logs/):
        the container's output from its start, stdout to stdout and stderr to stderr; with
        ``--follow`` streamed until the container stops. "No such container" for a name the daemon
        has not (a ``--rm`` container that ended is gone)."""
        follow = False
        names = []
        for arg in args:
            flag = arg.split("=", 1)[0]
            if arg in ("-f", "--follow"):
                follow = True
            elif flag in DOCKER_LOGS_UNSIMULATED:
                call.err(f"sandbox: docker logs {flag} is not simulated\n")
                return 125
            elif arg.startswith("-"):
                call.err(f"unknown flag: {flag}\nSee 'docker logs --help'.\n")
                return 125
            else:
                names.append(arg)
        if len(names) != 1:
            call.err("\"docker logs\" requires exactly 1 argument.\nSee 'docker logs --help'.\n")
            return 1
        record = dockerd.containers(self.fs.root).get(names[0])
        if record is None:
            call.err(f"Error response from daemon: No such container: {names[0]}\n")
            return 1
        return self.relay_logs(call, record, follow=follow)

    def relay_logs(self, call: ToolCall, record: dict[str, Any], *, follow: bool) -> int:
        """The container's output files relayed from their start; following, until it stops. The
        files are opened first: a ``--rm`` container's are deleted at its removal, and an open
        stream reads them to their end (as moby's json-file reader keeps its file open)."""
        import codecs

        streams = []
        with contextlib.ExitStack() as opened:
            for key, write in (("out", call.out), ("err", call.err)):
                with contextlib.suppress(OSError):
                    handle = opened.enter_context(Path(record[key]).open("rb"))
                    streams.append((handle, write, codecs.getincrementaldecoder("utf-8")("replace")))
            while True:
                current = dockerd.containers(self.fs.root).get(record["name"]) or record
                stopped = (
                    current.get("id") != record["id"]
                    or Path(record["exit_file"]).is_file()
                    or not dockerd.running(current)
                )
                for handle, write, decoder in streams:
                    text = decoder.decode(handle.read())
                    if text:
                        write(text)
                if not follow or stopped:
                    return 0
                if call.cancelled():
                    return 137
                time.sleep(0.05)

    def docker_wait(self, call: ToolCall, args: list[str]) -> int:
        """``docker wait NAME...`` (docs.docker.com/reference/cli/docker/container/wait/): block
        until each container stops, then print its exit code; 137 for one killed (``docker rm
        --force``, the VM's end). "No such container" for a name the daemon has not: a ``--rm``
        container that ended before the wait began is gone, its status with it (the CLI waits for
        the condition "not-running": one asked while the container runs gets its status, one asked
        after its removal 404s; the race docker-java/docker-java#2487 describes)."""
        flags = [a for a in args if a.startswith("-")]
        if flags:
            call.err(f"unknown flag: {flags[0]}\nSee 'docker wait --help'.\n")
            return 125
        if not args:
            call.err("\"docker wait\" requires at least 1 argument.\nSee 'docker wait --help'.\n")
            return 1
        code = 0
        for name in args:
            record = dockerd.containers(self.fs.root).get(name)
            if record is None:
                call.err(f"Error response from daemon: No such container: {name}\n")
                code = 1
                continue
            status = self.container_exit(call, record)
            if status is None:
                return 137  # the client is gone
            call.out(f"{status}\n")
        return code

    def container_exit(self, call: ToolCall, record: dict[str, Any]) -> int | None:
        """The container's exit status once it stops; None when the waiting client goes first."""
        exit_file = Path(record["exit_file"])
        while True:
            if exit_file.is_file():
                with contextlib.suppress(ValueError, OSError):
                    outcome = json.loads(exit_file.read_text())
                    self.preempted = self.preempted or bool(outcome.get("preempted"))
                    return int(outcome["exit"])
            current = dockerd.containers(self.fs.root).get(record["name"]) or record
            if current.get("id") == record["id"] and current.get("exit") is not None:
                return int(current["exit"])
            if not dockerd.running(current) and not exit_file.is_file():
                return 137  # killed: no status was written
            if call.cancelled():
                return None
            time.sleep(0.05)

    def missing_helper(self, call: ToolCall, config: Mapping[str, object], host: str) -> bool:
        """The registry's credential helper in ``config`` is not a program the client can run:
        Docker's client fails (docker-credential-helpers client.go: "error getting credentials -
        err: exec: ..."; the helper is looked up on the client's PATH, sudo's secure_path as root)."""
        helpers = config.get("credHelpers") or {}
        helper = helpers.get(host) if isinstance(helpers, dict) else None
        if not helper or f"docker-credential-{helper}" in self.tools:
            return False
        call.err(
            f'error getting credentials - err: exec: "docker-credential-{helper}": executable file not '
            "found in $PATH, out: ``\n"
        )
        return True

    def docker_login(self, call: ToolCall, args: list[str]) -> int:
        """``docker login --username=U --password-stdin REGISTRY``: the password from stdin into
        ``auths`` of the client's config (docker prints its unencrypted-storage warning), or into
        the registry's credential helper when one is configured for it. Artifact Registry takes the
        user ``oauth2accesstoken`` with an access token (its "access token" authentication). The
        warning and "Login Succeeded" as docker's client prints them (docker/cli's login command;
        read in users' transcripts of it, second-hand: no docker/cli source was reachable here)."""
        username, password_stdin, positionals = "", False, []
        for arg in args:
            if arg.startswith(("--username=", "-u=")):
                username = arg.split("=", 1)[1]
            elif arg == "--password-stdin":
                password_stdin = True
            elif arg.startswith("-"):
                call.err(f"unknown flag: {arg}\nSee 'docker login --help'.\n")
                return 125
            else:
                positionals.append(arg)
        if len(positionals) != 1 or not password_stdin or not username:
            call.err(
                "sandbox: docker login is simulated with --username=, --password-stdin and a registry only\n"
            )
            return 1
        registry = positionals[0].removeprefix("https://").rstrip("/")
        token = call.read_stdin().decode().strip()
        if username != "oauth2accesstoken" or not token.startswith("ya29."):
            call.err(
                f'Error response from daemon: Get "https://{registry}/v2/": denied: Unauthenticated request.\n'
            )
            return 1
        config = self.docker_config(call.env)
        if self.missing_helper(call, config, registry):
            return 1
        helpers = config.get("credHelpers") or {}
        if not (isinstance(helpers, dict) and helpers.get(registry)):
            auths = config.setdefault("auths", {})
            assert isinstance(auths, dict)
            auths[registry] = {"auth": base64.b64encode(f"{username}:{token}".encode()).decode()}
            self.write_docker_config(call.env, config)
            directory = call.env.get("DOCKER_CONFIG") or f"{call.env.get('HOME', '/root')}/.docker"
            call.err(
                f"WARNING! Your password will be stored unencrypted in {directory}/config.json.\n"
                "Configure a credential helper to remove this warning. See\n"
                "https://docs.docker.com/engine/reference/commandline/login/#credentials-store\n\n"
            )
        call.out("Login Succeeded\n")
        return 0

    def docker_logout(self, call: ToolCall, args: list[str]) -> int:
        """``docker logout REGISTRY``: its ``auths`` entry removed from the client's config."""
        if len(args) != 1 or args[0].startswith("-"):
            call.err('"docker logout" requires at most 1 argument.\n')
            return 1
        registry = args[0].removeprefix("https://").rstrip("/")
        config = self.docker_config(call.env)
        auths = config.get("auths") or {}
        if not (isinstance(auths, dict) and registry in auths):
            call.out(f"Not logged in to {registry}\n")
            return 0
        call.out(f"Removing login credentials for {registry}\n")
        del auths[registry]
        self.write_docker_config(call.env, config)
        return 0

    def write_docker_config(self, env: Mapping[str, str], config: Mapping[str, object]) -> None:
        directory = env.get("DOCKER_CONFIG") or f"{env.get('HOME', '/root')}/.docker"
        self.fs.write(f"{directory}/config.json", json.dumps(config, indent=2).encode())

    @staticmethod
    def tool_credential_helper(call: ToolCall) -> int:
        """gcloud's ``docker-credential-gcloud get``: the registry on stdin, the caller's token out."""
        if call.argv[1:] != ["get"]:
            call.err("sandbox: only `docker-credential-gcloud get` is simulated\n")
            return 1
        registry = call.read_stdin().decode().strip()
        call.out(json.dumps({"ServerURL": registry, "Username": "_dcgcloud_token", "Secret": "ya29.sandbox"}))
        return 0

    def docker_pull(self, call: ToolCall, image: str, *, quiet_status: bool = False) -> int:
        """Fetch ``image`` into the daemon (its pull minutes on the time scale; none when present)."""
        host, path, ref = image_parts(image)
        config = self.docker_config(call.env)
        if self.missing_helper(call, config, host):
            return 1
        helpers = config.get("credHelpers") or {}
        auths = config.get("auths") or {}
        if not (isinstance(helpers, dict) and helpers.get(host)) and not (
            isinstance(auths, dict) and host in auths
        ):
            project, _, rest = path.partition("/")
            repository = rest.split("/", 1)[0]
            location = host.removesuffix("-docker.pkg.dev")
            call.err(
                f'Error response from daemon: Head "https://{host}/v2/{path}/manifests/{ref}": denied: '
                "Unauthenticated request. Unauthenticated requests do not have permission "
                '"artifactregistry.repositories.downloadArtifacts" on resource '
                f'"projects/{project}/locations/{location}/repositories/{repository}" (or it may not exist)\n'
            )
            return 1
        digest = digest_of(image)
        if digest is None:
            call.err(
                f"Error response from daemon: manifest for {image} not found: manifest unknown: "
                f'Failed to fetch "{ref}"\n'
            )
            return 1
        images = self.docker_images()
        if self.image_digest(image) == digest:
            call.out(
                f"{ref}: Pulling from {path}\nDigest: {digest}\nStatus: Image is up to date for {image}\n{image}\n"
            )
            return 0
        call.out(f"{ref}: Pulling from {path}\n")
        if not self.wait_minutes(call, self.stage_minutes(PULL)):
            return 137
        for layer in range(6):
            call.out(f"{digest[7 + layer * 2 : 19 + layer * 2]}: Pull complete\n")
        images[image] = digest
        self.docker_state_file.write_text(json.dumps({"images": images}))
        call.out(f"Digest: {digest}\nStatus: Downloaded newer image for {image}\n{image}\n")
        return 0

    def docker_run(self, call: ToolCall, args: list[str]) -> int:
        """``docker run [OPTIONS] IMAGE COMMAND...`` in a :class:`ContainerHost` (removed after with
        ``--rm``): env from ``-e`` only (``-e NAME`` copies the client's value when it has one)."""
        switches: set[str] = set()
        values: dict[str, list[str]] = {}
        rest = list(args)
        while rest and rest[0].startswith("-"):
            flag = rest.pop(0)
            name, has_value, value = flag.partition("=")
            if name in DOCKER_RUN_SWITCHES and not has_value:
                switches.add(name)
                continue
            if name in DOCKER_RUN_VALUES:
                if not has_value:
                    if not rest:
                        call.err(f"flag needs an argument: {name}\nSee 'docker run --help'.\n")
                        return 125
                    value = rest.pop(0)
                values.setdefault(name.lstrip("-"), []).append(value)
                continue
            call.err(f"unknown flag: {name}\nSee 'docker run --help'.\n")
            return 125
        if not rest:
            call.err("\"docker run\" requires at least 1 argument.\nSee 'docker run --help'.\n")
            return 125
        image, command = rest[0], rest[1:]
        if self.image_digest(image) is None:
            call.err(f"Unable to find image '{image}' locally\n")
            code = self.docker_pull(call, image)
            if code != 0:
                return 125
        if not command:
            call.err("sandbox: the image's default command is not simulated; give one\n")
            return 125
        labels: dict[str, str] = {}
        for item in values.get("l", []) + values.get("label", []):
            key, _, value = item.partition("=")  # docker run -l KEY: an empty value
            if not key.strip():
                call.err(
                    f'invalid argument "{item}" for "-l, --label" flag: invalid label \'{item}\': empty name\n'
                )
                return 125
            labels[key] = value
        env_flags = values.get("e", []) + values.get("env", [])
        env: dict[str, str] = {}
        for item in env_flags:
            key, has_value, value = item.partition("=")
            if has_value:
                env[key] = value
            elif key in call.env:  # docker's opts.ValidateEnv: the client's own value, if it has one
                env[key] = call.env[key]
        name = (values.get("name") or [f"sandbox-{abs(hash((image, time.time()))) % 10**12:012d}"])[-1]
        existing = dockerd.containers(self.fs.root).get(name)
        if existing is not None:
            call.err(
                f'docker: Error response from daemon: Conflict. The container name "/{name}" is already in '
                f'use by container "{existing["id"]}". You have to remove (or rename) that container to be '
                "able to reuse that name.\nSee 'docker run --help'.\n"
            )
            return 125
        chips = self.tpu_chips() if "--privileged" in switches else 0
        workdir = (values.get("w") or values.get("workdir") or [""])[-1]
        if self.layout_root is None:
            call.err("sandbox: this VM's docker daemon knows no sandbox folder\n")
            return 125
        record = dockerd.start(
            self.fs.root,
            name,
            {
                "image": image,
                "command": command,
                "rm": "--rm" in switches,
                "labels": labels,
                "chips": chips,
                "workdir": workdir,
                "hostname": self.hostname,
                "layout": str(self.layout_root),
                "vm": [self.vm_project, self.zone, self.hostname],
                "caller_env": dict(self.caller_env),  # the sandbox's knobs: pace, hold file, faults
            },
            env,
        )
        return self.follow_container(call, record)

    def follow_container(self, call: ToolCall, record: dict[str, Any]) -> int:
        """The attached client: the container's output relayed until it exits (its exit status), or
        until the client itself goes (the session closed): then the container runs on."""
        import codecs

        streams = [
            (Path(record["out"]), call.out, codecs.getincrementaldecoder("utf-8")("replace")),
            (Path(record["err"]), call.err, codecs.getincrementaldecoder("utf-8")("replace")),
        ]
        offsets = [0, 0]
        exit_file = Path(record["exit_file"])
        while True:
            ended = exit_file.is_file()
            for index, (path, write, decoder) in enumerate(streams):
                with contextlib.suppress(OSError), path.open("rb") as handle:
                    handle.seek(offsets[index])
                    data = handle.read()
                    offsets[index] += len(data)
                    text = decoder.decode(data)
                    if text:
                        write(text)
            if ended:
                try:
                    outcome = json.loads(exit_file.read_text())
                except ValueError:
                    continue
                self.preempted = self.preempted or bool(outcome.get("preempted"))
                if record["rm"]:  # removed by the daemon once its exit status was read
                    dockerd.forget(record)
                return int(outcome["exit"])
            current = dockerd.containers(self.fs.root).get(record["name"]) or record
            if not dockerd.running(current) and not exit_file.is_file():
                return 137  # killed (docker rm --force, the VM's end)
            if call.cancelled():
                return 137  # the client is gone; the container is the daemon's and runs on
            time.sleep(0.05)

    def configure_docker(self, call: ToolCall) -> int:
        """``gcloud auth configure-docker [REGISTRIES] [--quiet]``: gcloud's credential helper for
        each registry in the caller's Docker config (root's under sudo)."""
        positionals = [a for a in call.argv[3:] if not a.startswith("-")]
        unknown = [a for a in call.argv[3:] if a.startswith("-") and a not in ("--quiet", "-q")]
        if unknown or len(positionals) > 1:
            bad = unknown[0] if unknown else positionals[1]
            call.err(f"ERROR: (gcloud.auth.configure-docker) unrecognized arguments: {bad}\n")
            return 2
        raw = (
            positionals[0]
            if positionals
            else "gcr.io,us.gcr.io,eu.gcr.io,asia.gcr.io,staging-k8s.gcr.io,marketplace.gcr.io"
        )
        registries = [r.strip() for r in raw.split(",") if r.strip()]
        if "docker-credential-gcloud" not in self.tools:  # surface/auth/configure_docker.py Run
            call.err(
                "WARNING: `docker-credential-gcloud` not in system PATH.\ngcloud's Docker credential helper "
                "can be configured but it will not work until this is corrected.\n"
            )
        directory = call.env.get("DOCKER_CONFIG") or f"{call.env.get('HOME', self.home)}/.docker"
        config = self.docker_config(call.env)
        helpers = config.setdefault("credHelpers", {})
        assert isinstance(helpers, dict)
        missing = [r for r in registries if helpers.get(r) != "gcloud"]
        if not missing:
            call.err("gcloud credential helpers already registered correctly.\n")
            return 0
        call.err("Adding credentials for: " + ",".join(missing) + "\n")
        for registry in missing:
            helpers[registry] = "gcloud"
        try:
            self.fs.write(f"{directory}/config.json", json.dumps(config, indent=2).encode())
        except StorageError as error:
            call.err(f"ERROR: (gcloud.auth.configure-docker) {error}\n")
            return 1
        call.err("Docker configuration file updated.\n")
        return 0

    def tool_gcloud(self, call: ToolCall) -> int:
        if call.argv[1:3] == ["auth", "configure-docker"]:
            return self.configure_docker(call)
        return super().tool_gcloud(call)

    # -- google cloud ---------------------------------------------------------------------
    def project(self) -> str:
        return self.vm_project

    def can_write_gcs(self) -> bool:
        return bool(STORAGE_WRITE_SCOPES & set(self.scopes))

    def gcs_for_gcloud(self) -> GcsStore:
        """The VM's gcloud acts as the VM's service account (the one ``describe`` reports)."""
        services = self.services
        if services.authorize is None or services.bucket_project is None:
            return GcsStore(
                services.gcs.api,
                identity=self.identity(),
                can_write=lambda bucket: self.can_write_gcs(),
                denied_detail=SCOPE_DENIED,
            )
        return IamGcsStore(
            services.gcs.api, self.identity(), self.scopes, services.authorize, services.bucket_project
        )

    def secret_access(self, project: str, secret: str, version: str) -> tuple[str | None, str]:
        """Secret Manager as the VM's account: the cloud-platform scope, then
        ``secretmanager.versions.access`` on the secret or its project (Secret Manager's 403)."""
        if "cloud-platform" not in self.scopes:
            return None, "PERMISSION_DENIED: Request had insufficient authentication scopes."
        authorize = self.services.authorize
        if authorize is not None and not authorize(
            "secretmanager.versions.access", [f"projects/{project}/secrets/{secret}", f"projects/{project}"]
        ):
            return None, secret_values.SECRET_ACCESS_DENIED.format(
                project=project, secret=secret, version=version
            )
        return self.services.secret_access(project, secret, version)


def tpu_chips_of(machine_type: str) -> int:
    """TPU chips of a Compute Engine machine type: ``ct6e-standard-{1,4,8}t`` → 1, 4, 8; others 0."""
    match = re.fullmatch(r"ct6e-standard-([148])t", machine_type)
    return int(match.group(1)) if match else 0


def activate_script(venv: str, prompt: str) -> str:
    """``bin/activate`` of a uv venv (virtualenv's bash activation template, trimmed of the
    prompt handling); it must be sourced, and it puts ``$VIRTUAL_ENV/bin`` first on PATH."""
    return f"""# This file must be used with "source bin/activate" *from bash*
# you cannot run it directly

if [ "${{BASH_SOURCE-}}" = "$0" ]; then
    echo "You must source this script: \\$ source $0" >&2
    exit 33
fi

deactivate () {{
    unset -f pydoc >/dev/null 2>&1 || true
    if ! [ -z "${{_OLD_VIRTUAL_PATH:+_}}" ] ; then
        PATH="$_OLD_VIRTUAL_PATH"
        export PATH
        unset _OLD_VIRTUAL_PATH
    fi
    if ! [ -z "${{_OLD_VIRTUAL_PYTHONHOME+_}}" ] ; then
        PYTHONHOME="$_OLD_VIRTUAL_PYTHONHOME"
        export PYTHONHOME
        unset _OLD_VIRTUAL_PYTHONHOME
    fi
    hash -r 2>/dev/null
    unset VIRTUAL_ENV
    unset VIRTUAL_ENV_PROMPT
    if [ ! "${{1-}}" = "nondestructive" ] ; then
        unset -f deactivate
    fi
}}

deactivate nondestructive

VIRTUAL_ENV={shlex.quote(venv)}
export VIRTUAL_ENV

_OLD_VIRTUAL_PATH="$PATH"
PATH="$VIRTUAL_ENV/bin:$PATH"
export PATH

VIRTUAL_ENV_PROMPT={shlex.quote(prompt)}
export VIRTUAL_ENV_PROMPT

if ! [ -z "${{PYTHONHOME+_}}" ] ; then
    _OLD_VIRTUAL_PYTHONHOME="$PYTHONHOME"
    unset PYTHONHOME
fi

hash -r 2>/dev/null || true
"""


__all__ = ["TOOLS_DIR", "IamGcsStore", "MachineHost", "MachineServices", "MachineStore", "PodHost", "VmHost"]


def _inspect_arguments(call: ToolCall, args: list[str], command: str) -> tuple[str | None, list[str]] | None:
    """``--format``/``-f`` and the names of a ``docker [image] inspect``; None (the CLI's "unknown
    flag" line written) for any other flag."""
    form, names = None, []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg in ("-f", "--format"):
            form = rest.pop(0) if rest else None
        elif arg.startswith("--format="):
            form = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            call.err(f"unknown flag: {arg}\nSee '{command} --help'.\n")
            return None
        else:
            names.append(arg)
    return form, names
