"""The call server: the fakes' modules imported once per sandbox, a fork per call.

The suite runs the fake ``gcloud`` and ``gcluster job`` thousands of times, and a new interpreter
importing their modules (and, for ``job submit``, google-auth for gcluster's credentials check) was
most of each call's CPU. ``tpu-rl-sandbox up`` starts this server (``python -m
tpu_rl_sandbox.clis.call_server --root ROOT``, recorded in ``<root>/call_server.json``); the
``<root>/bin/gcloud`` and ``gcluster`` shims run :mod:`tpu_rl_sandbox.clis.call_client`, which
sends the call here. For each call the server forks a child that takes the caller's stdin, stdout
and stderr (passed over the socket), environment, working folder and umask, and runs the same
``main`` the shim's ``python -m tpu_rl_sandbox.clis.gcloud`` (or ``...gcluster``) runs; its exit code (or the signal that ended it) goes
back to the client, which exits with it. The server itself never runs a command, so every call
starts from freshly imported modules, as a new interpreter would.

A caller that goes away (a timeout's kill) closes its socket: the server kills the call's child
with SIGKILL, as the kill would have ended the fake. Only the server's own user may call it (the
socket's peer credentials). With no server (stopped, or never started) the client runs the fake
itself, so the shims work either way.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import io
import json
import marshal
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tpu_rl_sandbox.apis.daemons import start_module, stop_pid
from tpu_rl_sandbox.apis.gcs_emulator import pid_alive
from tpu_rl_sandbox.world.layout import SandboxLayout

INFO_FILE = "call_server.json"
LOG_FILE = "call_server.log"
CLIENT = Path(__file__).with_name("call_client.py")
# The fakes the server runs: shim name -> (the module the client falls back to, the one with ``main``).
# The shims hand over only the calls whose processes all end with the call (shim_command): gcloud's
# but ``ssh``, and gcluster's ``job`` commands (not create/deploy/destroy, whose Terraform runs in a
# process group of its own that a caller's kill walks to through /proc).
SERVED = {
    "gcloud": ("tpu_rl_sandbox.clis.gcloud", "tpu_rl_sandbox.clis.gcloud.dispatch"),
    "gcluster": ("tpu_rl_sandbox.clis.gcluster", "tpu_rl_sandbox.clis.gcluster.app"),
}
REQUEST_TIMEOUT = 10.0  # a connected client sends its call at once; a silent one is dropped
ROOT_CHECK_SECONDS = 30.0  # the server ends once its sandbox folder is gone
_HEADER = 8


def socket_name(layout: SandboxLayout) -> str:
    """The abstract socket's name (no file, no path length limit): unique per sandbox folder."""
    return folder_socket_name("calls", layout.root)


def folder_socket_name(kind: str, folder: Path) -> str:
    """An abstract socket's name for a server of ``kind`` that belongs to ``folder``."""
    import hashlib

    return f"tpu-rl-sandbox-{kind}-" + hashlib.sha256(str(folder).encode()).hexdigest()[:24]


# ==================================================================================== server
# What a served call of each fake imports, the modules its handlers import when they run included
# (their HTTP client, YAML, temporary files; google-auth for gcluster's credentials check). The
# server imports a fake's set when the first call of that fake arrives, before it forks: a sandbox
# whose tests never run gcluster never pays for google-auth. Importing a module early changes
# nothing a call sees: ``random`` reseeds itself in a forked child, ``tempfile`` names its files
# anew there, and OpenSSL reseeds its generator in a new process.
_COMMON_IMPORTS = ("urllib.request", "tempfile", "random", "string", "encodings.idna", "yaml")
PRELOADS: dict[str, tuple[str, ...]] = {
    "gcloud": ("tpu_rl_sandbox.clis.gcloud.dispatch", "tpu_rl_sandbox.apis.gcs_emulator", *_COMMON_IMPORTS),
    "gcluster": (
        "tpu_rl_sandbox.clis.gcluster.app",
        "tpu_rl_sandbox.clis.gcluster.jobs",
        *_COMMON_IMPORTS,
        "google.auth",
        "google.auth.exceptions",
        "google.auth.transport.requests",
        "google.oauth2.service_account",
        "google.oauth2.credentials",
    ),
}
_preloaded: set[str] = set()


def _preload(tool: str) -> None:
    """Import what a served call of ``tool`` imports (once): for gcloud, every command group's module."""
    if tool in _preloaded:
        return
    for name in PRELOADS[tool]:
        __import__(name)
    if tool == "gcloud":
        from tpu_rl_sandbox.clis.gcloud import dispatch

        for module, _ in sorted(set(dispatch.HANDLER_MIXINS.values())):
            __import__(f"tpu_rl_sandbox.clis.gcloud.{module}")
    _preloaded.add(tool)
    gc.freeze()


