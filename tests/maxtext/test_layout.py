"""Layout rules over GCS listings: Orbax checkpoint steps and Hugging Face exports."""

from __future__ import annotations

import json
from collections.abc import Generator, Iterable
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_tpu_rl.maxtext.layout import (
    ListFolder,
    ProbeRequest,
    ReadObject,
    StepStatus,
    answer_probe,
    checkpoint_event_payload,
    checkpoint_steps,
    export_event_payload,
    hf_export_status,
    parse_gs_uri,
    probe_checkpoint,
    probe_hf_export,
)
from tools.maxtext_real.bucket import list_one_level

ROOT = "gemma4-26b/trained/rl/checkpoints/actor/"
_Result = TypeVar("_Result")


def step_objects(
    step: int | str,
    *,
    committed: bool,
    items: Iterable[str] = ("model_params", "optimizer_state"),
    uncommitted_items: Iterable[str] = (),
):
    """Objects Orbax writes for one step on GCS (non-OCDBT layout, a few array chunks per item):
    once committed, each item's ``commit_success.txt`` (but ``uncommitted_items``'), then the step's."""
    folder = f"{ROOT}{step}/"
    names = [f"{folder}_CHECKPOINT_METADATA"]
    for item in items:
        names += [
            f"{folder}{item}/_METADATA",
            f"{folder}{item}/_sharding",
            f"{folder}{item}/base.decoder.layers.mlp.wi_0.kernel.value/.zarray",
            f"{folder}{item}/base.decoder.layers.mlp.wi_0.kernel.value/0.0.0",
        ]
    if committed:
        names += [
            f"{folder}{item}/commit_success.txt" for item in items if item not in set(uncommitted_items)
        ]
        names.append(f"{folder}commit_success.txt")
    return names


def drive(
    probe: Generator[ProbeRequest, Any, _Result],
    all_names: list[str],
    blobs: dict[str, bytes] | None = None,
    requests: list[ProbeRequest] | None = None,
) -> _Result:
    """The probe answered from ``all_names`` (a GCS listing) and ``blobs``; each request kept in
    ``requests``."""

    def listing(prefix: str) -> list[str]:
        if requests is not None:
            requests.append(ListFolder(prefix))
        return list_one_level(all_names, prefix)

    def reading(name: str) -> bytes:
        if requests is not None:
            requests.append(ReadObject(name))
        return (blobs or {})[name]

    return answer_probe(probe, listing, reading)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("gs://bkt/a/b/", ("bkt", "a/b/")),
        ("gs://bkt/a/b", ("bkt", "a/b")),
        ("gs://bkt", ("bkt", "")),
        ("gs://bkt/", ("bkt", "")),
    ],
)
def test_parse_gs_uri(uri: str, expected: tuple[str, str]) -> None:
    assert parse_gs_uri(uri) == expected


@pytest.mark.parametrize("uri", ["s3://bkt/a", "bkt/a", "gs:///a", "/tmp/x"])
def test_parse_gs_uri_rejects_other_locations(uri: str) -> None:
    with pytest.raises(ValueError):
        parse_gs_uri(uri)


def test_committed_step_is_complete_uncommitted_and_tmp_steps_are_in_progress() -> None:
    names = [
        *step_objects(50, committed=True),
        *step_objects(100, committed=False),
        f"{ROOT}150.orbax-checkpoint-tmp-1724330000123/_CHECKPOINT_METADATA",
        f"{ROOT}150.orbax-checkpoint-tmp-1724330000123/model_params/_METADATA",
        f"{ROOT}../unrelated",
        "other/run/checkpoints/actor/200/commit_success.txt",
    ]

    states = checkpoint_steps(names, ROOT)

    assert {step: s.status for step, s in states.items()} == {
        50: StepStatus.COMPLETE,
        100: StepStatus.IN_PROGRESS,
        150: StepStatus.IN_PROGRESS,
    }
    assert states[100].missing == ("commit_success.txt",)
    assert [step for step, state in states.items() if state.is_complete] == [50]


