"""Sensors that wait for a MaxText checkpoint step, or a Hugging Face export, to be complete on GCS.

Poke mode lists with the google provider's ``GCSHook``; deferrable mode (``deferrable=True``; the
default is ``[operators] default_deferrable``, as for the job operators) checks once, then hands
over to the triggers in :mod:`airflow_provider_tpu_rl.triggers.gcs_checkpoint`.
Both judge the listings with the same rules (:mod:`airflow_provider_tpu_rl.maxtext.layout`) and
return the same XCom: ``{"status": "success", "uris": [...], "step": N, "checkpoint_uri": "gs://…/N/model_params/"}``
for a checkpoint, ``{"status": "success", "export_uri": …, "uris": [...], "weight_files": [...]}``
for an export.

Nothing heavier than the sensor base class is imported with this module: the google provider's GCS
hook (and the storage client under it) is imported when a sensor first pokes, not when a DAG file is
parsed.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from airflow.providers.common.compat.sdk import BaseSensorOperator, PokeReturnValue

from airflow_provider_tpu_rl.compat import AirflowException, AirflowFailException, default_deferrable
from airflow_provider_tpu_rl.exceptions import ConfigurationError
from airflow_provider_tpu_rl.links import GCSBrowserLink
from airflow_provider_tpu_rl.maxtext.layout import (
    COMMIT_SUCCESS_FILE,
    RL_CHECKPOINT_ITEMS,
    ProbeRequest,
    answer_probe,
    as_folder,
    checkpoint_event_payload,
    export_event_payload,
    parse_gs_uri,
    probe_checkpoint,
    probe_hf_export,
)
from airflow_provider_tpu_rl.triggers.gcs_checkpoint import HuggingFaceExportTrigger, MaxTextCheckpointTrigger

if TYPE_CHECKING:
    from airflow.providers.common.compat.sdk import Context
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

_Result = TypeVar("_Result")


def list_folder(hook: GCSHook, bucket: str, prefix: str) -> list[str]:
    """Objects directly under ``prefix`` and its sub-folders (names ending in ``/``).

    ``GCSHook.list(delimiter="/")`` drops the objects of a level that also has sub-folders, so this
    pages through the hook's storage client directly.
    """
    blobs = hook.get_conn().list_blobs(bucket, prefix=prefix, delimiter="/")
    names: list[str] = []
    folders: set[str] = set()
    for page in blobs.pages:
        names.extend(blob.name for blob in page)
        folders.update(page.prefixes)
    return names + sorted(folders)


def run_probe_sync(hook: GCSHook, bucket: str, probe: Generator[ProbeRequest, Any, _Result]) -> _Result:
    """Answer a layout probe's list/read requests through ``hook`` and return its verdict."""
    return answer_probe(
        probe,
        lambda prefix: list_folder(hook, bucket, prefix),
        lambda name: hook.download(bucket_name=bucket, object_name=name),
    )


def _step_from_template(step: int | str | None) -> int | None:
    """A rendered ``step``: ints pass, ``"50"`` becomes 50, ``""``/``"None"`` mean the latest step."""
    if step is None or isinstance(step, int):
        return step
    text = str(step).strip()
    if text in ("", "None", "none", "latest"):
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigurationError(f"step must be an integer or None, got {step!r}") from None


def watched_uri(field: str, uri: str | None, bucket: str | None, prefix: str | None) -> str:
    """``gs://`` folder a sensor watches: ``uri``, or ``bucket`` and ``prefix`` (not both forms)."""
    if uri and bucket:
        raise ConfigurationError(f"give either {field} or bucket (and prefix), not both")
    if uri:
        return str(uri)
    if not bucket:
        raise ConfigurationError(f"{field} or bucket is required")
    return f"gs://{str(bucket).removeprefix('gs://').strip('/')}/{str(prefix or '').lstrip('/')}"


def _folder_name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def describe_checkpoint(event: dict[str, Any]) -> str:
    """What a checkpoint sensor found, in one line (from its success payload)."""
    uris = [str(uri) for uri in event.get("uris") or []]
    items = ", ".join(_folder_name(uri) + "/" for uri in uris) or "none"
    step_folder = str(event.get("checkpoint_uri") or "").rstrip("/").rsplit("/", 1)[0] + "/"
    return (
        f"Found checkpoint step {event.get('step')} at {step_folder}: commit marker "
        f"{COMMIT_SUCCESS_FILE} present; items {items} ({len(uris)} item folder(s))"
    )


