"""Run a rendered script with the real ``/bin/bash`` on a fake machine (a GKE pod or a TPU VM).

How one run goes (:meth:`Machine.run`):

* The supervisor (the job worker for a pod, the fake ``gcloud compute ssh`` for a VM) listens on
  an abstract Unix socket: the *tool server*.
* It starts ``setpriv --pdeathsig KILL unshare --mount --uts --ipc --pid --fork --kill-child
  --propagation private python -m tpu_rl_sandbox.machines.machine FD`` in a new session. Inside the new
  namespaces, :func:`enter` (PID 1) mounts a tmpfs as the machine's root: the host's ``/usr``,
  ``/etc`` (and ``/bin``, ``/lib``... links) read-only, a fresh ``/proc``, a few device nodes,
  and every directory of :attr:`MachineSpec.mounts` (``/dev/shm``, ``/sys/fs/cgroup``,
  ``/home``, ``/root``, ``/tmp``, ``/usr/local``, ``/deps``...) bound from the machine's own
  host folder. The fake tools go to ``/run/tpu-rl-sandbox/bin`` (first on ``PATH``), the tmpfs
  is made read-only, the hostname set, and it ``chroot``-s and ``exec``-s ``/bin/bash``.
* The fake tools are tiny stdlib scripts (:func:`shim_text`) run by the host's ``/usr/bin/python3``
  inside the machine. ``sudo`` and ``python3 -c`` / ``python3 FILE`` run locally, for real;
  everything else (``gcloud``, ``apt-get``, ``curl``, ``uv``, ``pip``, ``python3 -m ...``) sends
  its argv, environment, working directory and its stdin/stdout/stderr descriptors
  (``SCM_RIGHTS``) to the tool server, which runs the tool in the supervisor
  (:mod:`tpu_rl_sandbox.machines.hosts`) on those very descriptors and answers with the exit status.
* Nothing is mounted in the host's namespace (private propagation). Killing the ``unshare``
  process group kills PID 1 of the machine's PID namespace and with it every process the script
  started; the supervisor does that on timeout (``TPU_RL_SANDBOX_MACHINE_TIMEOUT``, seconds),
  on cancellation, and if it dies itself (``--pdeathsig``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUN_DIR = "/run/tpu-rl-sandbox"
TOOLS_DIR = f"{RUN_DIR}/bin"
ADDRESS_FILE = f"{RUN_DIR}/tools"
PYTHONPATH_FILE = f"{RUN_DIR}/pythonpath"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MACHINE_PATH = f"{TOOLS_DIR}:{SYSTEM_PATH}"
TIMEOUT_ENV = "TPU_RL_SANDBOX_MACHINE_TIMEOUT"
DEFAULT_TIMEOUT = 3600.0
STAGING = ".rootfs"  # empty folder in the machine folder; the root tmpfs is mounted on it (private)
HOST_READ_ONLY = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEVICE_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1"}
DEVICE_LINKS["stderr"] = "/proc/self/fd/2"

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18

Write = Callable[[str], None]


# ====================================================================================== shims
_SHIM = r'''#!/usr/bin/python3 -I
"""tpu-rl-sandbox fake `{tool}`: runs in the machine; see tpu_rl_sandbox.machines.machine / .hosts."""
import json, os, socket, struct, sys

TOOL = {tool!r}
RUN_DIR = {run_dir!r}
SECURE_PATH = {secure_path!r}


def remote(argv):
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open("/dev/null", os.O_RDWR))
    with open(RUN_DIR + "/tools") as handle:
        address = handle.read().strip()
    body = json.dumps(
        {{"tool": TOOL, "path": os.path.abspath(sys.argv[0]), "argv": argv,
         "env": dict(os.environ), "cwd": os.getcwd()}}
    ).encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect("\0" + address)
    socket.send_fds(sock, [struct.pack("!I", len(body))], fds)
    sock.sendall(body)
    reply = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        reply += chunk
    if not reply:
        sys.stderr.write(argv[0] + ": the sandbox tool server went away\n")
        return 255
    return int(json.loads(reply)["exit"])


def python(argv):
    """Real CPython for `-c CODE`, `FILE` and stdin; `-m MODULE` is simulated by the server."""
    args = argv[1:]
    options = []
    while args and args[0].startswith("-") and args[0] not in ("-", "-c", "-m") and len(args[0]) == 2:
        options.append(args.pop(0))
    if args and args[0] == "-m":
        return remote(argv)
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    venv = os.path.dirname(here)
    if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        path = os.path.join(venv, "lib", "python3.12", "site-packages")
    else:
        with open(RUN_DIR + "/pythonpath") as handle:
            path = handle.read().strip()
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = path + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    os.execve("/usr/bin/python3", ["python3", "-S", *options, *args], env)


def sudo(argv):
    """sudo(8) as an ALL=(ALL) NOPASSWD user with Ubuntu's sudoers (env_reset, secure_path)."""
    args = argv[1:]
    preserved = []
    while args and args[0].startswith("-") and args[0] != "--":
        option = args.pop(0)
        if option in ("-n", "-E", "-H", "-S", "--non-interactive", "--preserve-env", "--set-home"):
            continue
        if option.startswith("--preserve-env="):
            # sudo(8): these variables are kept from the user's environment (env_reset drops the
            # rest); the guest's sudoers entries match ALL, which implies SETENV (sudoers(5))
            preserved += [name for name in option.split("=", 1)[1].split(",") if name]
            continue
        if option in ("-u", "--user") and args:
            if args.pop(0) not in ("root", "#0"):
                sys.stderr.write("sudo: the sandbox VM has only root and the login user\n")
                return 1
            continue
        sys.stderr.write(
            "sudo: invalid option -- '" + option.lstrip("-")[:1] + "'\n"
            "usage: sudo -h | -K | -k | -V\nusage: sudo [-AbEHknPS] [-u user] [VAR=value] [-i|-s] [<command>]\n"
        )
        return 1
    if args[:1] == ["--"]:
        args = args[1:]
    assignments = {{}}
    while args and "=" in args[0] and args[0].split("=", 1)[0].isidentifier():
        name, value = args.pop(0).split("=", 1)
        assignments[name] = value
    if not args:
        sys.stderr.write("usage: sudo -h | -K | -k | -V\n")
        return 1
    command = args[0]
    found = command if "/" in command else None
    for directory in ([] if found else SECURE_PATH.split(":")):
        candidate = os.path.join(directory, command)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            found = candidate
            break
    if found is None or not os.path.exists(found):
        sys.stderr.write("sudo: " + command + ": command not found\n")
        return 1
    user = os.environ.get("USER", "root")
    env = {{k: v for k, v in os.environ.items() if k in ("TERM", "LANG", "LANGUAGE", "LC_ALL", "DISPLAY", "COLORS")}}
    env.update(
        PATH=SECURE_PATH, HOME="/root", USER="root", LOGNAME="root", SHELL="/bin/bash", MAIL="/var/mail/root",
        SUDO_USER=user, SUDO_UID="1000", SUDO_GID="1000", SUDO_COMMAND=" ".join([found, *args[1:]]),
    )
    env.update({{name: os.environ[name] for name in preserved if name in os.environ}})
    env.update(assignments)
    os.execve(found, [command, *args[1:]], env)