@dataclass
class _Call:
    conn: socket.socket
    pid: int
    pidfd: int


Request = tuple[str, list[str], dict[str, str], str, int]  # tool, argv, environment, folder, umask


def _receive(conn: socket.socket, served: Mapping[str, str]) -> tuple[Request, list[int]]:
    conn.settimeout(REQUEST_TIMEOUT)
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    if len(data) < _HEADER or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise OSError("a malformed call")
    size = int.from_bytes(data[:_HEADER], "big")
    body = data[_HEADER:]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            for fd in fds:
                os.close(fd)
            raise OSError("the client went away mid-call")
        body += chunk
    conn.settimeout(None)
    tool, args, env, cwd, mask = marshal.loads(body)  # noqa: S302  (sent by the server's own user: _same_user)
    if tool not in served:
        for fd in fds:
            os.close(fd)
        raise OSError(f"no command {tool!r} here")
    return (str(tool), list(args), dict(env), str(cwd), int(mask)), fds


def _same_user(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return uid == os.getuid()


def _run_call(request: Request, fds: list[int], main_module: str, signal_mask: Iterable[int]) -> int:
    """In the forked child (SIGTERM blocked): become the call (its signal handling and mask, stdio,
    environment, folder, umask), run ``main_module.main(args)`` and end as an interpreter ends
    (non-daemon threads joined, exit handlers run, a ``SystemExit`` message printed)."""
    tool, args, env, cwd, mask = request
    for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_SETMASK, signal_mask)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.closerange(3, 1 << 16)
    os.umask(mask)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if hasattr(time, "tzset"):
        time.tzset()
    sys.argv = [tool, *args]
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    try:
        code = __import__(main_module, fromlist=["main"]).main(args)
    except SystemExit as done:
        code = _exit_code(done)
    except BaseException:  # what the interpreter prints for an uncaught exception, and its exit code
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter does at exit
        atexit._run_exitfuncs()
    except SystemExit as done:
        code = _exit_code(done)
    except BaseException:
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return (code or 0) & 0xFF


def _exit_code(done: SystemExit) -> int:
    """A ``SystemExit``'s exit code; a message is printed to stderr and exits 1, as the interpreter does."""
    if done.code is None or isinstance(done.code, int):
        return done.code or 0
    with contextlib.suppress(OSError, ValueError):
        print(done.code, file=sys.stderr)
    return 1


def _start_call(
    conn: socket.socket, served: Mapping[str, str], preload: Callable[[str], None]
) -> _Call | None:
    if not _same_user(conn):
        return None
    try:
        request, fds = _receive(conn, served)
    except (OSError, ValueError, EOFError, TypeError):
        return None
    try:
        preload(request[0])
    except Exception:  # the call then imports what it needs itself, and says what fails
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    # Until the child has reset it, it has the server's SIGTERM handling: a SIGTERM there would
    # write to the wake pipe both share and stop the server. Held (blocked) across the fork, it
    # reaches the child once the child is the call, and the server once the fork is done.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _run_call(request, fds, served[request[0]], mask)
            finally:
                os._exit(code)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for fd in fds:
        os.close(fd)
    return _Call(conn, pid, os.pidfd_open(pid))


def _finish(call: _Call) -> None:
    _, status = os.waitpid(call.pid, 0)
    os.close(call.pidfd)
    reply = bytes((1, os.WTERMSIG(status))) if os.WIFSIGNALED(status) else bytes((0, os.WEXITSTATUS(status)))
    with contextlib.suppress(OSError):
        call.conn.sendall(reply)
    call.conn.close()


def serve(layout: SandboxLayout) -> None:
    """The fakes' calls, until SIGTERM or until the sandbox folder is gone."""

    def listening() -> None:  # start_call_server waits for this file to name this process
        (layout.root / INFO_FILE).write_text(json.dumps({"pid": os.getpid()}))

    serve_calls(
        socket_name(layout),
        {tool: main for tool, (_, main) in SERVED.items()},
        _preload,
        listening,
        layout.root.is_dir,
    )