def test_root_prefix_without_trailing_slash_and_partial_save_folder() -> None:
    names = [*step_objects(10, committed=True), f"{ROOT}20.partial_save/model_params/_METADATA"]

    states = checkpoint_steps(names, ROOT.rstrip("/"))

    assert states[10].is_complete
    assert states[20].status is StepStatus.IN_PROGRESS


def test_leftover_tmp_folder_does_not_hide_a_committed_step() -> None:
    names = [*step_objects(50, committed=True), f"{ROOT}50.orbax-checkpoint-tmp/model_params/_METADATA"]

    assert checkpoint_steps(names, ROOT)[50].is_complete


def test_committed_step_without_a_required_item() -> None:
    names = step_objects(50, committed=True, items=("model_params",))

    assert checkpoint_steps(names, ROOT, items=("model_params",))[50].is_complete
    state = checkpoint_steps(names, ROOT, items=("model_params", "optimizer_state"))[50]
    assert state.status is StepStatus.MISSING_ITEMS
    assert state.missing == ("optimizer_state/",)
    assert not state.is_complete


def test_marker_alone_is_not_enough() -> None:
    names = [f"{ROOT}50/commit_success.txt", f"{ROOT}50/_CHECKPOINT_METADATA"]

    assert checkpoint_steps(names, ROOT)[50].status is StepStatus.MISSING_ITEMS


def test_delimiter_listing_gives_the_same_verdict_as_a_recursive_one() -> None:
    recursive = [*step_objects(50, committed=True), *step_objects(100, committed=False)]
    root_level = list_one_level(recursive, ROOT)
    step_levels = list_one_level(recursive, f"{ROOT}50/") + list_one_level(recursive, f"{ROOT}100/")
    # each item of a committed step, for its own marker
    item_levels = list_one_level(recursive, f"{ROOT}50/model_params/")

    assert root_level == [f"{ROOT}100/", f"{ROOT}50/"]
    assert checkpoint_steps(root_level + step_levels + item_levels, ROOT) == checkpoint_steps(recursive, ROOT)


def test_converted_checkpoint_layout() -> None:
    root = "gemma4-26b/max-text-format/"
    names = [
        f"{root}0/_CHECKPOINT_METADATA",
        f"{root}0/items/_METADATA",
        f"{root}0/items/params.decoder.layers.0/0.0",
        f"{root}0/items/commit_success.txt",
        f"{root}0/commit_success.txt",
    ]

    assert checkpoint_steps(names, root, items=("items",))[0].is_complete
    assert checkpoint_steps(names[:-1], root, items=("items",))[0].status is StepStatus.IN_PROGRESS
    without_item_marker = [name for name in names if name != f"{root}0/items/commit_success.txt"]
    assert checkpoint_steps(without_item_marker, root, items=("items",))[0].missing == (
        "items/commit_success.txt",
    )
    state = checkpoint_steps(names, root, items=("items",))[0]
    assert checkpoint_event_payload("bkt", state, ("items",)) == {
        "status": "success",
        "uris": ["gs://bkt/gemma4-26b/max-text-format/0/items/"],
        "step": 0,
        "checkpoint_uri": "gs://bkt/gemma4-26b/max-text-format/0/items/",
    }


def test_probe_latest_lists_only_step_folders_newest_first() -> None:
    names = [
        *step_objects(10, committed=True),
        *step_objects(20, committed=True),
        *step_objects(30, committed=False),
    ]
    requests: list[ProbeRequest] = []

    result = drive(probe_checkpoint(ROOT, None, ("model_params",)), names, requests=requests)

    assert result.is_complete
    assert result.state is not None
    assert result.state.step == 20
    assert requests == [
        ListFolder(ROOT),
        ListFolder(f"{ROOT}30/"),
        ListFolder(f"{ROOT}20/"),
        ListFolder(f"{ROOT}20/model_params/"),
    ]
    payload = checkpoint_event_payload("bkt", result.state, ("model_params", "optimizer_state"))
    assert payload["uris"] == [f"gs://bkt/{ROOT}20/model_params/", f"gs://bkt/{ROOT}20/optimizer_state/"]
    assert payload["checkpoint_uri"] == f"gs://bkt/{ROOT}20/model_params/"


