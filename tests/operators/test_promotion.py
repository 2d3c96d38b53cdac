"""``promote_model``: records the run so far, writes the model card beside the export and checks it,
applies the gate from the ledger's row, skips when the model is not promoted (no asset event), and
gives a promoted model's event its ``extra``; ``publish_<preset>`` emits only for the run's preset.
Against the GCS emulator (the card's upload and the export check) and a SQLite ledger."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest
from airflow.providers.common.compat.sdk import Asset
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from airflow_provider_tpu_rl.assets import (
    CONVERTED_EVENT_KEY,
    converted_checkpoint_asset,
    model_asset,
    models_alias,
)
from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS, AirflowFailException, AirflowSkipException
from airflow_provider_tpu_rl.ledger.hook import RunLedger, sqlite_connection_uri
from airflow_provider_tpu_rl.ledger.model_card import parse_front_matter
from airflow_provider_tpu_rl.operators.promotion import (
    PROMOTION_XCOM_KEY,
    PromoteModelOperator,
    PublishConvertedCheckpointOperator,
    PublishModelAssetOperator,
    image_digest,
)
from tests.support.ledger_fakes import SUCCESS_XCOMS, FakeDagRun, FakeLedgerTaskInstance, gke_task_instances

if AIRFLOW_V_3_0_PLUS:
    from airflow.sdk.execution_time.context import OutletEventAccessors
else:  # Airflow 2.11
    from airflow.utils.context import OutletEventAccessors  # type: ignore[no-redef]

IMAGE = "us-docker.pkg.dev/p/r/tpu_post_training:0.2.4@sha256:" + "a" * 64
EXPORT_FILES = ("config.json", "model.safetensors", "tokenizer_config.json", "tokenizer.json")


@dataclass
class PushingTaskInstance(FakeLedgerTaskInstance):
    pushed: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


@pytest.fixture
def export(gcs_emulator, gcs_prefix: str) -> str:
    """A whole Hugging Face export folder in the emulator's bucket."""
    bucket = storage.Client(project="p", credentials=AnonymousCredentials()).bucket(gcs_emulator.bucket_name)
    folder = f"{gcs_prefix}qwen3-30b-a3b/hf-trained/rl-ab12cd/"
    for name in EXPORT_FILES:
        bucket.blob(folder + name).upload_from_string(b"{}")
    return f"gs://{gcs_emulator.bucket_name}/{folder}"


@pytest.fixture(autouse=True)
def ledger(tmp_path, monkeypatch: pytest.MonkeyPatch) -> RunLedger:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_connection_uri(tmp_path / "ledger.db"))
    return RunLedger()


def run_gate(
    export: str,
    min_reward_gain: Any,
    xcoms: dict[str, Any] | None = None,
    outlets: Any = (),
    validated: dict[str, Any] | None = None,
) -> Any:
    xcoms = copy.deepcopy(xcoms or SUCCESS_XCOMS)
    xcoms["wait_hf_export"] = {"export_uri": export}
    xcoms["validate"] = {
        "model": "qwen3-30b-a3b",
        "run_name": "rl-ab12cd",
        "num_batches": 3,
        **(validated or {}),
    }
    ti = PushingTaskInstance(xcoms, task_id="promote_model")
    events = OutletEventAccessors()
    context: dict[str, Any] = {"dag_run": FakeDagRun(gke_task_instances()), "ti": ti, "outlet_events": events}
    op = PromoteModelOperator(
        task_id="promote_model",
        model="qwen3-30b-a3b",
        export_uri=export,
        chips=32,
        min_reward_gain=min_reward_gain,
        image=IMAGE,
        run_name="rl-ab12cd",
        num_batches=3,
        outlets=list(outlets),
    )
    try:
        result = op.execute(context)
    except AirflowSkipException as skipped:
        result = skipped
    return result, ti, events


def read(uri: str) -> str:
    bucket, name = uri.removeprefix("gs://").split("/", 1)
    client = storage.Client(project="p", credentials=AnonymousCredentials())
    return client.bucket(bucket).blob(name).download_as_text()