def serve_calls(
    name: str,
    served: Mapping[str, str],
    preload: Callable[[str], None],
    listening: Callable[[], None],
    wanted: Callable[[], bool],
) -> None:
    """Serve the calls of ``served`` (command -> the module whose ``main(args)`` runs it) on the
    abstract socket ``name`` until SIGTERM or until ``wanted()`` is false (asked every 30 s);
    ``preload(command)`` runs before each fork, ``listening()`` once the socket listens."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(128)
    # SIGTERM wakes the poll through this pipe (a handler alone would let the poll go on waiting)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_write)
    listening()
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    poller.register(wake_read, select.POLLIN)
    stopping = False
    by_fd: dict[int, tuple[str, _Call]] = {}
    last_check = time.monotonic()
    while not stopping:
        try:
            events = poller.poll(ROOT_CHECK_SECONDS * 1000)
        except InterruptedError:
            continue
        for fd, _ in events:
            if fd == wake_read:
                stopping = True
                break
            if fd == listener.fileno():
                with contextlib.suppress(OSError):
                    conn, _ = listener.accept()
                    call = _start_call(conn, served, preload)
                    if call is None:
                        conn.close()
                        continue
                    by_fd[call.pidfd] = ("child", call)
                    by_fd[conn.fileno()] = ("caller", call)
                    poller.register(call.pidfd, select.POLLIN)
                    poller.register(conn, select.POLLIN)
                continue
            entry = by_fd.get(fd)
            if entry is None:
                continue
            what, call = entry
            if what == "caller":  # the caller closed its end early: it was killed; so is the call
                poller.unregister(fd)
                by_fd.pop(fd)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(call.pid, signal.SIGKILL)
                continue
            poller.unregister(call.pidfd)
            by_fd.pop(call.pidfd)
            conn_fd = call.conn.fileno()
            if by_fd.pop(conn_fd, None) is not None:
                poller.unregister(conn_fd)
            _finish(call)
        if time.monotonic() - last_check > ROOT_CHECK_SECONDS:
            last_check = time.monotonic()
            if not wanted():
                break
    for what, call in list(by_fd.values()):
        if what == "child":
            with contextlib.suppress(ProcessLookupError):
                os.kill(call.pid, signal.SIGKILL)
            _finish(call)
    listener.close()


# ============================================================================ start and stop
def _read_info(layout: SandboxLayout) -> dict[str, object] | None:
    try:
        info = json.loads((layout.root / INFO_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def shim_command(layout: SandboxLayout, tool: str) -> str:
    """The shim's last lines for ``tool``: the calls the server takes go to the client (which runs the
    fake itself when no server answers); ``gcloud ... ssh``/``scp`` and gcluster's commands but
    ``job`` run the fake directly (their processes may outlive the call's own: see ``SERVED``)."""
    import shlex

    python = shlex.quote(sys.executable)
    module = shlex.quote(SERVED[tool][0])
    client = f"{python} -S {shlex.quote(str(CLIENT))} {shlex.quote(socket_name(layout))} {tool} {module}"
    direct = f"{python} -m {module}"
    if tool == "gcloud":
        return (
            'for arg in "$@"; do case $arg in ssh|scp) exec '
            + direct
            + ' "$@";; esac; done\n'
            + f'exec {client} "$@"\n'
        )
    return f'case "${{1-}}" in job) exec {client} "$@";; esac\nexec {direct} "$@"\n'


def start_call_server(layout: SandboxLayout, wait_seconds: float = 15.0) -> int:
    """Start the sandbox's call server (or keep the running one); its pid. RuntimeError when it
    exits or does not start in ``wait_seconds`` (its log is named)."""
    info = _read_info(layout)
    if info is not None and pid_alive(int(str(info["pid"]))):
        return int(str(info["pid"]))
    (layout.root / INFO_FILE).unlink(missing_ok=True)

    def listening(pid: int) -> int | None:
        info = _read_info(layout)
        return pid if info is not None and info.get("pid") == pid else None

    return start_module(
        "tpu_rl_sandbox.clis.call_server",
        ["--root", str(layout.root)],
        layout.root / LOG_FILE,
        listening,
        "the call server",
        RuntimeError,
        wait_seconds,
    )


def stop_call_server(layout: SandboxLayout, wait_seconds: float = 5.0) -> bool:
    """Stop the recorded call server and any call it is running. True if one was running."""
    info = _read_info(layout)
    if info is None:
        return False
    was_alive = stop_pid(int(str(info["pid"])), wait_seconds, group=True)
    (layout.root / INFO_FILE).unlink(missing_ok=True)
    return was_alive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpu_rl_sandbox.clis.call_server")
    parser.add_argument("--root", required=True, type=Path)
    args = parser.parse_args(argv)
    serve(SandboxLayout(args.root.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
