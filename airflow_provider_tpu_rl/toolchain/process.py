"""Run one argv without a shell: fresh HOME/KUBECONFIG, minimal env, stdin closed, output streamed.

Shared by the sync runner (``subprocess``) and the async one (``asyncio`` subprocesses for triggers).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REDACTED = "***"
KILL_GRACE_SECONDS = 10.0

# Inherited from the worker; everything else is dropped so Airflow's own variables (and any secret
# in them) never reach gcluster/gcloud/terraform.
INHERITED_ENV_NAMES = frozenset(
    {
        "PATH",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "TMPDIR",
        "USER",
        "LOGNAME",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "STORAGE_EMULATOR_HOST",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_CLOUD_PROJECT",
        "USE_GKE_GCLOUD_AUTH_PLUGIN",
        "TF_PLUGIN_CACHE_DIR",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "all_proxy",
    }
)
INHERITED_ENV_PREFIXES = ("CLOUDSDK_",)


@dataclass(frozen=True)
class CommandResult:
    """What a finished command left: exit code and its (redacted) stdout+stderr lines in order."""

    exit_code: int
    output_lines: tuple[str, ...]
    timed_out: bool = False
    ok_marker: str | None = None  # the ok_if_output_contains text that made a failure count as success

    @property
    def ok(self) -> bool:
        return not self.timed_out and (self.exit_code == 0 or self.ok_marker is not None)

    @property
    def output(self) -> str:
        return "\n".join(self.output_lines)


class Redactor:
    """Replaces every secret value with ``***`` (longest first, so overlapping values go whole)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._values = sorted({s for s in secrets if s}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self._values:
            text = text.replace(value, REDACTED)
        return text


def minimal_env(source: Mapping[str, str] | None = None, inherit: Sequence[str] = ()) -> dict[str, str]:
    """The allow-listed part of ``source`` (default ``os.environ``).

    ``inherit`` adds names to the allow-list; a name ending in ``*`` is a prefix.
    """
    source = os.environ if source is None else source
    names = INHERITED_ENV_NAMES | {n for n in inherit if not n.endswith("*")}
    prefixes = INHERITED_ENV_PREFIXES + tuple(n[:-1] for n in inherit if n.endswith("*") and len(n) > 1)
    return {key: value for key, value in source.items() if key in names or key.startswith(prefixes)}


def _default_gcloud_config(source: Mapping[str, str]) -> str | None:
    """The worker's gcloud config folder, so a fresh HOME keeps the worker's gcloud login."""
    if source.get("CLOUDSDK_CONFIG"):
        return source["CLOUDSDK_CONFIG"]
    home = source.get("HOME") or str(Path.home())
    candidate = Path(home) / ".config" / "gcloud"
    return str(candidate) if candidate.is_dir() else None


@dataclass
class PreparedProcess:
    """Everything needed to start one process, and to clean up after it."""

    argv: list[str]
    env: dict[str, str]
    stdin_payload: str | None
    redact: Redactor
    home: Path
    remove_home: bool
    ok_if_output_contains: tuple[str, ...] = ()
    cwd: str | None = None
    output: list[str] = field(default_factory=list)

    def cleanup(self) -> None:
        if self.remove_home:
            shutil.rmtree(self.home, ignore_errors=True)

    def result(self, exit_code: int, timed_out: bool) -> CommandResult:
        text = "\n".join(self.output)
        marker = None
        if exit_code != 0 and not timed_out:
            marker = next((m for m in self.ok_if_output_contains if m and m in text), None)
        return CommandResult(exit_code, tuple(self.output), timed_out, marker)


def prepare_process(
    argv: Sequence[str],
    *,
    command_env: Mapping[str, str],
    stdin_payload: str | None,
    secrets: Iterable[str],
    job_home: str | os.PathLike[str] | None,
    cwd: str | os.PathLike[str] | None,
    ok_if_output_contains: Sequence[str] = (),
    base_env: Mapping[str, str] | None = None,
    inherit_env: Sequence[str] = (),
    path_prepend: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
) -> PreparedProcess:
    """Build argv/env: a fresh temp HOME (or ``job_home``) with its own KUBECONFIG.

    ``extra_env`` (e.g. the toolchain's ``TF_PLUGIN_CACHE_DIR``) goes on top of the minimal env,
    ``command_env`` on top of that; ``path_prepend`` folders come first on PATH, in order.
    """
    source = os.environ if base_env is None else base_env
    if job_home is None:
        home = Path(tempfile.mkdtemp(prefix="tpu-rl-home-"))
        remove_home = True
    else:
        home = Path(job_home)
        home.mkdir(parents=True, exist_ok=True)
        remove_home = False
    (home / ".kube").mkdir(exist_ok=True)
    env = minimal_env(source, inherit_env)
    env["HOME"] = str(home)
    env["KUBECONFIG"] = str(home / ".kube" / "config")
    gcloud_config = _default_gcloud_config(source)
    if gcloud_config and "CLOUDSDK_CONFIG" not in env:
        env["CLOUDSDK_CONFIG"] = gcloud_config
    env.update(extra_env or {})
    env.update(command_env)
    if path_prepend:
        rest = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p not in path_prepend]
        env["PATH"] = os.pathsep.join([*dict.fromkeys(os.fspath(p) for p in path_prepend), *rest])
    return PreparedProcess(
        argv=list(argv),
        env=env,
        stdin_payload=stdin_payload,
        redact=Redactor(secrets),
        home=home,
        remove_home=remove_home,
        ok_if_output_contains=tuple(ok_if_output_contains),
        cwd=os.fspath(cwd) if cwd is not None else None,
    )


