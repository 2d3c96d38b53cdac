"""Rules over GCS object listings: is a MaxText/Orbax checkpoint step, or a Hugging Face export, complete?

Object names are relative to the bucket, as GCS lists them. A listing may be recursive (every object)
or made with ``delimiter="/"``, where a sub-folder shows up as a name ending in ``/``; both work.

Checkpoints (checked at the source: MaxText ``maxtext-v0.2.3``/``v0.2.4``, tunix 0.1.7, Orbax
0.12.0/0.12.2, and against what they write: ``make test-maxtext``)

* The RL trainer saves through tunix's ``CheckpointManager`` (Orbax's) to
  ``<base_output_directory>/<run_name>/checkpoints/actor/<step>/{model_params,optimizer_state}/``.
* ``to_maxtext`` saves step 0 with the single item ``items``: ``<base_output_directory>/0/items/``.
* On GCS Orbax picks ``CommitFileTemporaryPath`` for the step and for each item
  (``_src/path/atomicity_defaults.py``): it writes straight into ``<step>/`` (first
  ``<step>/_CHECKPOINT_METADATA``) and, once every host has finished, writes each item's
  ``<step>/<item>/commit_success.txt``, then ``<step>/commit_success.txt`` (``finalize``,
  ``_src/path/atomicity.py``). A step folder without its marker is still being written (or the save
  died). A reader checks the item's own marker: ``Checkpointer.restore`` of ``<step>/<item>``, which
  MaxText's converters and trainer run, raises ``Found incomplete checkpoint`` without it
  (``is_path_finalized``), so a committed step whose item lost its marker (a partial copy, a
  deletion) is never usable. Elsewhere Orbax writes ``<step>.orbax-checkpoint-tmp/`` (each item in
  ``<item>.orbax-checkpoint-tmp/`` inside; Orbax releases before 0.12 appended ``-<timestamp>``)
  and renames it at the end; v1 partial saves use ``<step>.partial_save/``. Such folders are saves
  in progress.

Hugging Face exports (``to_huggingface``, ``checkpoint_conversion/utils/utils.py``
``save_model_files``) upload, in this order: the tokenizer's files (``chat_template.jinja``,
``tokenizer_config.json``, ``tokenizer.json``), ``config.json``, the weight shards
(``model-0000i-of-0000N.safetensors``, in parallel) and last ``model.safetensors.index.json``; a
model whose tensors fit in one 3 GiB shard gets a single ``model.safetensors`` and no index.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

COMMIT_SUCCESS_FILE = "commit_success.txt"
ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp"
PARTIAL_SAVE_SUFFIX = ".partial_save"

RL_CHECKPOINT_ITEMS: tuple[str, ...] = ("model_params",)
CONVERTED_CHECKPOINT_ITEMS: tuple[str, ...] = ("items",)
CONVERTED_CHECKPOINT_STEP = 0

HF_CONFIG_FILE = "config.json"
HF_SINGLE_WEIGHTS_FILE = "model.safetensors"
HF_INDEX_FILE = "model.safetensors.index.json"
HF_TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# the model card the provider writes beside an export (ledger/model_card.py), checked by promote_model
HF_MODEL_CARD_FILE = "README.md"
# ``save_pretrained`` writes one of these depending on the tokenizer class (fast / sentencepiece / BPE).
HF_TOKENIZER_VOCAB_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer.model", "vocab.json")

_STEP_DIR_RE = re.compile(r"^(?P<step>\d+)$")
_IN_PROGRESS_DIR_RE = re.compile(
    rf"^(?P<step>\d+)(?:{re.escape(ORBAX_TMP_SUFFIX)}.*|{re.escape(PARTIAL_SAVE_SUFFIX)})$"
)
_SHARD_RE = re.compile(r"^model-(?P<index>\d+)-of-(?P<count>\d+)\.safetensors$")


def parse_gs_uri(uri: str) -> tuple[str, str]:
    """Split ``gs://bucket/some/prefix`` into ``("bucket", "some/prefix")``."""
    if not uri.startswith("gs://"):
        raise ValueError(f"Not a gs:// URI: {uri!r}")
    bucket, _, prefix = uri[len("gs://") :].partition("/")
    if not bucket:
        raise ValueError(f"No bucket in {uri!r}")
    return bucket, prefix