def main():
    argv = [os.path.basename(sys.argv[0]), *sys.argv[1:]]
    if TOOL == "python":
        return python(argv)
    if TOOL == "sudo":
        return sudo(argv)
    return remote(argv)


if __name__ == "__main__":
    sys.exit(main())
'''


def shim_text(tool: str) -> str:
    """The executable a fake tool is on the machine (``tool`` = the kind the server dispatches on)."""
    return _SHIM.format(tool=tool, run_dir=RUN_DIR, secure_path=f"{TOOLS_DIR}:{SYSTEM_PATH}:/snap/bin")


# ===================================================================================== spec
@dataclass
class MachineSpec:
    """One run of one program on a machine whose files live in ``root`` (a host folder)."""

    root: Path
    hostname: str
    mounts: tuple[str, ...]  # machine directories backed by ``root/<dir>`` (read-write)
    tools: dict[str, str]  # file name in TOOLS_DIR -> tool kind (see hosts.MachineHost.run_tool)
    python_path: str  # sys.path entries of the machine's python3 (besides the standard library)
    env: dict[str, str]
    cwd: str
    argv: list[str]
    timeout: float = field(default_factory=lambda: machine_timeout())
    # host files the machine must not have (its /usr is the host's): each covered by /dev/null,
    # which no PATH lookup takes for a program (not a regular file)
    hidden: tuple[str, ...] = ()
    # the machine's own device paths under /dev (a TPU VM's /dev/vfio/*): files a script can find;
    # nothing opens them (the simulated programs take the chips from the host, not from /dev)
    devices: tuple[str, ...] = ()

    def config(self, address: str) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "hostname": self.hostname,
            "mounts": list(self.mounts),
            "tools": dict(self.tools),
            "python_path": self.python_path,
            "env": self.env,
            "cwd": self.cwd,
            "argv": self.argv,
            "address": address,
            "hidden": list(self.hidden),
            "devices": list(self.devices),
        }


def machine_timeout(env: dict[str, str] | None = None) -> float:
    raw = (env if env is not None else os.environ).get(TIMEOUT_ENV, "")
    try:
        return float(raw) if raw else DEFAULT_TIMEOUT
    except ValueError:
        return DEFAULT_TIMEOUT


# ================================================================================ tool calls
@dataclass
class ToolCall:
    """One fake-tool process on the machine, as the tool server sees it."""

    tool: str
    path: str  # the shim's path inside the machine (e.g. /home/u/venv/bin/python3)
    argv: list[str]
    env: dict[str, str]
    cwd: str
    stdin: int
    stdout: int
    stderr: int
    cancelled: Callable[[], bool] = lambda: False
    data: str = ""  # an answer for in-machine library stubs (e.g. the HTTP body)

    @staticmethod
    def _write(fd: int, text: str) -> None:
        data = text.encode("utf-8", "replace")
        while data:
            try:
                written = os.write(fd, data)
            except BrokenPipeError:
                return
            data = data[written:]

    def out(self, text: str) -> None:
        self._write(self.stdout, text)

    def err(self, text: str) -> None:
        self._write(self.stderr, text)

    def read_stdin(self) -> bytes:
        chunks: list[bytes] = []
        while True:
            chunk = os.read(self.stdin, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    def absolute(self, path: str) -> str:
        """``path`` made absolute against the caller's working directory (no ``~`` expansion)."""
        import posixpath

        return posixpath.normpath(posixpath.join(self.cwd, path))


ToolHandler = Callable[[ToolCall], int]


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("short read")
        data += chunk
    return data


def _peer_gone(conn: socket.socket) -> bool:
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (OSError, ValueError):
        return True


class ToolServer:
    """Accepts fake-tool calls from one machine and runs them with ``handler``."""

    def __init__(self, handler: ToolHandler, cancelled: Callable[[], bool]) -> None:
        self.handler = handler
        self.cancelled = cancelled
        self.address = f"tpu-rl-sandbox/{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind("\0" + self.address)
        self.sock.listen(64)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, name="tool-server", daemon=True)

    def start(self) -> None:
        self._accept.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                readable, _, _ = select.select([self.sock], [], [], 0.1)
            except (OSError, ValueError):
                return
            if not readable:
                continue
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._handle, args=(conn,), name="tool-call", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _handle(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            header, ancillary, _, _ = conn.recvmsg(
                4, socket.CMSG_LEN(3 * struct.calcsize("i")), socket.MSG_CMSG_CLOEXEC
            )
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(payload) - len(payload) % struct.calcsize("i")
                    fds += list(struct.unpack(f"{usable // 4}i", payload[:usable]))
            if len(header) != 4 or len(fds) != 3:
                return
            request = json.loads(_recv_exact(conn, struct.unpack("!I", header)[0]))
            call = ToolCall(
                tool=str(request["tool"]),
                path=str(request["path"]),
                argv=[str(a) for a in request["argv"]],
                env={str(k): str(v) for k, v in request["env"].items()},
                cwd=str(request["cwd"]),
                stdin=fds[0],
                stdout=fds[1],
                stderr=fds[2],
                cancelled=lambda: self.cancelled() or self._stop.is_set() or _peer_gone(conn),
            )
            try:
                code = self.handler(call)
            except Exception:
                call.err(f"sandbox: {call.argv[0]} crashed:\n{traceback.format_exc()}")
                code = 70
            for fd in fds:  # close before answering: a reader of our stdout must see EOF
                os.close(fd)
            fds = []
            conn.sendall(json.dumps({"exit": code, "data": call.data}).encode())
        except (OSError, ValueError, KeyError, ConnectionError):
            pass
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self.sock.close()
        self._accept.join(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)


# =================================================================================== running
class Machine:
    """Runs :class:`MachineSpec` programs; the caller supplies the tool handler."""

    def __init__(self, spec: MachineSpec, handler: ToolHandler, cancelled: Callable[[], bool]) -> None:
        self.spec = spec
        self.handler = handler
        self.cancelled = cancelled
        self.timed_out = False
        self.was_cancelled = False

    def run(self, stdin: bytes | None, stdout: int | Write, stderr: int | Write) -> int:
        """Exit status of the program (``128 + 9`` when it was killed)."""
        spec = self.spec
        (spec.root / STAGING).mkdir(parents=True, exist_ok=True)
        for directory in spec.mounts:
            (spec.root / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
        server = ToolServer(self.handler, self.cancelled)
        config_read, config_write = os.pipe()
        readers: list[threading.Thread] = []
        out_fd, out_pipe = self._output(stdout, readers)
        err_fd, err_pipe = self._output(stderr, readers)
        command = [
            "setpriv",
            "--pdeathsig",
            "KILL",
            "unshare",
            "--mount",
            "--uts",
            "--ipc",
            "--pid",
            "--fork",
            "--kill-child",
            "--propagation",
            "private",
            sys.executable,
            "-I",
            "-m",
            "tpu_rl_sandbox.machines.machine",
            str(config_read),
        ]
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=out_fd,
                stderr=err_fd,
                pass_fds=(config_read,),
                start_new_session=True,
                env={"PATH": SYSTEM_PATH},
                cwd="/",
            )
        finally:
            os.close(config_read)
            for fd, pipe in ((out_fd, out_pipe), (err_fd, err_pipe)):
                if pipe is not None:
                    os.close(fd)
        server.start()
        for thread in readers:
            thread.start()
        feeders = [
            threading.Thread(
                target=self._feed, args=(config_write, json.dumps(spec.config(server.address)).encode())
            )
        ]
        if stdin is not None and process.stdin is not None:
            feeders.append(threading.Thread(target=self._feed, args=(process.stdin.fileno(), stdin)))
        for feeder in feeders:
            feeder.daemon = True
            feeder.start()
        deadline = time.monotonic() + spec.timeout
        try:
            while process.poll() is None:
                if self.cancelled():
                    self.was_cancelled = True
                    break
                if time.monotonic() > deadline:
                    self.timed_out = True
                    break
                time.sleep(0.05)
        finally:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
            server.stop()
            for thread in readers + feeders:
                thread.join(timeout=5)
            if process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.close()
        if self.timed_out:
            message = f"sandbox: {spec.hostname}: killed after {spec.timeout:g}s ({TIMEOUT_ENV})\n"
            if callable(stderr):
                stderr(message)
            else:
                os.write(stderr, message.encode())
        return 128 + signal.SIGKILL if code < 0 else code

    @staticmethod
    def _feed(fd: int, data: bytes) -> None:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    @staticmethod
    def _output(target: int | Write, readers: list[threading.Thread]) -> tuple[int, int | None]:
        if not callable(target):
            return target, None
        read_fd, write_fd = os.pipe()

        def pump() -> None:
            import codecs

            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            with os.fdopen(read_fd, "rb", buffering=0) as handle:
                while True:
                    chunk = handle.read(65536)
                    if not chunk:
                        break
                    text = decoder.decode(chunk)
                    if text:
                        target(text)
            tail = decoder.decode(b"", final=True)
            if tail:
                target(tail)

        readers.append(threading.Thread(target=pump, daemon=True))
        return write_fd, write_fd


# ============================================================== inside the namespace (PID 1)
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = _libc.mount(
        source.encode() if source else None,
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def _bind(source: str, target: str, *, read_only: bool) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def enter(config: dict[str, Any]) -> None:
    """Build the machine's root and ``exec`` its program. Runs as PID 1 of fresh namespaces."""
    root = Path(config["root"])
    new_root = str(root / STAGING)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=16m")
    for name in HOST_READ_ONLY:
        host = f"/{name}"
        if os.path.islink(host):
            os.symlink(os.readlink(host), new_root + host)
        elif os.path.isdir(host):
            os.mkdir(new_root + host)
            _bind(host, new_root + host, read_only=True)
    os.mkdir(new_root + "/proc")
    _mount("proc", new_root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.mkdir(new_root + "/dev")
    for device in DEVICES:
        if os.path.exists(f"/dev/{device}"):
            Path(new_root, "dev", device).touch()
            _bind(f"/dev/{device}", f"{new_root}/dev/{device}", read_only=False)
    for name, target in DEVICE_LINKS.items():
        os.symlink(target, f"{new_root}/dev/{name}")
    for device in config.get("devices") or ():
        if not device.startswith("/dev/") or ".." in device.split("/"):
            raise ValueError(f"not a device path: {device}")
        os.makedirs(os.path.dirname(new_root + device), exist_ok=True)
        Path(new_root + device).touch()
    for hidden in config.get("hidden") or ():
        if os.path.lexists(new_root + hidden):
            _bind("/dev/null", new_root + hidden, read_only=True)
    for directory in sorted(config["mounts"], key=lambda p: p.count("/")):
        target = new_root + directory
        os.makedirs(target, exist_ok=True)
        _bind(str(root / directory.lstrip("/")), target, read_only=False)
    tools = new_root + TOOLS_DIR
    os.makedirs(tools)
    for name, kind in config["tools"].items():
        path = Path(tools, name)
        path.write_text(shim_text(kind))
        path.chmod(0o755)
    Path(new_root + ADDRESS_FILE).write_text(config["address"])
    Path(new_root + PYTHONPATH_FILE).write_text(config["python_path"])
    _mount(None, new_root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    hostname = config["hostname"].encode()
    if _libc.sethostname(hostname, len(hostname)) != 0:
        raise OSError(ctypes.get_errno(), "sethostname")
    os.chroot(new_root)
    os.chdir(config["cwd"])
    os.execve("/bin/bash", config["argv"], config["env"])  # noqa: S606 (argv from the supervisor)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or os.getpid() != 1:
        sys.stderr.write(
            "usage: (inside unshare --pid --fork) python -m tpu_rl_sandbox.machines.machine CONFIG_FD\n"
        )
        return 2
    with os.fdopen(int(args[0]), "rb") as handle:
        config = json.loads(handle.read())
    try:
        enter(config)
    except OSError as error:
        sys.stderr.write(f"sandbox: cannot start machine {config.get('hostname')}: {error}\n")
        return 125
    return 0  # not reached: enter() execs bash


if __name__ == "__main__":
    sys.exit(main())
