"""Deferrable triggers that wait for a MaxText checkpoint step or a Hugging Face export on GCS.

Both poll with the google provider's ``GCSAsyncHook`` and judge what they list with the pure
rules of :mod:`airflow_provider_tpu_rl.maxtext.layout`. Each run yields exactly one event:

* success: ``{"status": "success", "uris": [...], "step": N, "checkpoint_uri": "gs://…/N/model_params/"}``
  (checkpoint) or ``{"status": "success", "export_uri": …, "uris": [...], "weight_files": [...]}`` (export);
* ``{"status": "error", "message": …, "fatal": True}`` when the layout shows the wait can never end
  (a committed step without a required item, an unreadable index json);
* ``{"status": "error", "message": …}`` on any exception (GCS errors, bad URI).

The GCS hook and ``aiohttp`` are imported in :meth:`run` (in the triggerer), never when a DAG file
that uses the sensors is parsed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_tpu_rl.maxtext.layout import (
    ListFolder,
    ProbeRequest,
    ReadObject,
    as_folder,
    checkpoint_event_payload,
    export_event_payload,
    parse_gs_uri,
    probe_checkpoint,
    probe_hf_export,
)

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.gcs import GCSAsyncHook

_Result = TypeVar("_Result")


async def run_probe_async(
    hook: GCSAsyncHook, bucket: str, probe: Generator[ProbeRequest, Any, _Result]
) -> _Result:
    """Answer a layout probe's list/read requests through ``hook`` and return its verdict."""
    from aiohttp import ClientSession

    async with ClientSession() as session:
        storage = await hook.get_storage_client(session)
        answer: Any = None
        while True:
            try:
                request = probe.send(answer)
            except StopIteration as stop:
                return stop.value
            if isinstance(request, ListFolder):
                answer = await storage.get_bucket(bucket).list_blobs(prefix=request.prefix, delimiter="/")
            elif isinstance(request, ReadObject):
                answer = await storage.download(bucket, request.name)
            else:  # pragma: no cover - the probes only make the two requests above
                raise TypeError(f"Unknown probe request {request!r}")


class MaxTextCheckpointTrigger(BaseTrigger):
    """Fires when a checkpoint step under ``checkpoint_root`` is committed and holds ``items``.

    :param checkpoint_root: ``gs://`` folder holding step folders, e.g.
        ``gs://B/M/trained/rl/checkpoints/actor/`` or ``gs://B/M/max-text-format/``.
    :param step: the step to wait for; None waits for any complete step and reports the latest.
    :param items: item folders the step must hold (``model_params``; ``items`` for converted ones).
    :param poke_interval: seconds between polls.
    :param gcp_conn_id: Google Cloud connection.
    :param impersonation_chain: optional service account(s) to impersonate.
    """

    def __init__(
        self,
        checkpoint_root: str,
        step: int | None,
        items: Sequence[str],
        poke_interval: float,
        gcp_conn_id: str,
        impersonation_chain: str | Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        if not items:
            raise ValueError("items must name at least one checkpoint item")
        self.checkpoint_root = checkpoint_root
        self.step = step
        self.items = tuple(items)
        self.poke_interval = poke_interval
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "checkpoint_root": self.checkpoint_root,
                "step": self.step,
                "items": list(self.items),
                "poke_interval": self.poke_interval,
                "gcp_conn_id": self.gcp_conn_id,
                "impersonation_chain": self.impersonation_chain,
            },
        )

    def _get_async_hook(self) -> GCSAsyncHook:
        from airflow.providers.google.cloud.hooks.gcs import GCSAsyncHook

        return GCSAsyncHook(gcp_conn_id=self.gcp_conn_id, impersonation_chain=self.impersonation_chain)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll until the step is complete; yield exactly one success or error event."""
        try:
            bucket, prefix = parse_gs_uri(self.checkpoint_root)
            root = as_folder(prefix)
            hook = self._get_async_hook()
            while True:
                result = await run_probe_async(hook, bucket, probe_checkpoint(root, self.step, self.items))
                if result.error:
                    yield TriggerEvent({"status": "error", "message": result.error, "fatal": True})
                    return
                if result.state is not None and result.is_complete:
                    yield TriggerEvent(checkpoint_event_payload(bucket, result.state, self.items))
                    return
                which = f"step {self.step}" if self.step is not None else "a complete step"
                self.log.info("Waiting for %s under %s", which, self.checkpoint_root)
                await asyncio.sleep(self.poke_interval)
        except Exception as err:
            yield TriggerEvent({"status": "error", "message": f"{type(err).__name__}: {err}"})


class HuggingFaceExportTrigger(BaseTrigger):
    """Fires when ``export_uri`` holds a complete Hugging Face export (config, all shards, tokenizer).

    :param export_uri: ``gs://`` folder ``to_huggingface`` writes to.
    :param poke_interval: seconds between polls.
    :param gcp_conn_id: Google Cloud connection.
    :param impersonation_chain: optional service account(s) to impersonate.
    """

    def __init__(
        self,
        export_uri: str,
        poke_interval: float,
        gcp_conn_id: str,
        impersonation_chain: str | Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.export_uri = export_uri
        self.poke_interval = poke_interval
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "export_uri": self.export_uri,
                "poke_interval": self.poke_interval,
                "gcp_conn_id": self.gcp_conn_id,
                "impersonation_chain": self.impersonation_chain,
            },
        )

    def _get_async_hook(self) -> GCSAsyncHook:
        from airflow.providers.google.cloud.hooks.gcs import GCSAsyncHook

        return GCSAsyncHook(gcp_conn_id=self.gcp_conn_id, impersonation_chain=self.impersonation_chain)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll until the export is complete; yield exactly one success or error event."""
        try:
            bucket, prefix = parse_gs_uri(self.export_uri)
            folder = as_folder(prefix)
            hook = self._get_async_hook()
            while True:
                result = await run_probe_async(hook, bucket, probe_hf_export(folder))
                if result.error:
                    yield TriggerEvent({"status": "error", "message": result.error, "fatal": True})
                    return
                if result.status.complete:
                    yield TriggerEvent(export_event_payload(bucket, folder, result.status))
                    return
                self.log.info(
                    "Waiting for %s; missing: %s", self.export_uri, ", ".join(result.status.missing)
                )
                await asyncio.sleep(self.poke_interval)
        except Exception as err:
            yield TriggerEvent({"status": "error", "message": f"{type(err).__name__}: {err}"})
