"""The fakes' call server (``clis/call_server.py``) and the shims' client (``clis/call_client.py``):
a call it serves (gcloud's, gcluster's ``job`` commands) is the call the fake makes run as its own
interpreter (output, exit code, stdin, working folder, environment, the call log), a caller's kill
ends it, the calls whose processes may outlive the call's are never handed over, no server means
the fake runs itself, and ``sandbox_down`` leaves no server behind."""

from __future__ import annotations

import _socket
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import tpu_rl_sandbox
from tpu_rl_sandbox.clis import call_server
from tpu_rl_sandbox.commands.lifecycle import SandboxInfo, sandbox_down, sandbox_up
from tpu_rl_sandbox.world.calls import read_calls
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.store import StateStore

PROJECT = "call-server-project"
# Bounds against a hang (a quiet machine needs well under a second for each).
CALL_TIMEOUT = 60.0
KILL_TIMEOUT = 30.0
CALLS = (
    ("gcloud", "version"),
    ("gcloud", "storage", "ls", f"--project={PROJECT}"),
    ("gcloud", "storage", "ls", "--no-such-flag"),
    ("gcloud", "secrets", "versions", "list", "absent", f"--project={PROJECT}"),
    ("gcloud", "secrets", "versions", "list", "absent"),
    ("gcloud", "compute", "instances", "describe", "absent", "--zone=us-east5-b", f"--project={PROJECT}"),
    ("gcloud", "no-such-group", "list"),
    ("gcluster", "job", "list"),
    ("gcluster", "job", "list", f"--project={PROJECT}", "--cluster=absent", "--location=us-east5"),
    (
        "gcluster",
        "job",
        "cancel",
        "absent",
        f"--project={PROJECT}",
        "--cluster=absent",
        "--location=us-east5",
    ),
    ("gcluster", "job", "no-such-command"),
)


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxInfo]:
    """A sandbox of this module's own: its tests stop and start its server."""
    info = sandbox_up(tmp_path_factory.mktemp("call-server") / "sandbox")
    try:
        yield info
    finally:
        sandbox_down(info.root)


def _env(info: SandboxInfo, **extra: str) -> dict[str, str]:
    env = {**os.environ, **info.env, **extra}
    env.pop("CLOUDSDK_CORE_PROJECT", None)
    return env


def _shim(info: SandboxInfo, tool: str, *argv: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("env", _env(info))
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [str(info.bin_dir / tool), *argv], capture_output=True, text=True, timeout=CALL_TIMEOUT, **kwargs
    )


def _direct(info: SandboxInfo, tool: str, *argv: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """The fake as its own interpreter: what the shim ran before the server (and runs without one)."""
    env = dict(kwargs.pop("env", None) or _env(info))  # type: ignore[call-overload]
    env["PYTHONPATH"] = str(Path(tpu_rl_sandbox.__file__).resolve().parents[1])
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", f"tpu_rl_sandbox.clis.{tool}", *argv],
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
        env=env,
        **kwargs,
    )


# gcluster stamps its progress lines with the second it prints them: two runs may straddle one.
STAMP = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\b")


def _printed(done: subprocess.CompletedProcess[str]) -> tuple[int, str, str]:
    """What a call printed and its exit code, each timestamp written as ``<stamp>``."""
    return done.returncode, STAMP.sub("<stamp>", done.stdout), STAMP.sub("<stamp>", done.stderr)


def _server_pid(info: SandboxInfo) -> int:
    recorded = json.loads((info.root / call_server.INFO_FILE).read_text())
    return int(recorded["pid"])


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _served(info: SandboxInfo, tool: str, *argv: str) -> bool:
    """Whether the server ran the call: the fake's own modules are then not imported by the call's
    processes (the client imports nothing of the package; the server's child has them already)."""
    traced = _shim(info, tool, *argv, env=_env(info, PYTHONPROFILEIMPORTTIME="1"))
    return "tpu_rl_sandbox" not in traced.stderr


