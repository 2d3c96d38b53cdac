"""The Docker daemon of a sandbox VM: its containers outlive the ``docker run`` that started them.

``docker run`` asks dockerd to create and start a container and then attaches to its output; the
container is the daemon's, not the client's. When the client goes (its SSH session closed because
the worker that ran it died), the container keeps running: moby's client only forwards the signals
it receives itself (``--sig-proxy``, cli/command/container/run.go ``ForwardAllSignals``), a killed
client forwards none, and the end of the attach stream does not stop a container. Only ``docker rm
--force`` (or ``stop``/``kill``), the daemon's end or the machine's end stops it.

Here each container is a detached process (``python -m tpu_rl_sandbox.machines.container_worker``) in
its own session that runs the program on a :class:`~tpu_rl_sandbox.machines.hosts.ContainerHost` with the
VM's services (:mod:`~tpu_rl_sandbox.machines.vm_services`); the client follows its output files and waits for its
exit. The daemon's containers are recorded in the VM's root (:data:`CONTAINERS_FILE`, under a lock);
``docker inspect`` and ``docker rm`` read and change them; deleting, stopping or preempting the VM
ends them (:func:`stop_all`).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import tpu_rl_sandbox

CONTAINERS_FILE = ".sandbox-dockerd-containers.json"
DAEMON_DIR = ".sandbox-dockerd"
STOP_SECONDS = 10.0  # docker rm --force: SIGKILL at once; the wait for the process to be gone
# The ``--format`` of ``docker inspect`` the provider's writer probe asks (records/writers.py).
INSPECT_FORMAT = "{{.State.Running}} {{json .Config.Cmd}}"
# The template actions of ``docker inspect --format`` the sandbox plays, on a container's
# ``ContainerJSON`` (docs.docker.com/reference/cli/docker/inspect/ "Format the output using the
# given Go template"; Go's text/template: ``index`` of a map's missing key is its zero value, "").
_ACTION = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_LABEL_ACTION = re.compile(r'^index \.Config\.Labels "([^"\\]*)"$')


def _containers_path(root: Path) -> Path:
    return root / CONTAINERS_FILE


@contextlib.contextmanager
def locked(root: Path) -> Iterator[dict[str, dict[str, Any]]]:
    """The daemon's containers (name -> record), read and written back under the daemon's lock."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".sandbox-dockerd.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = _containers_path(root)
        try:
            containers = json.loads(path.read_text()) if path.is_file() else {}
        except ValueError:
            containers = {}
        before = json.dumps(containers, sort_keys=True)
        yield containers
        if json.dumps(containers, sort_keys=True) != before:
            path.write_text(json.dumps(containers, sort_keys=True))


def containers(root: Path) -> dict[str, dict[str, Any]]:
    """The daemon's containers, by name (a copy)."""
    with locked(root) as found:
        return {name: dict(record) for name, record in found.items()}


def _alive(pid: int) -> bool:
    """The process runs (a zombie, ended but not reaped, does not)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


CONTAINER_MODULE = "tpu_rl_sandbox.machines.container_worker"


def _is_container_process(pid: int, record: Mapping[str, Any]) -> bool:
    """Whether ``pid`` is still this container's process (its argv names the worker module and the
    container's id), not one that took the pid after it ended: pids are reused, and a removed
    container's stale pid must never signal another process (two suites share one machine)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return CONTAINER_MODULE.encode() in argv and f"--container={record.get('id')}".encode() in argv


def running(record: Mapping[str, Any]) -> bool:
    """The container's process still runs."""
    pid = int(record.get("pid") or 0)
    return record.get("exit") is None and _alive(pid) and _is_container_process(pid, record)