def test_a_gain_below_min_reward_gain_skips_and_the_ledger_says_not_promoted(
    export: str, ledger: RunLedger
) -> None:
    # the fakes' rewards: 0.12 before, 0.34 after (gain 0.22)
    result, ti, _ = run_gate(export, 0.3)
    assert isinstance(result, AirflowSkipException)
    line = "not promoted: reward gain +0.22 < min_reward_gain 0.3 (mean reward 0.12 -> 0.34)"
    assert str(result) == line
    assert ti.pushed[PROMOTION_XCOM_KEY] == line
    (run,) = ledger.latest_runs()
    assert run.promotion == line
    assert run.promoted is False
    assert run.state == "running"  # record_run, the last teardown, ends it
    assert run.pre_mean_reward == 0.12
    # the export still gets its card, which says so
    assert f"| Promotion | {line} |" in read(export + "README.md")


def test_a_promoted_model_gets_its_card_and_its_events_extra(export: str, ledger: RunLedger) -> None:
    mine = Asset("gs://my-bucket/qwen/hf-trained")
    result, _, events = run_gate(export, "0.2", outlets=[mine])
    (run,) = ledger.latest_runs()
    assert run.promoted is True
    assert run.promotion.startswith("promoted: reward gain +0.22 >= min_reward_gain 0.2")
    card_uri = export + "README.md"
    meta = parse_front_matter(read(card_uri))
    assert meta["base_model"] == "Qwen/Qwen3-30B-A3B-Instruct-2507"
    assert meta["datasets"] == ["nvidia/OpenMathInstruct-2"]
    assert meta["license"] == "apache-2.0"
    assert ("model_card", card_uri) in {(a.kind, a.uri) for a in ledger.run_artifacts(run.run_id)}
    expected = {
        "run_id": run.run_id,
        "run_name": "rl-ab12cd",
        "model": "qwen3-30b-a3b",
        "export_uri": export,
        "model_card_uri": card_uri,
        "base_model": "Qwen/Qwen3-30B-A3B-Instruct-2507",
        "dataset": "nvidia/OpenMathInstruct-2",
        "pre_mean_reward": 0.12,
        "post_mean_reward": 0.34,
        "steps": 3,
        "maxtext_release": "0.2.4",
        "image": IMAGE,
        "image_digest": "sha256:" + "a" * 64,
    }
    assert {key: result[key] for key in expected} == expected
    assert result["tpu_chip_hours_billed"] == pytest.approx(run.chip_hours)
    assert result["tpu_chip_hours_trained"] == pytest.approx(run.busy_chip_hours)
    assert result["estimated_cost_usd"] == pytest.approx(run.estimated_cost_usd)
    assert events[mine].extra == result


def test_an_export_without_its_files_fails_the_check(gcs_emulator, gcs_prefix: str) -> None:
    empty = f"gs://{gcs_emulator.bucket_name}/{gcs_prefix}qwen3-30b-a3b/hf-trained/none/"
    with pytest.raises(AirflowFailException, match=r"is not whole: config\.json"):
        run_gate(empty, None)


def test_evaluation_off_means_no_gate_said_once(export: str) -> None:
    xcoms = copy.deepcopy(SUCCESS_XCOMS)
    xcoms["train"]["num_test_batches"] = 0
    xcoms["train"]["metrics"]["pre"] = xcoms["train"]["metrics"]["post"] = None
    with mock.patch.object(PromoteModelOperator, "log") as log:
        result, _, _ = run_gate(export, 0.5, xcoms)
    assert result["promotion"] == "promoted: no gate, evaluation off (num_test_batches=0)"
    said = [call.args[0] % call.args[1:] for call in log.info.call_args_list]
    assert said.count("promotion gate: promoted: no gate, evaluation off (num_test_batches=0)") == 1


def test_record_run_keeps_the_gates_line(export: str, ledger: RunLedger) -> None:
    from airflow_provider_tpu_rl.ledger.records import RunRecord

    run_gate(export, 0.3)
    ledger.record(
        RunRecord("tpu_rl_gke_pipeline", "manual__2026-03-01T08:00:00+00:00", "qwen3-30b-a3b", "success")
    )
    (run,) = ledger.latest_runs()
    assert run.state == "success"
    assert run.promoted is False