def as_folder(prefix: str) -> str:
    """``a/b`` -> ``a/b/`` (the empty prefix, the bucket root, stays empty)."""
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def gs_uri(bucket: str, name: str) -> str:
    """``gs://bucket/name``."""
    return f"gs://{bucket}/{name}"


class StepStatus(enum.StrEnum):
    """What the listing says about one checkpoint step."""

    COMPLETE = "complete"
    IN_PROGRESS = "in_progress"
    # Committed by Orbax, but without one of the items asked for, or with an item that lacks its own
    # commit marker (Orbax writes those before the step's; its reader refuses such an item): it will
    # never appear.
    MISSING_ITEMS = "missing_items"


@dataclass(frozen=True)
class StepState:
    """One step of a checkpoint root and why it is (not) usable."""

    step: int
    status: StepStatus
    folder: str
    missing: tuple[str, ...] = ()

    @property
    def is_complete(self) -> bool:
        return self.status is StepStatus.COMPLETE


@dataclass
class _StepFolder:
    name: str
    committed: bool = False
    items: set[str] = field(default_factory=set)
    committed_items: set[str] = field(default_factory=set)


def _scan_steps(
    object_names: Iterable[str], root_prefix: str
) -> tuple[dict[int, _StepFolder], dict[int, list[str]]]:
    """Group names under ``root_prefix`` into final step folders and in-progress folders by step."""
    root = as_folder(root_prefix)
    finals: dict[int, _StepFolder] = {}
    in_progress: dict[int, list[str]] = {}
    for name in object_names:
        if not name.startswith(root):
            continue
        folder, sep, rest = name[len(root) :].partition("/")
        if not sep:
            continue  # a file at the root itself
        if match := _STEP_DIR_RE.match(folder):
            step_folder = finals.setdefault(int(match["step"]), _StepFolder(name=root + folder + "/"))
            if rest == COMMIT_SUCCESS_FILE:
                step_folder.committed = True
            item, item_sep, item_rest = rest.partition("/")
            if item and item_sep:
                step_folder.items.add(item)
                if item_rest == COMMIT_SUCCESS_FILE:
                    step_folder.committed_items.add(item)
        elif match := _IN_PROGRESS_DIR_RE.match(folder):
            in_progress.setdefault(int(match["step"]), []).append(root + folder + "/")
    return finals, in_progress


def checkpoint_steps(
    object_names: Iterable[str], root_prefix: str, items: Sequence[str] = RL_CHECKPOINT_ITEMS
) -> dict[int, StepState]:
    """Every step found under ``root_prefix`` and its state, for the given required ``items``."""
    finals, in_progress = _scan_steps(object_names, root_prefix)
    root = as_folder(root_prefix)
    states: dict[int, StepState] = {}
    for step in sorted({*finals, *in_progress}):
        folder = finals.get(step)
        if folder is None or not folder.committed:
            missing = (COMMIT_SUCCESS_FILE,)
            states[step] = StepState(step, StepStatus.IN_PROGRESS, f"{root}{step}/", missing)
            continue
        missing_items = tuple(
            f"{item}/" if item not in folder.items else f"{item}/{COMMIT_SUCCESS_FILE}"
            for item in items
            if item not in folder.committed_items
        )
        status = StepStatus.MISSING_ITEMS if missing_items else StepStatus.COMPLETE
        states[step] = StepState(step, status, folder.name, missing_items)
    return states


def step_item_uris(bucket: str, state: StepState, items: Sequence[str]) -> list[str]:
    """``gs://`` folder URIs of ``items`` in a step, in the order asked for."""
    return [gs_uri(bucket, f"{state.folder}{item}/") for item in items]


@dataclass(frozen=True)
class ExportStatus:
    """Whether a Hugging Face export folder is complete, and what is still missing."""

    complete: bool
    missing: tuple[str, ...]
    files: tuple[str, ...]
    weight_files: tuple[str, ...]


def _top_level_files(object_names: Iterable[str], prefix: str) -> set[str]:
    folder = as_folder(prefix)
    files = set()
    for name in object_names:
        if name.startswith(folder):
            relative = name[len(folder) :]
            if relative and "/" not in relative:
                files.add(relative)
    return files


