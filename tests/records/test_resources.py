"""The resource record of a cluster or VM (``tpu-rl/resources/<name>.json``), on the GCS emulator:
written as JSON before the resource exists, read back; none, or not a JSON object, reads as None."""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_tpu_rl.records.resources import read_resource_record, write_resource_record
from airflow_provider_tpu_rl.render import gke
from tests.support.gcs_emulator import EMULATOR_BUCKET, GcsEmulator

CONN = "google_cloud_default"


@pytest.fixture
def name() -> str:
    return f"vm-{uuid.uuid4().hex[:8]}"


def test_a_record_written_reads_back(gcs_emulator: GcsEmulator, name: str) -> None:
    assert read_resource_record(CONN, EMULATOR_BUCKET, name) is None  # none yet
    record = {"kind": "tpu_vm", "zone": "us-east5-b", "billing": {"observations": []}}
    write_resource_record(CONN, EMULATOR_BUCKET, name, record)
    assert read_resource_record(CONN, EMULATOR_BUCKET, name) == record
    assert gke.resource_record_object(name).endswith(f"{name}.json")


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]"])
def test_a_record_that_is_not_a_json_object_reads_as_none(
    gcs_emulator: GcsEmulator, name: str, raw: bytes
) -> None:
    gcs_emulator.upload([gke.resource_record_object(name)], raw)
    assert read_resource_record(CONN, EMULATOR_BUCKET, name) is None