def test_a_threshold_that_is_not_a_number_fails(export: str) -> None:
    with pytest.raises(AirflowFailException, match="min_reward_gain"):
        run_gate(export, "lots")


def test_publish_emits_only_for_the_runs_preset() -> None:
    extra = {"run_id": "d/r", "export_uri": "gs://b/x/"}
    ti = FakeLedgerTaskInstance({"promote_model": extra}, task_id="publish")

    def publish(preset: str, model: str = "qwen3-30b-a3b") -> tuple[Any, Any]:
        events = OutletEventAccessors()
        op = PublishModelAssetOperator(
            task_id=f"publish_{preset}", model=model, preset=preset, outlets=[model_asset(preset)]
        )
        try:
            return op.execute({"ti": ti, "outlet_events": events}), events
        except AirflowSkipException as skipped:
            return skipped, events

    result, events = publish("qwen3-30b-a3b")
    assert result == extra
    assert events[model_asset("qwen3-30b-a3b")].extra == extra
    skipped, _ = publish("gemma4-26b")
    assert isinstance(skipped, AirflowSkipException)
    assert "model is qwen3-30b-a3b, not gemma4-26b" in str(skipped)
    ti.xcoms = {"promote_model": None}
    assert isinstance(publish("qwen3-30b-a3b")[0], AirflowSkipException)


def test_publish_converted_emits_the_conversions_event_for_the_runs_preset_only() -> None:
    extra = {"run_id": "d/r", "checkpoint_uri": "gs://b/qwen3-30b-a3b/max-text-format/", "reused": True}
    ti = FakeLedgerTaskInstance({"convert_to_maxtext": extra}, task_id="publish_converted")

    def publish(preset: str) -> tuple[Any, Any]:
        events = OutletEventAccessors()
        asset = converted_checkpoint_asset(preset)
        op = PublishConvertedCheckpointOperator(
            task_id=f"publish_converted_{preset}", model="qwen3-30b-a3b", preset=preset, outlets=[asset]
        )
        try:
            return op.execute({"ti": ti, "outlet_events": events}), events[asset]
        except AirflowSkipException as skipped:
            return skipped, None

    result, event = publish("qwen3-30b-a3b")
    assert result == extra
    assert event.extra == extra
    assert ti.pulled[-1] == ("convert_to_maxtext", CONVERTED_EVENT_KEY)
    assert "model is qwen3-30b-a3b, not gemma4-26b" in str(publish("gemma4-26b")[0])
    ti.xcoms = {"convert_to_maxtext": None}  # a conversion that left nothing: no event
    skipped, _ = publish("qwen3-30b-a3b")
    assert "convert_to_maxtext left no converted checkpoint" in str(skipped)


def test_an_alias_outlet_gets_the_models_stable_asset(export: str) -> None:
    """A user's DAG may give promote_model an alias: the model's stable asset is added to it."""
    result, _, events = run_gate(export, None, outlets=[models_alias()])
    accessor = events[models_alias()]
    if AIRFLOW_V_3_0_PLUS:
        added = [(e.dest_asset_key.uri, e.extra) for e in accessor.asset_alias_events]
    else:
        added = [(e["dest_dataset_uri"], e["extra"]) for e in accessor.dataset_alias_events]
    assert added == [("tpu-rl://models/qwen3-30b-a3b", result)]


def test_image_digest() -> None:
    assert image_digest(IMAGE) == "sha256:" + "a" * 64
    assert image_digest("x/y:1") is None
    assert image_digest(None) is None


def test_the_card_and_the_events_extra_name_the_gke_cluster_and_its_origin(export: str) -> None:
    cluster = {"project": "p-1", "region": "us-east5", "cluster_name": "tpu-rl", "cluster_mode": "create"}
    xcoms = {**copy.deepcopy(SUCCESS_XCOMS), "deploy_cluster": {"cluster_origin": "kept", "kept_from": "d/r"}}
    result, _, _ = run_gate(export, "0.2", xcoms=xcoms, validated=cluster)
    assert (result["gke_cluster"], result["gke_cluster_origin"]) == ("p-1/us-east5/tpu-rl", "kept")
    assert "| GKE cluster | p-1/us-east5/tpu-rl (kept) |" in read(export + "README.md")
