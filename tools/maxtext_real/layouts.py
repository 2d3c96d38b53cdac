"""Checkpoint and export layouts in a normal form, to compare MaxText's real output with the sandbox's.

The real-converter leg (``make test-maxtext``) writes ``tests/fixtures/maxtext/real_layouts.json``
from what MaxText and Orbax wrote (``MAXTEXT_REAL_REFRESH=1``); ``tests/sandbox/test_maxtext_sim.py``
runs the sandbox's simulation with the same keys and compares it with the file, so the simulation
cannot drift from the real layout unnoticed.

A layout in normal form:

* ``files``: the object names under the output folder, with what differs run to run or model to
  model folded: a step folder ``10/`` -> ``<step>/``, an array folder ``params.params.decoder…`` ->
  ``params.params.<param>`` (``base.<param>.value``, ``opt_state.<param>``), a chunk ``3.0.0`` ->
  ``<chunk>``, an OCDBT data file ``d/<32 hex>`` -> ``d/<hash>``, a weight shard ->
  ``<shard>``, MaxText's write-access probe ``.write_test_<uuid4>`` -> ``.write_test_<uuid>``.
* ``order``: the milestones in the order they were written, each item folder folded to ``<item>``
  (items are written in parallel) and a repeat of the previous milestone dropped. A milestone is
  ``+name`` (written), ``-name`` (deleted), ``mkdir name`` or ``mv name`` (a folder renamed to it).
  Checkpoint milestones: ``_CHECKPOINT_METADATA`` (written and rewritten), each item's ``_METADATA``
  and ``commit_success.txt``, the step's ``commit_success.txt``, the write probe, and on a local disk
  Orbax's temporary folders and their renames. Export milestones: every file, the tokenizer's
  (written by ``save_pretrained``; on ``gs://`` uploaded in ``os.listdir`` order) folded to
  ``<tokenizer>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "maxtext" / "real_layouts.json"
TMP = ".orbax-checkpoint-tmp"
TOKENIZER_FILES = frozenset({"chat_template.jinja", "tokenizer.json", "tokenizer_config.json"})

_STEP = re.compile(r"^\d+$")
_TMP_STEP = re.compile(rf"^\d+{re.escape(TMP)}$")
_CHUNK = re.compile(r"^\d+(\.\d+)*$")
_HASH = re.compile(r"^[0-9a-f]{32}$")
_SHARD = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
_WRITE_TEST = re.compile(r"^\.write_test_[0-9a-f-]{36}$")
_ARRAY_FOLDERS = (
    (re.compile(r"^params\.params\..+$"), "params.params.<param>"),
    (re.compile(r"^base\..+\.value$"), "base.<param>.value"),
    (re.compile(r"^opt_state\..+$"), "opt_state.<param>"),
)


def normalize(name: str) -> str:
    """An object name relative to the output folder, in normal form (see the module doc)."""
    parts = name.split("/")
    out: list[str] = []
    for i, part in enumerate(parts):
        if i == 0 and _STEP.match(part):
            part = "<step>"
        elif i == 0 and _TMP_STEP.match(part):
            part = "<step>" + TMP
        elif _WRITE_TEST.match(part):
            part = ".write_test_<uuid>"
        elif _SHARD.match(part):
            part = "<shard>"
        elif i > 0 and out[-1] == "d" and _HASH.match(part):
            part = "<hash>"
        elif i == len(parts) - 1 and _CHUNK.match(part):
            part = "<chunk>"
        elif i == 2:
            for pattern, folded in _ARRAY_FOLDERS:
                if pattern.match(part):
                    part = folded
                    break
        out.append(part)
    return "/".join(out)


def files(names: Iterable[str]) -> list[str]:
    """Sorted distinct normal-form names."""
    return sorted({normalize(name) for name in names})


def _fold_item(name: str, items: Iterable[str]) -> str:
    parts = name.split("/")
    if len(parts) >= 2 and parts[0].startswith("<step>"):
        item = parts[1].removesuffix(TMP)
        if item in items:
            parts[1] = "<item>" + (TMP if parts[1].endswith(TMP) else "")
    return "/".join(parts)


def _is_checkpoint_milestone(name: str) -> bool:
    parts = name.split("/")
    if parts[-1].startswith(".write_test_"):
        return True
    if not parts[0].startswith("<step>"):
        return False
    if len(parts) == 1:
        return True  # the step folder itself (mkdir, mv)
    if len(parts) == 2:
        return parts[1] in ("_CHECKPOINT_METADATA", "commit_success.txt") or parts[1].startswith("<item>")
    return len(parts) == 3 and parts[2] in ("_METADATA", "commit_success.txt")


def is_milestone_file(name: str) -> bool:
    """Whether a file (relative to a checkpoint root or an export folder) is a milestone."""
    parts = normalize(name).split("/")
    if len(parts) == 1:
        return True
    if not parts[0].startswith("<step>"):
        return False
    if len(parts) == 2:
        return parts[1] in ("_CHECKPOINT_METADATA", "commit_success.txt")
    return len(parts) == 3 and parts[2] in ("_METADATA", "commit_success.txt")


def checkpoint_order(events: Iterable[tuple[str, str]], items: Iterable[str]) -> list[str]:
    """The milestones of ``(kind, name)`` events (``+``, ``-``, ``mkdir``, ``mv``; names relative to
    the checkpoint root), in normal form."""
    items = tuple(items)
    order: list[str] = []
    for kind, name in events:
        folded = _fold_item(normalize(name), items)
        if not _is_checkpoint_milestone(folded):
            continue
        if kind == "mkdir" and not folded.endswith(TMP):
            continue  # a folder is a milestone only on a local disk: Orbax's temporary ones
        if kind == "mv" and not folded.split("/")[-1].startswith("<"):
            continue  # renamed into place: the step and its items
        milestone = f"{kind}{folded}" if kind in "+-" else f"{kind} {folded}"
        if not order or order[-1] != milestone:
            order.append(milestone)
    return order


def export_order(events: Iterable[tuple[str, str]]) -> list[str]:
    """The milestones of an export's ``(kind, name)`` events (names relative to the export folder)."""
    order: list[str] = []
    for kind, name in events:
        if "/" in name or kind != "+":
            continue
        folded = "<tokenizer>" if name in TOKENIZER_FILES else normalize(name)
        milestone = f"+{folded}"
        if not order or order[-1] != milestone:
            order.append(milestone)
    return order