def test_probe_for_a_given_step() -> None:
    names = [*step_objects(10, committed=True), *step_objects(20, committed=False)]

    waiting = drive(probe_checkpoint(ROOT, 20, ("model_params",)), names)
    absent = drive(probe_checkpoint(ROOT, 50, ("model_params",)), names)
    done = drive(probe_checkpoint(ROOT, 10, ("model_params",)), names)

    assert not waiting.is_complete
    assert waiting.error is None
    assert waiting.state is not None
    assert waiting.state.status is StepStatus.IN_PROGRESS
    assert not absent.is_complete
    assert absent.state is None
    assert absent.error is None
    assert done.is_complete


def test_a_committed_step_whose_item_has_no_marker_never_completes() -> None:
    """Orbax writes each item's commit_success.txt before the step's, and its reader
    (``Checkpointer.restore`` -> ``is_path_finalized`` of the item folder) refuses an item without
    one: MaxText's to_huggingface fails with ``Found incomplete checkpoint at <item>``."""
    names = step_objects(50, committed=True, uncommitted_items=("model_params",))

    state = checkpoint_steps(names, ROOT, items=("model_params", "optimizer_state"))[50]
    assert state.status is StepStatus.MISSING_ITEMS
    assert state.missing == ("model_params/commit_success.txt",)
    assert checkpoint_steps(names, ROOT, items=("optimizer_state",))[50].is_complete
    result = drive(probe_checkpoint(ROOT, 50, ("model_params",)), names)
    assert not result.is_complete
    assert result.error is not None
    assert "model_params/commit_success.txt" in result.error
    latest = drive(
        probe_checkpoint(ROOT, None, ("model_params",)), [*step_objects(40, committed=True), *names]
    )
    assert latest.state is not None
    assert latest.state.step == 40


def test_the_probe_lists_each_item_of_a_committed_step_once() -> None:
    names = step_objects(50, committed=True)
    requests: list[ProbeRequest] = []

    result = drive(probe_checkpoint(ROOT, 50, ("model_params", "optimizer_state")), names, requests=requests)

    assert result.is_complete
    assert requests == [
        ListFolder(ROOT),
        ListFolder(f"{ROOT}50/"),
        ListFolder(f"{ROOT}50/model_params/"),
        ListFolder(f"{ROOT}50/optimizer_state/"),
    ]


def test_probe_reports_an_error_for_a_committed_step_missing_an_item() -> None:
    names = step_objects(50, committed=True, items=("model_params",))

    result = drive(probe_checkpoint(ROOT, 50, ("model_params", "optimizer_state")), names)

    assert not result.is_complete
    assert result.error is not None
    assert "optimizer_state/" in result.error


@given(
    st.dictionaries(
        keys=st.integers(min_value=0, max_value=500),
        # (committed, has model_params, model_params lost its own marker)
        values=st.tuples(st.booleans(), st.booleans(), st.booleans()),
        max_size=8,
    )
)
def test_latest_complete_step_property(steps: dict[int, tuple[bool, bool, bool]]) -> None:
    names: list[str] = []
    for step, (committed, has_params, lost_marker) in steps.items():
        items = ("model_params",) if has_params else ()
        names += step_objects(
            step, committed=committed, items=items, uncommitted_items=items if lost_marker else ()
        )
    expected = max((s for s, (c, p, lost) in steps.items() if c and p and not lost), default=None)

    complete = [step for step, state in checkpoint_steps(names, ROOT).items() if state.is_complete]
    assert max(complete, default=None) == expected
    result = drive(probe_checkpoint(ROOT, None, ("model_params",)), names)
    assert (result.state.step if result.is_complete and result.state else None) == expected


# --- Hugging Face exports -------------------------------------------------------------------------