def _wait(what: str, probe: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not probe():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("argv", CALLS, ids=" ".join)
def test_a_served_call_prints_and_exits_as_the_fake_run_by_itself(
    own: SandboxInfo, argv: tuple[str, ...]
) -> None:
    served = _shim(own, *argv)
    direct = _direct(own, *argv)
    assert _printed(served) == _printed(direct)
    assert _served(own, *argv)


def test_stdin_the_working_folder_and_the_environment_are_the_callers(
    own: SandboxInfo, tmp_path: Path
) -> None:
    layout = SandboxLayout(own.root)
    before = len(read_calls(layout))
    created = _shim(
        own,
        "gcloud",
        "secrets",
        "create",
        "served-secret",
        "--data-file=-",
        f"--project={PROJECT}",
        input="a token read from stdin",
        cwd=tmp_path,
        env=_env(own, TPU_RL_CALLER_ONLY="1"),
    )
    assert created.returncode == 0, created.stderr
    record = StateStore(layout).read("secrets")[f"{PROJECT}/served-secret"]
    assert record["versions"][0]["sha256"] == hashlib.sha256(b"a token read from stdin").hexdigest()
    call = read_calls(layout)[before]
    assert call["argv"][:2] == ["secrets", "create"]
    assert call["cwd"] == str(tmp_path)
    assert "TPU_RL_CALLER_ONLY" in call["env_names"]
    assert call["exit_code"] == 0


@contextmanager
def _held_call(
    info: SandboxInfo, secret: str, at_first_sight: bool = False
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A served call that waits on stdin forever (a hang's stand-in): its caller, and the server's
    child running it (``at_first_sight``: looked for with no pause, so it is yielded the moment it
    exists); the caller is killed and reaped on the way out."""
    server = _server_pid(info)
    caller = subprocess.Popen(
        [str(info.bin_dir / "gcloud"), "secrets", "create", secret, "--data-file=-", f"--project={PROJECT}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(info),
    )
    try:
        if at_first_sight:
            deadline = time.monotonic() + KILL_TIMEOUT
            children = _children(server)
            while not children and time.monotonic() < deadline:
                children = _children(server)
            assert children, "no child of the server ran the call"
        else:
            _wait("the server's child running the call", lambda: _children(server), KILL_TIMEOUT)
            children = _children(server)
        yield caller, children[0]
    finally:
        caller.kill()
        assert caller.stdin is not None
        caller.stdin.close()
        caller.wait(timeout=KILL_TIMEOUT)


def test_a_killed_caller_ends_its_call(own: SandboxInfo) -> None:
    """The call ends when its caller is killed, as the fake in the caller's process would have."""
    server = _server_pid(own)
    with _held_call(own, "hung-secret") as (caller, _):
        caller.kill()
        caller.wait(timeout=KILL_TIMEOUT)
        _wait("the call's child to be killed", lambda: not _children(server), KILL_TIMEOUT)
    assert caller.returncode == -signal.SIGKILL
    assert "hung-secret" not in str(StateStore(SandboxLayout(own.root)).read("secrets"))


def test_a_call_ended_by_a_signal_ends_its_client_by_it(own: SandboxInfo) -> None:
    with _held_call(own, "term-secret") as (caller, child):
        os.kill(child, signal.SIGTERM)
        assert caller.wait(timeout=KILL_TIMEOUT) == -signal.SIGTERM


def test_a_signal_to_a_call_as_it_starts_never_stops_the_server(own: SandboxInfo) -> None:
    """A call's child is a fork of the server: until it is the call, it has the server's SIGTERM
    handling (a handler that wakes the server's loop through a pipe both share). SIGTERM sent the
    moment the child exists ends that call only, each of ``tries`` times; the server serves on."""
    server = _server_pid(own)
    tries = 20
    for attempt in range(tries):
        with _held_call(own, f"race-{attempt}", at_first_sight=True) as (caller, child):
            os.kill(child, signal.SIGTERM)
            assert caller.wait(timeout=KILL_TIMEOUT) == -signal.SIGTERM, f"try {attempt}"
        assert Path(f"/proc/{server}").is_dir(), f"try {attempt}: the server is gone"
    assert _served(own, "gcloud", "version")


def test_another_user_gets_no_call(own: SandboxInfo) -> None:
    """The socket is abstract (no file mode guards it): the server answers its own user only."""
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another user")
    probe = (
        "import _socket, marshal, sys\n"
        "s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)\n"
        f"s.connect('\\0' + {call_server.socket_name(SandboxLayout(own.root))!r})\n"
        "body = marshal.dumps(('gcloud', ['version'], {}, '/', 0o22))\n"
        "fds = b''.join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))\n"
        "try:\n"
        "    s.sendmsg([len(body).to_bytes(8, 'big') + body], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])\n"
        "    print('answered' if s.recv(2) else 'closed')\n"
        "except OSError:\n"
        "    print('closed')\n"
    )
    done = subprocess.run(
        ["/usr/bin/python3", "-S", "-c", probe],
        user=65534,
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "closed"


def test_without_a_server_the_shim_runs_the_fake_itself(own: SandboxInfo) -> None:
    layout = SandboxLayout(own.root)
    assert call_server.stop_call_server(layout)
    try:
        argv = ("secrets", "versions", "list", "absent", f"--project={PROJECT}")
        alone = _shim(own, "gcloud", *argv)
        direct = _direct(own, "gcloud", *argv)
        assert (alone.returncode, alone.stdout, alone.stderr) == (
            direct.returncode,
            direct.stdout,
            direct.stderr,
        )
        assert not _served(own, "gcloud", *argv)
    finally:
        call_server.start_call_server(layout)
    assert _served(own, "gcloud", "version")


@pytest.mark.parametrize(
    "argv",
    [
        ("gcloud", "compute", "ssh", "absent", "--zone=us-east5-b", f"--project={PROJECT}", "--command=true"),
        ("gcluster", "--version"),
        ("gcluster", "deploy", "absent-folder", "--auto-approve"),
        ("gcluster", "destroy", "absent-folder", "--auto-approve"),
    ],
    ids=" ".join,
)
def test_calls_whose_processes_may_outlive_them_are_never_handed_over(
    own: SandboxInfo, argv: tuple[str, ...]
) -> None:
    """ssh's command runs on a fake machine; gcluster's Terraform in a process group of its own,
    which a caller's kill finds through /proc under the call's own process."""
    assert not _served(own, *argv)


def test_what_a_tool_s_calls_import_is_frozen_before_they_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call is a fork of the server: its collections must never walk (and copy) the preloaded
    modules' objects (``gc.freeze`` once they are imported)."""
    events: list[str] = []
    monkeypatch.setattr(call_server, "_preloaded", set())
    monkeypatch.setattr(call_server, "PRELOADS", {"gcluster": ("json",)})
    monkeypatch.setattr(call_server.gc, "freeze", lambda: events.append("freeze"))
    monkeypatch.setattr("builtins.__import__", _recording_import(events))
    call_server._preload("gcluster")
    call_server._preload("gcluster")  # once a tool
    assert events == ["import json", "freeze"]


def _recording_import(events: list[str]) -> object:
    real = __import__

    def recording(name: str, *args: object, **kwargs: object) -> object:
        if name == "json":
            events.append(f"import {name}")
        return real(name, *args, **kwargs)

    return recording


def test_sandbox_down_stops_the_server(tmp_path: Path) -> None:
    info = sandbox_up(tmp_path / "sandbox")
    server = _server_pid(info)
    try:
        assert _served(info, "gcloud", "version")
    finally:
        sandbox_down(info.root)
    assert not Path(f"/proc/{server}").exists()
    probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    with pytest.raises(ConnectionRefusedError):
        probe.connect("\0" + call_server.socket_name(SandboxLayout(info.root)))
    probe.close()


EXIT_PROBE = """
import atexit, sys, threading, time


def main(args):
    if args[0] == "message":
        raise SystemExit("the probe stops here")
    if args[0] == "exit-handler":
        atexit.register(lambda: print("the exit handler ran", flush=True))
        return 3
    if args[0] == "thread":
        threading.Thread(target=lambda: (time.sleep(0.3), print("the thread ended", flush=True))).start()
        return 0
    if args[0] == "raise":
        raise ValueError("the probe failed")
    print("no code")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def probe_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A call server of its own serving ``probe`` (``exit_probe.main``): its name and environment."""
    folder = tmp_path_factory.mktemp("exit-probe")
    (folder / "exit_probe.py").write_text(EXIT_PROBE)
    name = "tpu-rl-test-exit-probe-" + hashlib.sha256(str(folder).encode()).hexdigest()[:16]
    ready = folder / "listening"
    env = {**os.environ, "PYTHONPATH": f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    serve = (
        "import pathlib, sys\n"
        "from tpu_rl_sandbox.clis import call_server\n"
        f"call_server.serve_calls({name!r}, {{'probe': 'exit_probe'}}, lambda command: None,\n"
        f"    pathlib.Path({str(ready)!r}).touch, lambda: True)\n"
    )
    server = subprocess.Popen([sys.executable, "-c", serve], env=env, start_new_session=True)
    try:
        _wait("the probe's call server to listen", ready.exists, CALL_TIMEOUT)
        yield name, env
    finally:
        server.terminate()
        server.wait(timeout=KILL_TIMEOUT)


@pytest.mark.parametrize("case", ["message", "exit-handler", "thread", "none"])
def test_a_served_call_ends_as_an_interpreter_ends(
    probe_server: tuple[str, dict[str, str]], case: str
) -> None:
    """A ``SystemExit`` message printed (exit 1), exit handlers run, threads joined, ``None`` is 0."""
    name, env = probe_server
    traced = subprocess.run(
        [sys.executable, "-S", str(call_server.CLIENT), name, "probe", "exit_probe", case],
        env={**env, "PYTHONPROFILEIMPORTTIME": "1"},
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
    )
    # run by itself, the probe is `python -m exit_probe`: runpy's import is traced
    assert "runpy" not in traced.stderr, "the call was not served"
    served = subprocess.run(
        [sys.executable, "-S", str(call_server.CLIENT), name, "probe", "exit_probe", case],
        env=env,
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
    )
    direct = subprocess.run(
        [sys.executable, "-m", "exit_probe", case],
        env=env,
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
    )
    assert _printed(served) == _printed(direct)
    assert direct.stdout + direct.stderr  # each case prints something


def test_a_served_calls_uncaught_exception_is_printed_and_exits_1(
    probe_server: tuple[str, dict[str, str]],
) -> None:
    name, env = probe_server
    served = subprocess.run(
        [sys.executable, "-S", str(call_server.CLIENT), name, "probe", "exit_probe", "raise"],
        env=env,
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
    )
    assert served.returncode == 1
    assert served.stderr.startswith("Traceback (most recent call last):")
    assert served.stderr.splitlines()[-1] == "ValueError: the probe failed"