def kill_process_group(pid: int, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to the process group led by ``pid`` (started with ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _stat(pid: int) -> tuple[int, int] | None:
    """``(parent pid, process group)`` of a live process from ``/proc/PID/stat`` (Linux), else None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
    if fields[0] == "Z":  # a zombie holds no resource; its parent reaps it
        return None
    return int(fields[1]), int(fields[2])


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, deepest first (empty where ``/proc`` is not available).

    Terraform started by gcluster is one: terraform-exec runs it in a process group of its own
    (hashicorp/terraform-exec v0.24.0, ``tfexec/cmd_linux.go``: ``Setpgid: true``), so signalling
    gcluster's group alone never reaches it.
    """
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append(int(entry.name))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found[::-1]


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is left in the group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    members = (_stat(int(e.name)) for e in proc.iterdir() if e.name.isdigit())
    return any(stat is not None and stat[1] == pgid for stat in members)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def stop_tree(proc: subprocess.Popen[str], grace: float) -> None:
    """Stop a process, its process group and every descendant outside that group.

    Descendants in other groups (Terraform under gcluster) get SIGTERM first and up to ``grace``
    seconds to exit (Terraform then stops cleanly and releases its state lock); then the group
    gets SIGTERM and the same grace; whatever is left of either gets SIGKILL.
    """
    pgid = proc.pid
    # Once the process is reaped its pid may be another's: only a live process's tree is walked.
    tree = descendants(proc.pid) if proc.poll() is None else []
    outside = [pid for pid in tree if (stat := _stat(pid)) is not None and stat[1] != pgid]
    for pid in outside:
        _signal(pid, signal.SIGTERM)
    _wait_gone(lambda: any(_stat(pid) is not None for pid in outside), grace)
    kill_process_group(pgid, signal.SIGTERM)
    _wait_gone(lambda: proc.poll() is None or _group_alive(pgid), grace)
    kill_process_group(pgid, signal.SIGKILL)
    for pid in outside:
        if _stat(pid) is not None:
            _signal(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    # SIGKILL is not death: a process exits after it is delivered, closing its files (the output
    # pipe reads EOF) before it is a zombie. Return when the tree is gone, not when it was told.
    _wait_gone(lambda: any(_stat(pid) is not None for pid in outside), grace)


def _wait_gone(alive: Callable[[], bool], grace: float) -> None:
    deadline = time.monotonic() + grace
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)


class SyncProcess:
    """One running process (sync): stream its lines, stop it on timeout or on request."""

    def __init__(self, prepared: PreparedProcess, grace: float = KILL_GRACE_SECONDS) -> None:
        self.prepared = prepared
        self.timed_out = False
        self.grace = grace
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        p = self.prepared
        self._proc = subprocess.Popen(
            p.argv,
            stdin=subprocess.PIPE if p.stdin_payload is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=p.cwd,
            env=p.env,
            start_new_session=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
        )
        if p.stdin_payload is not None:
            threading.Thread(target=self._feed_stdin, args=(p.stdin_payload,), daemon=True).start()

    def _feed_stdin(self, payload: str) -> None:
        assert self._proc is not None
        assert self._proc.stdin is not None
        stdin = self._proc.stdin
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            stdin.write(payload)
            stdin.flush()
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            stdin.close()

    def lines(self) -> Iterator[str]:
        """Each output line as it comes, redacted (also kept in ``prepared.output``)."""
        assert self._proc is not None
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            line = self.prepared.redact(raw.rstrip("\r\n"))
            self.prepared.output.append(line)
            yield line

    def wait(self) -> int:
        assert self._proc is not None
        return self._proc.wait()

    def stop(self, *, timed_out: bool = False, grace: float | None = None) -> None:
        """Stop the process tree (:func:`stop_tree`): SIGTERM, then SIGKILL after ``grace`` seconds.

        Also when the process itself already exited: a child it left behind (holding the output
        pipe open, or still running) goes too.
        """
        with self._lock:  # one stop at a time: a second one returns when the first has ended
            proc = self._proc
            if proc is None:
                return
            self.timed_out = self.timed_out or timed_out
            stop_tree(proc, self.grace if grace is None else grace)


def run_sync(
    prepared: PreparedProcess,
    *,
    on_line: Callable[[str], None],
    timeout: float | None,
    register: Callable[[SyncProcess | None], None] | None = None,
    grace: float = KILL_GRACE_SECONDS,
) -> CommandResult:
    """Run ``prepared`` to the end, calling ``on_line`` with every (redacted) line in order.

    After ``timeout`` seconds the process tree is stopped (:meth:`SyncProcess.stop`, SIGTERM then
    SIGKILL after ``grace`` seconds) and the result says ``timed_out``; the tree is stopped too when
    the process ends (a child left behind) or when the caller is interrupted (the task's own
    ``execution_timeout`` raises in this thread).
    """
    process = SyncProcess(prepared, grace)
    timer: threading.Timer | None = None
    try:
        process.start()
        if register:
            register(process)
        if timeout is not None:
            timer = threading.Timer(timeout, process.stop, kwargs={"timed_out": True})
            timer.daemon = True
            timer.start()
        for line in process.lines():
            on_line(line)
        exit_code = process.wait()
    finally:
        if timer is not None:
            timer.cancel()
        if register:
            register(None)
        process.stop()
        prepared.cleanup()
    return prepared.result(exit_code, process.timed_out)
