"""The provider's Airflow assets: a trained model per preset, and a converted checkpoint per preset.

A downstream DAG schedules on a model's stable asset (``tpu-rl://models/<preset>``, the same on
every bucket and run): ``schedule=model_asset("qwen3-30b-a3b")``; a DAG that needs the MaxText
checkpoint a conversion made schedules on ``converted_checkpoint_asset(preset)``
(``tpu-rl://converted-checkpoints/<preset>``), whose event's ``extra`` names the checkpoint's
``gs://`` folder. The pipelines emit the model's event from one ``publish_<preset>`` task per preset
(a static outlet; the run's preset emits, the others skip), and the checkpoint's from one
``publish_converted_<preset>`` each, with the ``extra`` the conversion left in XCom
(:data:`CONVERTED_EVENT_KEY`). An operator emits into its ``outlets``
(:func:`emit_asset_events`): a plain asset gets the event's ``extra``, an alias gets the stable
asset added with it. ``Asset``/``AssetAlias`` come through common.compat: Airflow 3's assets,
Airflow 2.11's datasets. The ``extra`` is flat (Airflow 2.11 groups alias events by
``frozenset(extra.items())``): numbers, strings, booleans and None only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final

from airflow.providers.common.compat.sdk import Asset, AssetAlias

log = logging.getLogger(__name__)

MODEL_ASSET_SCHEME: Final = "tpu-rl"
MODELS_ALIAS: Final = "tpu-rl-models"
# The XCom key under which a conversion task leaves its converted checkpoint's event ``extra``.
CONVERTED_EVENT_KEY: Final = "converted_checkpoint_event"

Scalar = str | int | float | bool | None


def model_asset_uri(model: str) -> str:
    """``tpu-rl://models/<preset>``: the stable asset of a model preset's promoted exports."""
    return f"{MODEL_ASSET_SCHEME}://models/{model}"


def model_asset(model: str) -> Asset:
    """The asset a downstream DAG schedules on to run when a good ``model`` lands."""
    return Asset(model_asset_uri(model))


def models_alias() -> AssetAlias:
    """The alias the pipelines' ``promote_model`` resolves to the run's model asset."""
    return AssetAlias(MODELS_ALIAS)


def converted_checkpoint_asset_uri(model: str) -> str:
    """``tpu-rl://converted-checkpoints/<preset>``: the stable asset of a preset's converted checkpoints."""
    return f"{MODEL_ASSET_SCHEME}://converted-checkpoints/{model}"


def converted_checkpoint_asset(model: str) -> Asset:
    """The asset a DAG schedules on to run when ``model``'s converted MaxText checkpoint is complete."""
    return Asset(converted_checkpoint_asset_uri(model))


def flat_extra(extra: Mapping[str, Any]) -> dict[str, Scalar]:
    """``extra`` checked flat and JSON-native (what both Airflow lines store for an alias event)."""
    flat: dict[str, Scalar] = {}
    for key, value in extra.items():
        if value is not None and not isinstance(value, str | int | float | bool):
            raise TypeError(
                f"asset event extra {key!r} must be a string, number, boolean or null, got {value!r}"
            )
        flat[str(key)] = value
    return flat


def emit_asset_events(
    context: Mapping[str, Any], outlets: Iterable[Any], uri: str, extra: Mapping[str, Any]
) -> list[str]:
    """Give the task's outlet events their ``extra``: each alias gets ``Asset(uri)`` added with it,
    each plain asset gets it as its own event's extra. Returns what was emitted, one line each.

    Called from the method that ends the task successfully (``execute`` or ``execute_complete``); a
    task that then skips or fails emits nothing on either Airflow line.
    """
    flat = flat_extra(extra)
    events = context.get("outlet_events")
    outlets = list(outlets or ())
    if events is None:
        if outlets:
            log.warning("the task's context has no outlet_events: no asset event for %s", uri)
        return []
    emitted: list[str] = []
    for outlet in outlets:
        if isinstance(outlet, AssetAlias):
            events[outlet].add(Asset(uri), extra=dict(flat))
            emitted.append(f"{uri} (through alias {outlet.name})")
        elif isinstance(outlet, Asset):
            events[outlet].extra.update(flat)
            emitted.append(str(outlet.uri))
    return emitted


def leave_converted_event(context: Mapping[str, Any], extra: Mapping[str, Any]) -> None:
    """Leave a converted checkpoint's event ``extra`` in XCom (:data:`CONVERTED_EVENT_KEY`) for the
    pipelines' ``publish_converted_<preset>`` tasks."""
    ti = context.get("ti")
    if ti is not None:
        ti.xcom_push(key=CONVERTED_EVENT_KEY, value=flat_extra(extra))


def triggering_extras(context: Mapping[str, Any], assets: Iterable[Asset]) -> list[dict[str, Any]]:
    """The ``extra`` of every event of ``assets`` that triggered this DAG run, oldest first.

    Airflow 3 keeps them in ``triggering_asset_events`` (keyed by the asset), Airflow 2.11 in
    ``triggering_dataset_events`` (keyed by the dataset's URI). A run consumes every event since
    the previous one, so there may be more than one.
    """
    found: list[tuple[Any, dict[str, Any]]] = []
    if "triggering_asset_events" in context:
        events = context["triggering_asset_events"]
        for asset in assets:
            try:
                these = list(events[asset])
            except KeyError:
                continue
            found.extend((event.timestamp, dict(event.extra or {})) for event in these)
    else:
        by_uri = context.get("triggering_dataset_events") or {}
        for asset in assets:
            found.extend((event.timestamp, dict(event.extra or {})) for event in by_uri.get(asset.uri, []))
    found.sort(key=lambda pair: str(pair[0]))
    return [extra for _, extra in found]
