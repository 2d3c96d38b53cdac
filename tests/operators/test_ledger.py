"""``record_run`` uploads the run's curves through the google provider's GCSHook (GCS emulator)."""

from __future__ import annotations

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from airflow_provider_tpu_rl.ledger.hook import RunLedger, sqlite_connection_uri
from airflow_provider_tpu_rl.ledger.records import ArtifactRecord, MetricRecord, RunRecord
from airflow_provider_tpu_rl.operators.ledger import RecordRunOperator
from tests.support.png import decoded_png


def test_the_png_lands_in_the_bucket_as_an_image(
    gcs_emulator, gcs_prefix, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_connection_uri(tmp_path / "ledger.db"))
    run = RunRecord("tpu_rl_gke_pipeline", "r1", "qwen3-30b-a3b", "success")
    RunLedger().record(
        run,
        metrics=[
            MetricRecord("pre", 0, "mean_reward", 0.1),
            MetricRecord("intermediate", 2, "mean_reward", 0.2),
            MetricRecord("post", 0, "mean_reward", 0.3),
            MetricRecord("train", 1, "loss", 1.5),
            MetricRecord("train", 2, "loss", 1.2),
        ],
    )
    actor_root = f"gs://{gcs_emulator.bucket_name}/{gcs_prefix}qwen3-30b-a3b/trained/rl/checkpoints/actor/"
    op = RecordRunOperator(task_id="record_run")

    uri = op.publish_curves(
        run,
        {"actor_root": actor_root, "final_step": 3, "suffix": "ab12cd", "project": "p"},
        op.upload,
    )

    name = f"{gcs_prefix}qwen3-30b-a3b/trained/rl/tpu-rl-curves-ab12cd.png"
    assert uri == f"gs://{gcs_emulator.bucket_name}/{name}"
    blob = (
        storage.Client(project="p", credentials=AnonymousCredentials())
        .bucket(gcs_emulator.bucket_name)
        .get_blob(name)
    )
    assert blob is not None
    assert blob.content_type == "image/png"
    assert decoded_png(blob.download_as_bytes()).size == (1000, 400)
    assert ArtifactRecord("curves", uri) in RunLedger().run_artifacts(run.run_id)  # the dashboard reads it
