"""The provider's verdicts (``maxtext/layout.py``'s probes) on a local folder standing for a bucket.

Every file under ``root`` is an object named by its path relative to it (GCS has no folders; an empty
local folder lists as nothing). The probes are answered the way the sensors, triggers and operators
answer them: ``ListFolder`` as a ``delimiter="/"`` listing (objects at that level and sub-folders
ending in ``/``), ``ReadObject`` with the file's bytes.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any, TypeVar

from airflow_provider_tpu_rl.maxtext import layout

_Result = TypeVar("_Result")


def object_names(root: Path) -> list[str]:
    """Every file under ``root`` as an object name."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def list_one_level(names: list[str], prefix: str) -> list[str]:
    """A ``delimiter="/"`` listing of ``prefix`` over ``names``."""
    level: set[str] = set()
    for name in names:
        if name.startswith(prefix):
            head, sep, _ = name[len(prefix) :].partition("/")
            level.add(prefix + head + sep)
    return sorted(level)


def drive(root: Path, probe: Generator[layout.ProbeRequest, Any, _Result]) -> _Result:
    """Answer ``probe``'s requests from the folder ``root``; its verdict."""
    names = object_names(root)
    return layout.answer_probe(
        probe, lambda prefix: list_one_level(names, prefix), lambda name: (root / name).read_bytes()
    )


def checkpoint_verdict(root: Path, prefix: str, step: int | None, items: tuple[str, ...]) -> dict[str, Any]:
    """What ``probe_checkpoint`` says of the checkpoint root ``prefix``."""
    result = drive(root, layout.probe_checkpoint(layout.as_folder(prefix), step, items))
    state = result.state
    return {
        "complete": result.is_complete,
        "status": state.status.value if state else None,
        "missing": list(state.missing) if state else None,
        "error": result.error,
        "steps": {str(k): v.status.value for k, v in result.states.items()},
    }


def export_verdict(root: Path, prefix: str) -> dict[str, Any]:
    """What ``probe_hf_export`` says of the export folder ``prefix``."""
    result = drive(root, layout.probe_hf_export(layout.as_folder(prefix)))
    status = result.status
    return {
        "complete": status.complete,
        "missing": list(status.missing),
        "files": list(status.files),
        "weight_files": list(status.weight_files),
        "error": result.error,
    }
