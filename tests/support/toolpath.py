"""``PATH`` strings with chosen executables hidden, for tests that remove a tool.

This machine has real ``kubectl``, ``gke-gcloud-auth-plugin``, ``terraform`` and ``git`` in
``/usr/bin`` or ``/usr/local/bin`` next to everything else a test needs (``sh``, ``python3``,
``gcloud``), so dropping a whole PATH entry is not an option: every entry that holds a hidden
name is replaced by a folder of symlinks to that entry's other executables.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path


def _holds_any(entry: Path, names: set[str]) -> bool:
    return any(os.path.lexists(entry / name) for name in names)


def path_without(hidden: Iterable[str], folder: Path, base_path: str | None = None) -> str:
    """``base_path`` (default ``$PATH``) with the executables named in ``hidden`` not findable.

    Each PATH entry that holds one of them becomes ``folder/<n>`` (``n`` its position), filled
    with symlinks to the entry's other executables; other entries stay as they are.
    """
    names = set(hidden)
    if any(not name or os.sep in name for name in names):
        raise ValueError(f"hidden names must be bare executable names, got {sorted(names)}")
    base = os.environ.get("PATH", os.defpath) if base_path is None else base_path
    folder = Path(folder)
    entries: list[str] = []
    for index, raw in enumerate(base.split(os.pathsep)):
        entry = Path(raw) if raw else Path.cwd()
        if not entry.is_dir() or not _holds_any(entry, names):
            entries.append(raw)
            continue
        replacement = folder / str(index)
        if replacement.exists() or replacement.is_symlink():
            shutil.rmtree(replacement)
        replacement.mkdir(parents=True)
        for child in entry.iterdir():
            if child.name in names or child.is_dir():
                continue
            if child.is_file() and os.access(child, os.X_OK):
                (replacement / child.name).symlink_to(entry.resolve() / child.name)
        entries.append(str(replacement))
    result = os.pathsep.join(entries)
    still = sorted(name for name in names if shutil.which(name, path=result))
    if still:
        raise RuntimeError(f"path_without could not hide {still} in {result}")
    return result
