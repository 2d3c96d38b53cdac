"""The order a program writes files in: ``(kind, name)`` pairs, names relative to a root: ``+`` a
file written (or renamed into place), ``-`` deleted, ``mkdir`` a folder made, ``mv`` a folder renamed
to this name.

Two sources. ``AuditLog``: what the program's own Python does (write_audit.py, installed by
run_converter.py and actor_step.py): Orbax's metadata, markers and folders, MaxText's write probe;
nothing is missed. ``WriteLog``: inotify (``inotifywait`` of inotify-tools) on a folder, for what is
written natively (the tokenizer's ``tokenizer.json`` and the safetensors files of an export, all
into the export folder, which exists before the program runs; inotify adds a watch on a new folder
only after it exists, so it can miss a file written at once into a folder the program just made).
``check_complete`` fails when a milestone file of the final tree never showed up in the log: an
order read from an incomplete log is not trusted.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

LOCK_SUFFIX = ".__lock"
TMP_SEGMENT = re.compile(r"\.orbax-checkpoint-tmp(?=/|$)")


class Writes:
    """Events recorded under a root."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.events: list[tuple[str, str]] = []

    def under(self, prefix: str) -> list[tuple[str, str]]:
        """The events below the folder ``prefix`` (relative to ``root``), names relative to it."""
        folder = prefix.rstrip("/") + "/"
        return [(kind, name[len(folder) :]) for kind, name in self.events if name.startswith(folder)]

    def check_complete(self, prefix: str, wanted: Callable[[str], bool] = lambda name: True) -> None:
        """Fail unless every ``wanted`` file now under ``prefix`` was written in the log."""
        folder = self.root / prefix
        # a file written under Orbax's temporary folder name lands under the final one
        landed = {re.sub(TMP_SEGMENT, "", name) for kind, name in self.under(prefix) if kind == "+"}
        final = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
        final = {name for name in final if wanted(name)}
        missed = sorted(final - landed)
        if missed:
            raise AssertionError(
                f"the write log missed {len(missed)} file(s) under {prefix}, e.g. {missed[:3]}"
            )


class AuditLog(Writes):
    """What a program run with ``env()`` recorded of its own writes under ``root``."""

    def __init__(self, root: Path, log: Path) -> None:
        super().__init__(root)
        self.log = log

    def env(self) -> dict[str, str]:
        return {"MAXTEXT_WRITE_LOG": str(self.log), "MAXTEXT_WRITE_ROOT": str(self.root)}

    def read(self) -> AuditLog:
        for line in self.log.read_text().splitlines():
            kind, _, name = line.partition("\t")
            self.events.append((kind, name))
        return self


class WriteLog(Writes):
    """``inotifywait -m -r`` on ``root`` for the duration of a ``with`` block."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._process: subprocess.Popen[str] | None = None
        self._lines: list[str] = []
        self._reader: threading.Thread | None = None

    def __enter__(self) -> WriteLog:
        binary = shutil.which("inotifywait")
        if binary is None:
            raise RuntimeError("inotifywait not found: install inotify-tools (make inotify-tools)")
        self.root.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(
            [
                binary,
                "-m",
                "-r",
                "--format",
                "%e|%w%f",
                "-e",
                "create,close_write,moved_to,delete",
                str(self.root),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self._process.stderr is not None
        deadline = time.monotonic() + 30
        for line in self._process.stderr:  # "Setting up watches." … "Watches established."
            if "Watches established" in line:
                break
            if time.monotonic() > deadline:
                break
        else:
            raise RuntimeError("inotifywait exited before its watches were established")
        # Drained as it goes: a full pipe would stall inotifywait and overflow the kernel's queue.
        stdout = self._process.stdout
        assert stdout is not None
        self._reader = threading.Thread(target=lambda: self._lines.extend(stdout), daemon=True)
        self._reader.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        assert self._process is not None
        time.sleep(0.5)  # the last events of a program that just exited
        self._process.terminate()
        self._process.wait(timeout=30)
        assert self._reader is not None
        self._reader.join(timeout=30)
        for line in self._lines:
            flags, _, path = line.rstrip("\n").partition("|")
            self._add(set(flags.split(",")), path)

    def _add(self, flags: set[str], path: str) -> None:
        name = Path(path).resolve().relative_to(self.root).as_posix()
        if "ISDIR" in flags:
            if "CREATE" in flags:
                self.events.append(("mkdir", name))
            elif "MOVED_TO" in flags:
                self.events.append(("mv", name))
            return
        if name.endswith(LOCK_SUFFIX):
            return
        if "CLOSE_WRITE" in flags or "MOVED_TO" in flags:
            self.events.append(("+", name))
        elif "DELETE" in flags:
            self.events.append(("-", name))