def started_at(record: Mapping[str, Any]) -> str:
    """``.State.StartedAt`` as moby gives it: RFC 3339 in UTC with nanoseconds."""
    when = datetime.datetime.fromtimestamp(float(record["started"]), datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def inspect_values(record: Mapping[str, Any]) -> dict[str, str]:
    """What each template action the sandbox plays gives for ``record``."""
    alive = running(record)
    return {
        ".Id": str(record["id"]),
        ".State.Running": "true" if alive else "false",
        ".State.Status": "running" if alive else "exited",
        ".State.StartedAt": started_at(record),
        "json .Config.Cmd": json.dumps(record["cmd"], separators=(",", ":")),
    }


def render_inspect(form: str, record: Mapping[str, Any]) -> str | None:
    """``form`` (a ``docker inspect --format`` template) for ``record``; None when it uses an
    action the sandbox does not play."""
    values = inspect_values(record)
    labels = record.get("labels") or {}
    out, at = [], 0
    for match in _ACTION.finditer(form):
        out.append(form[at : match.start()])
        action = match[1]
        label = _LABEL_ACTION.match(action)
        if label is not None:
            out.append(str(labels.get(label[1], "")))
        elif action in values:
            out.append(values[action])
        else:
            return None
        at = match.end()
    out.append(form[at:])
    return "".join(out)


def start(root: Path, name: str, spec: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Create and start container ``name`` from ``spec`` (what :func:`main` runs; its ``env``
    holds the container's environment, handed over on a pipe, never written to disk); its record."""
    container_id = uuid.uuid4().hex + uuid.uuid4().hex
    base = root / DAEMON_DIR  # the daemon's own files (its /var/lib/docker): logs, exit statuses
    base.mkdir(parents=True, exist_ok=True)
    record = {
        "id": container_id,
        "name": name,
        "image": spec["image"],
        "cmd": list(spec["command"]),
        "labels": dict(spec.get("labels") or {}),
        "rm": bool(spec["rm"]),
        "out": str(base / f"{name}-{container_id[:12]}.out"),
        "err": str(base / f"{name}-{container_id[:12]}.err"),
        "exit_file": str(base / f"{name}-{container_id[:12]}.exit"),
        "started": time.time(),
        "exit": None,
        "pid": 0,
    }
    for key in ("out", "err"):
        Path(record[key]).write_bytes(b"")
    package_parent = str(Path(tpu_rl_sandbox.__file__).resolve().parents[1])
    child_env = {
        **{k: v for k, v in os.environ.items() if k != "HF_TOKEN"},
        "PYTHONPATH": package_parent
        + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
    }
    # The container is the daemon's child, not the client's: a launcher starts it and exits, so
    # nothing that stops the client's process tree (its SSH session, the worker running it) reaches it.
    with open(record["err"], "ab") as worker_err:
        launcher = subprocess.run(
            [sys.executable, "-m", "tpu_rl_sandbox.machines.dockerd", "--launch", record["err"]],
            input=json.dumps({**spec, "env": dict(env), "record": record, "root": str(root)}).encode(),
            stdout=subprocess.PIPE,
            stderr=worker_err,
            env=child_env,
            cwd="/",
            check=True,
            timeout=60,
        )
    record["pid"] = int(launcher.stdout.decode().strip())
    with locked(root) as found:
        found[name] = record
    return record


def launch(err_path: str) -> int:
    """The launcher: start the container's process in its own session, print its pid, exit."""
    spec = sys.stdin.buffer.read()
    container_id = json.loads(spec)["record"]["id"]
    with open(err_path, "ab") as worker_err:
        process = subprocess.Popen(
            # the id on argv: what tells this container's process from a later one of its pid
            [sys.executable, "-m", CONTAINER_MODULE, f"--container={container_id}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=worker_err,
            start_new_session=True,
            cwd="/",
        )
    assert process.stdin is not None
    with process.stdin:
        process.stdin.write(spec)
    sys.stdout.write(f"{process.pid}\n")
    return 0


def stop(root: Path, name: str) -> bool:
    """``docker rm --force``: kill the container's processes, wait until they are gone, remove it.
    False when no such container."""
    with locked(root) as found:
        record = found.get(name)
    if record is None:
        return False
    pid = int(record.get("pid") or 0)
    if pid and _is_container_process(pid, record):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_SECONDS
        while running({**record, "exit": None}) and time.monotonic() < deadline:
            time.sleep(0.02)
    with locked(root) as found:
        if (found.get(name) or {}).get("id") == record["id"]:
            del found[name]
    shutil.rmtree(root / ".containers" / name, ignore_errors=True)
    forget(record)
    return True


def forget(record: Mapping[str, Any]) -> None:
    """The daemon's files of a removed container: its output. Its exit status stays for the
    clients already waiting on it (moby gives it to every ``docker wait`` asked before the container
    stopped, removed or not); a later one finds no container by its name."""
    for key in ("out", "err"):
        Path(record[key]).unlink(missing_ok=True)


def stop_all(root: Path) -> None:
    """The machine goes (deleted, stopped, preempted): every container of its daemon ends."""
    if not _containers_path(root).is_file():
        return
    for name in containers(root):
        stop(root, name)


if __name__ == "__main__":
    sys.exit(launch(sys.argv[2]) if sys.argv[1:2] == ["--launch"] else 2)