EXPORT = "gemma4-26b/hf-trained/"
TOKENIZER = ["tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "chat_template.jinja"]
WEIGHT_MAP = {
    "model.embed_tokens.weight": "model-00001-of-00003.safetensors",
    "model.layers.0.mlp.gate_proj.weight": "model-00002-of-00003.safetensors",
    "lm_head.weight": "model-00003-of-00003.safetensors",
}
INDEX = {"metadata": {"total_size": 123}, "weight_map": WEIGHT_MAP}
SHARDS = sorted(set(WEIGHT_MAP.values()))


def export_names(*files: str) -> list[str]:
    return [EXPORT + f for f in files]


def test_sharded_export_complete() -> None:
    names = export_names("config.json", *SHARDS, "model.safetensors.index.json", *TOKENIZER)

    status = hf_export_status(names, INDEX, EXPORT)

    assert status.complete
    assert status.missing == ()
    assert status.weight_files == tuple(SHARDS)
    payload = export_event_payload("bkt", EXPORT, status)
    assert payload["export_uri"] == f"gs://bkt/{EXPORT}"
    assert f"gs://bkt/{EXPORT}config.json" in payload["uris"]


def test_missing_shard_is_reported() -> None:
    names = export_names("config.json", SHARDS[0], SHARDS[2], "model.safetensors.index.json", *TOKENIZER)

    status = hf_export_status(names, INDEX, EXPORT)

    assert not status.complete
    assert status.missing == ("model-00002-of-00003.safetensors",)


def test_shards_uploaded_but_index_not_yet() -> None:
    names = export_names("config.json", SHARDS[0], SHARDS[1], *TOKENIZER)

    status = hf_export_status(names, None, EXPORT)

    assert not status.complete
    assert status.missing == ("model.safetensors.index.json", "model-00003-of-00003.safetensors")


def test_single_file_export_and_missing_tokenizer_and_config() -> None:
    complete = hf_export_status(export_names("config.json", "model.safetensors", *TOKENIZER), None, EXPORT)
    bare = hf_export_status(export_names("model.safetensors"), None, EXPORT)
    empty = hf_export_status([], None, EXPORT)

    assert complete.complete
    assert complete.weight_files == ("model.safetensors",)
    assert bare.missing == (
        "config.json",
        "tokenizer_config.json",
        "tokenizer.json or tokenizer.model or vocab.json",
    )
    assert "model.safetensors or model.safetensors.index.json" in empty.missing


def test_sentencepiece_tokenizer_counts_and_nested_files_are_ignored() -> None:
    names = export_names("config.json", "model.safetensors", "tokenizer_config.json", "tokenizer.model")
    names.append(EXPORT + "sub/config.json")

    assert hf_export_status(names, None, EXPORT).complete
    assert not hf_export_status([EXPORT + "sub/config.json"], None, EXPORT).complete


def test_index_listed_but_not_read_is_not_complete() -> None:
    names = export_names("config.json", *SHARDS, "model.safetensors.index.json", *TOKENIZER)

    status = hf_export_status(names, None, EXPORT)

    assert not status.complete
    assert status.missing == ("model.safetensors.index.json (not read)",)


def test_probe_hf_export_reads_the_index() -> None:
    names = export_names("config.json", *SHARDS, "model.safetensors.index.json", *TOKENIZER)
    blobs = {EXPORT + "model.safetensors.index.json": json.dumps(INDEX).encode()}
    requests: list[ProbeRequest] = []

    result = drive(probe_hf_export(EXPORT.rstrip("/")), names, blobs, requests)

    assert result.status.complete
    assert result.error is None
    assert requests == [ListFolder(EXPORT), ReadObject(EXPORT + "model.safetensors.index.json")]


def test_probe_hf_export_with_a_broken_index() -> None:
    names = export_names("config.json", *SHARDS, "model.safetensors.index.json", *TOKENIZER)
    blobs = {EXPORT + "model.safetensors.index.json": b"{not json"}

    result = drive(probe_hf_export(EXPORT), names, blobs)

    assert not result.status.complete
    assert result.error is not None
    assert "not JSON" in result.error


def test_the_export_check_with_the_card_needs_its_readme() -> None:
    from airflow_provider_tpu_rl.maxtext.layout import hf_export_status

    names = [
        f"exp/{n}" for n in ("config.json", "model.safetensors", "tokenizer_config.json", "tokenizer.json")
    ]
    assert hf_export_status(names, None, "exp/").complete
    without = hf_export_status(names, None, "exp/", with_card=True)
    assert not without.complete
    assert without.missing == ("README.md",)
    assert hf_export_status([*names, "exp/README.md"], None, "exp/", with_card=True).complete