def describe_export(event: dict[str, Any]) -> str:
    """What the export sensor found, in one line (from its success payload)."""
    uris = [str(uri) for uri in event.get("uris") or []]
    weights = list(event.get("weight_files") or [])
    others = sorted(_folder_name(uri) for uri in uris if _folder_name(uri) not in set(weights))
    return (
        f"Found a complete Hugging Face export at {event.get('export_uri')}: {len(uris)} objects, "
        f"{len(weights)} weight file(s), and {', '.join(others) or 'no other file'}"
    )


class _DeferrableGCSSensor(BaseSensorOperator):
    """Shared arguments and execute/execute_complete of the two sensors: the folder they watch is
    their ``uri_field`` (``checkpoint_root``, ``export_uri``), or ``bucket`` and ``prefix``.

    :param bucket: instead of the ``uri_field``: the bucket (without ``gs://``) ...
    :param prefix: ... and the folder in it.
    :param project_id: project of the bucket (for the console link).
    :param gcp_conn_id: Google Cloud connection.
    :param impersonation_chain: optional service account(s) to impersonate.
    :param deferrable: wait in the triggerer instead of occupying a worker slot (default
        ``[operators] default_deferrable``, as the job operators and the google provider).
    :param poke_interval: seconds between polls.
    """

    operator_extra_links = (GCSBrowserLink(),)
    ui_color = "#e8f0fe"
    uri_field: ClassVar[str]
    # The fields both sensors template, after their own.
    shared_template_fields: ClassVar[tuple[str, ...]] = (
        "bucket",
        "prefix",
        "project_id",
        "gcp_conn_id",
        "impersonation_chain",
    )

    def __init__(
        self,
        *,
        bucket: str | None = None,
        prefix: str | None = None,
        project_id: str | None = None,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | Sequence[str] | None = None,
        deferrable: bool | None = None,
        poke_interval: float = 60,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.bucket = bucket
        self.prefix = prefix
        self.project_id = project_id
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self.deferrable = default_deferrable() if deferrable is None else deferrable

    def _watched_uri(self) -> str:
        return watched_uri(self.uri_field, getattr(self, self.uri_field), self.bucket, self.prefix)

    def _trigger(self) -> MaxTextCheckpointTrigger | HuggingFaceExportTrigger:
        raise NotImplementedError

    def describe(self, event: dict[str, Any]) -> str:
        """What the sensor found, in one line, from its success payload."""
        raise NotImplementedError

    def _found(self, event: dict[str, Any]) -> PokeReturnValue:
        self.log.info("%s", self.describe(event))
        return PokeReturnValue(is_done=True, xcom_value=event)

    def _hook(self) -> GCSHook:
        from airflow_provider_tpu_rl.hooks.credentials import gcs_hook

        return gcs_hook(self.gcp_conn_id, self.impersonation_chain or None)

    def execute(self, context: Context) -> Any:
        """Poke once (or in a worker loop when not deferrable), then defer to the trigger.

        A :class:`ConfigurationError` (a bad ``step``, ``items`` or location) fails the task without
        retries.
        """
        try:
            return self._execute(context)
        except ConfigurationError as err:
            raise AirflowFailException(str(err)) from err

    def _execute(self, context: Context) -> Any:
        project = {"project_id": self.project_id} if self.project_id else {}
        GCSBrowserLink.persist(context, uri=self._watched_uri(), **project)
        if not self.deferrable:
            return super().execute(context)
        done = self.poke(context)
        if isinstance(done, PokeReturnValue) and done.is_done:
            return done.xcom_value
        self.defer(
            trigger=self._trigger(),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Return the trigger's success payload; raise on its error event."""
        if not event:
            raise AirflowException(f"{self.task_id}: the trigger ended without an event")
        if event.get("status") == "success":
            self.log.info("%s", self.describe(event))
            return event
        message = str(event.get("message", event))
        if event.get("fatal"):
            raise AirflowFailException(message)
        raise AirflowException(message)


class MaxTextCheckpointSensor(_DeferrableGCSSensor):
    """Waits until a checkpoint step under ``checkpoint_root`` is committed (``commit_success.txt``).

    :param checkpoint_root: ``gs://`` folder holding step folders: the RL trainer's
        ``gs://B/M/trained/<run_name>/checkpoints/actor/`` or ``to_maxtext``'s ``gs://B/M/max-text-format/``
        (with ``step=0, items=("items",)``).
    :param bucket: instead of ``checkpoint_root``: the bucket (without ``gs://``) ...
    :param prefix: ... and the folder in it.
    :param step: step to wait for; None waits for any complete step and returns the latest.
    :param items: item folders the step must hold.
    Takes the shared arguments of both sensors too (``project_id``, ``gcp_conn_id``,
    ``impersonation_chain``, ``deferrable``, ``poke_interval``: see ``_DeferrableGCSSensor``).
    """

    uri_field = "checkpoint_root"
    template_fields: Sequence[str] = (
        "checkpoint_root",
        "step",
        "items",
        *_DeferrableGCSSensor.shared_template_fields,
    )

    def __init__(
        self,
        *,
        checkpoint_root: str | None = None,
        step: int | str | None = None,
        items: Sequence[str] = RL_CHECKPOINT_ITEMS,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.checkpoint_root = checkpoint_root
        self.step = step
        self.items = items

    def describe(self, event: dict[str, Any]) -> str:
        return describe_checkpoint(event)

    def _items(self) -> tuple[str, ...]:
        if not self.items or isinstance(self.items, str):
            raise ConfigurationError(
                f"items must be a non-empty list of item folder names, got {self.items!r}"
            )
        return tuple(self.items)

    def _trigger(self) -> MaxTextCheckpointTrigger:
        return MaxTextCheckpointTrigger(
            checkpoint_root=self._watched_uri(),
            step=_step_from_template(self.step),
            items=self._items(),
            poke_interval=self.poke_interval,
            gcp_conn_id=self.gcp_conn_id,
            impersonation_chain=self.impersonation_chain or None,
        )

    def poke(self, context: Context) -> bool | PokeReturnValue:
        root = self._watched_uri()
        bucket, prefix = parse_gs_uri(root)
        step = _step_from_template(self.step)
        items = self._items()
        result = run_probe_sync(self._hook(), bucket, probe_checkpoint(as_folder(prefix), step, items))
        if result.error:
            raise AirflowFailException(result.error)
        if result.state is not None and result.is_complete:
            return self._found(checkpoint_event_payload(bucket, result.state, items))
        if result.state is not None:
            self.log.info(
                "Step %s under %s: %s (missing %s)",
                result.state.step,
                root,
                result.state.status.value,
                ", ".join(result.state.missing),
            )
        else:
            self.log.info(
                "No %s under %s yet (steps seen: %s)",
                f"step {step}" if step is not None else "complete step",
                root,
                {s: state.status.value for s, state in result.states.items()} or "none",
            )
        return False


class HuggingFaceExportSensor(_DeferrableGCSSensor):
    """Waits until ``export_uri`` holds a complete Hugging Face export (config, all shards, tokenizer).

    :param export_uri: ``gs://`` folder ``to_huggingface`` writes to (its ``base_output_directory``).
    :param bucket: instead of ``export_uri``: the bucket (without ``gs://``) ...
    :param prefix: ... and the folder in it.
    Takes the shared arguments of both sensors too (``project_id``, ``gcp_conn_id``,
    ``impersonation_chain``, ``deferrable``, ``poke_interval``: see ``_DeferrableGCSSensor``).
    """

    uri_field = "export_uri"
    template_fields: Sequence[str] = ("export_uri", *_DeferrableGCSSensor.shared_template_fields)

    def __init__(self, *, export_uri: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.export_uri = export_uri

    def describe(self, event: dict[str, Any]) -> str:
        return describe_export(event)

    def _trigger(self) -> HuggingFaceExportTrigger:
        return HuggingFaceExportTrigger(
            export_uri=self._watched_uri(),
            poke_interval=self.poke_interval,
            gcp_conn_id=self.gcp_conn_id,
            impersonation_chain=self.impersonation_chain or None,
        )

    def poke(self, context: Context) -> bool | PokeReturnValue:
        uri = self._watched_uri()
        bucket, prefix = parse_gs_uri(uri)
        result = run_probe_sync(self._hook(), bucket, probe_hf_export(as_folder(prefix)))
        if result.error:
            raise AirflowFailException(result.error)
        if result.status.complete:
            return self._found(export_event_payload(bucket, as_folder(prefix), result.status))
        self.log.info("Export %s incomplete; missing: %s", uri, ", ".join(result.status.missing))
        return False
