"""The resource record of a cluster or VM a run creates (``tpu-rl/resources/<name>.json`` in its
bucket): what the janitor needs to destroy it, written before it exists, and the TPU machines'
starts noted while they exist (``operators/billing.py``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_tpu_rl.render import gke

RECORD_TIMEOUT_S = 60


def write_resource_record(
    gcp_conn_id: str,
    bucket: str,
    name: str,
    record: Mapping[str, Any],
    impersonation_chain: str | Sequence[str] | None = None,
) -> None:
    """What the janitor needs to destroy a resource this run creates, written before it exists."""
    from airflow_provider_tpu_rl.hooks.credentials import gcs_hook

    gcs_hook(gcp_conn_id, impersonation_chain).upload(
        bucket_name=bucket,
        object_name=gke.resource_record_object(name),
        data=json.dumps(dict(record), sort_keys=True),
        mime_type="application/json",
        timeout=RECORD_TIMEOUT_S,
    )


def read_resource_record(
    gcp_conn_id: str, bucket: str, name: str, impersonation_chain: str | Sequence[str] | None = None
) -> dict[str, Any] | None:
    """The resource record, or ``None`` when there is none (or it is not a JSON object)."""
    from google.api_core.exceptions import NotFound

    from airflow_provider_tpu_rl.hooks.credentials import gcs_hook

    # the client's blob, not GCSHook.download: "no record yet" is an answer, not an error to log
    blob = (
        gcs_hook(gcp_conn_id, impersonation_chain)
        .get_conn()
        .bucket(bucket)
        .blob(gke.resource_record_object(name))
    )
    try:
        raw = blob.download_as_bytes(timeout=RECORD_TIMEOUT_S)
    except NotFound:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