# What an offline run adds to tokenizer_config.json (from_pretrained's own arguments, saved back)
OFFLINE_ARTIFACTS = ("is_local", "local_files_only")


def marker(read: Callable[[str], bytes], folder: str, location: str) -> str:
    """A commit marker's content, the folder it names (``location`` + ``folder``) written ``<folder>``."""
    text = read(f"{folder}/commit_success.txt").decode()
    return text.replace(f"{location.rstrip('/')}/{folder}", "<folder>")


def checkpoint_layout(
    names: Iterable[str],
    read: Callable[[str], bytes],
    events: Iterable[tuple[str, str]],
    step: int,
    items: tuple[str, ...],
    location: str,
) -> dict[str, Any]:
    """A committed checkpoint root in normal form: ``names`` and ``read`` relative to it, ``events``
    its writes, ``location`` where the program saw it (a ``gs://`` URI, or a folder)."""
    metadata = json.loads(read(f"{step}/_CHECKPOINT_METADATA"))
    return {
        "files": files(names),
        "order": checkpoint_order(events, items),
        "checkpoint_metadata": {
            "keys": sorted(metadata),
            "item_handlers": metadata["item_handlers"],
            "committed": isinstance(metadata["commit_timestamp_nsecs"], int),
        },
        "step_marker": marker(read, str(step), location),
        "item_markers": sorted({marker(read, f"{step}/{item}", location) for item in items}),
    }


def export_layout(
    names: Iterable[str], read: Callable[[str], bytes], events: Iterable[tuple[str, str]]
) -> dict[str, Any]:
    """A Hugging Face export folder in normal form (``names`` and ``read`` relative to it)."""
    tokenizer_config = json.loads(read("tokenizer_config.json"))
    return {
        "files": files(names),
        "order": export_order(events),
        "config": json.loads(read("config.json")),
        "tokenizer_config_keys": sorted(set(tokenizer_config) - set(OFFLINE_ARTIFACTS)),
    }


def load() -> dict[str, Any]:
    """The committed fixture."""
    return json.loads(FIXTURE.read_text())


def save(layouts: dict[str, Any]) -> None:
    """Write the fixture (sorted keys, one value a line where it helps a diff)."""
    FIXTURE.write_text(json.dumps(layouts, indent=1, sort_keys=True) + "\n")
