"""Record, from inside a Python program, the files it writes and deletes and the folders it makes and
renames (``sys.addaudithook``: the interpreter's own ``open``, ``os.mkdir``, ``os.rename``,
``os.replace`` and ``os.remove`` events, in every thread, in the order they happen).

Orbax and MaxText write their checkpoint metadata, item metadata and commit markers, and make and
rename Orbax's temporary folders, from Python; tensorstore (the arrays) and the Rust writers of
``tokenizer.json`` and safetensors files do not show here. Unlike inotify, nothing written into a
folder the program just made can be missed.

``install()`` does nothing unless ``MAXTEXT_WRITE_LOG`` (the log file) and ``MAXTEXT_WRITE_ROOT``
(the folder whose paths are recorded) are set; each line is ``KIND<TAB>PATH`` with the path relative
to the root and KIND one of ``+`` (opened for writing, or a file renamed into place), ``-``,
``mkdir``, ``mv`` (a folder renamed to PATH). Standard library only: it runs in a MaxText venv.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

LOG_ENV = "MAXTEXT_WRITE_LOG"
ROOT_ENV = "MAXTEXT_WRITE_ROOT"
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def install() -> None:
    """Start recording, if asked to by the environment."""
    log, root = os.environ.get(LOG_ENV), os.environ.get(ROOT_ENV)
    if not log or not root:
        return
    prefix = os.path.abspath(root) + os.sep
    out = open(log, "a", buffering=1)  # noqa: SIM115 (open for the life of the process)
    lock = threading.Lock()

    def emit(kind: str, path: Any) -> None:
        if isinstance(path, int) or path is None:
            return
        name = os.path.abspath(os.fsdecode(path))
        if name.startswith(prefix):
            with lock:
                out.write(f"{kind}\t{name[len(prefix) :]}\n")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = args
            if (mode is not None and any(c in mode for c in "wax+")) or (mode is None and flags & _WRITING):
                emit("+", path)
        elif event in ("os.rename", "os.replace"):
            emit("mv" if os.path.isdir(args[0]) else "+", args[1])
        elif event == "os.mkdir":
            emit("mkdir", args[0])
        elif event == "os.remove" and not isinstance(args[0], int) and os.path.lexists(args[0]):
            emit("-", args[0])  # (an unlink(missing_ok=True) of nothing is no event)

    sys.addaudithook(hook)