def _expected_weight_files(
    files: set[str], index_json: Mapping[str, Any] | None
) -> tuple[set[str], list[str]]:
    """Weight files the export must hold, and what is missing to know or to have them."""
    if index_json is not None:
        weight_map = index_json.get("weight_map")
        if not isinstance(weight_map, Mapping) or not weight_map:
            return set(), [f"{HF_INDEX_FILE} (no weight_map)"]
        expected = {str(shard) for shard in weight_map.values()}
        return expected, sorted(expected - files)
    if HF_INDEX_FILE in files:
        return set(), [f"{HF_INDEX_FILE} (not read)"]
    if HF_SINGLE_WEIGHTS_FILE in files:
        return {HF_SINGLE_WEIGHTS_FILE}, []
    shard_counts = {int(m["count"]) for f in files if (m := _SHARD_RE.match(f))}
    missing = [HF_INDEX_FILE]
    for count in sorted(shard_counts):
        names = {f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)}
        missing.extend(sorted(names - files))
    if not shard_counts:
        missing = [f"{HF_SINGLE_WEIGHTS_FILE} or {HF_INDEX_FILE}"]
    return set(), missing


def hf_export_status(
    object_names: Iterable[str], index_json: Mapping[str, Any] | None, prefix: str, *, with_card: bool = False
) -> ExportStatus:
    """Judge the export folder ``prefix`` from its listing and, when listed, its parsed index json.

    Complete when ``config.json``, every shard the index's ``weight_map`` names (or a single
    ``model.safetensors``), ``tokenizer_config.json`` and a tokenizer vocabulary file all exist;
    ``with_card``: and the provider's model card ``README.md`` (written once the export is whole).
    """
    files = _top_level_files(object_names, prefix)
    missing: list[str] = []
    if with_card and HF_MODEL_CARD_FILE not in files:
        missing.append(HF_MODEL_CARD_FILE)
    if HF_CONFIG_FILE not in files:
        missing.append(HF_CONFIG_FILE)
    expected_weights, missing_weights = _expected_weight_files(files, index_json)
    missing.extend(missing_weights)
    if HF_TOKENIZER_CONFIG_FILE not in files:
        missing.append(HF_TOKENIZER_CONFIG_FILE)
    if not files.intersection(HF_TOKENIZER_VOCAB_FILES):
        missing.append(" or ".join(HF_TOKENIZER_VOCAB_FILES))
    weight_files = tuple(sorted(expected_weights & files))
    return ExportStatus(
        complete=not missing, missing=tuple(missing), files=tuple(sorted(files)), weight_files=weight_files
    )


# --- Probes: the polling algorithm, shared by the sync sensor and the async trigger. -------------
#
# A probe is a generator that yields requests (list one folder level / read one object) and receives
# the answers; the caller owns the I/O. The probe returns its verdict via StopIteration.value.


@dataclass(frozen=True)
class ListFolder:
    """Request: names directly under ``prefix`` (objects, and sub-folders ending in ``/``)."""

    prefix: str


@dataclass(frozen=True)
class ReadObject:
    """Request: the bytes of object ``name``."""

    name: str


ProbeRequest = ListFolder | ReadObject
_Verdict = TypeVar("_Verdict")


def answer_probe(
    probe: Generator[ProbeRequest, Any, _Verdict],
    list_folder: Callable[[str], Any],
    read_object: Callable[[str], bytes],
) -> _Verdict:
    """Run a probe to its verdict, answering each request with ``list_folder(prefix)`` or
    ``read_object(name)`` (the caller's I/O: a GCS hook, a local folder)."""
    answer: Any = None
    while True:
        try:
            request = probe.send(answer)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        if isinstance(request, ListFolder):
            answer = list_folder(request.prefix)
        elif isinstance(request, ReadObject):
            answer = read_object(request.name)
        else:  # pragma: no cover - the probes only make the two requests above
            raise TypeError(f"Unknown probe request {request!r}")


@dataclass(frozen=True)
class CheckpointProbeResult:
    """Verdict of one checkpoint poll."""

    state: StepState | None
    states: dict[int, StepState]
    error: str | None = None

    @property
    def is_complete(self) -> bool:
        return self.state is not None and self.state.is_complete


def probe_checkpoint(
    root_prefix: str, step: int | None, items: Sequence[str]
) -> Generator[ProbeRequest, Any, CheckpointProbeResult]:
    """One poll of a checkpoint root: the given ``step``, or the latest complete one when None.

    Lists the root one level deep, then each candidate step folder (newest first) one level deep and,
    when it is committed and holds the items, each of them one level deep (for its own marker), so
    a large non-OCDBT checkpoint is never listed object by object.
    """
    root = as_folder(root_prefix)
    root_names: list[str] = yield ListFolder(root)
    finals, _ = _scan_steps(root_names, root)
    seen: list[str] = list(root_names)
    candidates = sorted(finals, reverse=True) if step is None else [s for s in finals if s == step]
    for candidate in candidates:
        folder = finals[candidate].name
        step_names: list[str] = yield ListFolder(folder)
        seen.extend(step_names)
        listed = _scan_steps(step_names, root)[0].get(candidate)
        if listed is not None and listed.committed and all(item in listed.items for item in items):
            for item in items:
                item_names: list[str] = yield ListFolder(f"{folder}{item}/")
                seen.extend(item_names)
        states = checkpoint_steps(seen, root, items)
        state = states[candidate]
        if state.is_complete:
            return CheckpointProbeResult(state=state, states=states)
        if step is not None:
            error = None
            if state.status is StepStatus.MISSING_ITEMS:
                error = (
                    f"Checkpoint step {step} under {root} is committed but has no "
                    f"{', '.join(state.missing)}; it will never appear."
                )
            return CheckpointProbeResult(state=state, states=states, error=error)
    states = checkpoint_steps(seen, root, items)
    return CheckpointProbeResult(state=states.get(step) if step is not None else None, states=states)


@dataclass(frozen=True)
class ExportProbeResult:
    """Verdict of one Hugging Face export poll."""

    status: ExportStatus
    error: str | None = None


def probe_hf_export(
    prefix: str, *, with_card: bool = False
) -> Generator[ProbeRequest, Any, ExportProbeResult]:
    """One poll of a Hugging Face export folder (lists it, reads the index json when present);
    ``with_card``: the model card must be there too."""
    folder = as_folder(prefix)
    names: list[str] = yield ListFolder(folder)
    index_json: dict[str, Any] | None = None
    if folder + HF_INDEX_FILE in names:
        raw: bytes = yield ReadObject(folder + HF_INDEX_FILE)
        try:
            parsed = json.loads(raw)
        except ValueError as err:
            status = hf_export_status(names, None, folder, with_card=with_card)
            return ExportProbeResult(status=status, error=f"{folder}{HF_INDEX_FILE} is not JSON: {err}")
        index_json = parsed if isinstance(parsed, dict) else {}
    return ExportProbeResult(status=hf_export_status(names, index_json, folder, with_card=with_card))


def checkpoint_event_payload(bucket: str, state: StepState, items: Sequence[str]) -> dict[str, Any]:
    """The success payload shared by the trigger event and the sensor's XCom."""
    uris = step_item_uris(bucket, state, items)
    return {"status": "success", "uris": uris, "step": state.step, "checkpoint_uri": uris[0]}


def export_event_payload(bucket: str, prefix: str, status: ExportStatus) -> dict[str, Any]:
    """The success payload for a complete Hugging Face export."""
    folder = as_folder(prefix)
    return {
        "status": "success",
        "export_uri": gs_uri(bucket, folder),
        "uris": [gs_uri(bucket, folder + name) for name in status.files],
        "weight_files": list(status.weight_files),
    }


def run_dir(uri: str) -> str:
    """A run directory's URI in one spelling (one trailing ``/``), so two spellings compare equal."""
    return uri.rstrip("/") + "/"


# Where the provider records who writes each run directory (records/run_dirs.py), in the run's bucket.
RUN_DIR_PREFIX: Final = "tpu-rl/run-dirs/"


def run_record_object(directory: str) -> str:
    """The object recording who wrote ``directory`` (one per run directory, in the run's bucket)."""
    return f"{RUN_DIR_PREFIX}{hashlib.sha256(run_dir(directory).encode()).hexdigest()[:24]}.json"
