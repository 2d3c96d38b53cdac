"""``promote_model``: records the run so far, applies the gate from the ledger's row, skips when the
model is not promoted (no asset event), and leaves its one line in the ledger and XCom."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest

from airflow_provider_tpu_rl.compat import AirflowSkipException
from airflow_provider_tpu_rl.ledger.hook import RunLedger, sqlite_connection_uri
from airflow_provider_tpu_rl.operators.promotion import PROMOTION_XCOM_KEY, PromoteModelOperator
from tests.support.ledger_fakes import SUCCESS_XCOMS, FakeDagRun, FakeLedgerTaskInstance, gke_task_instances


@dataclass
class PushingTaskInstance(FakeLedgerTaskInstance):
    pushed: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def run_gate(min_reward_gain: Any, xcoms: dict[str, Any] | None = None) -> tuple[Any, PushingTaskInstance]:
    ti = PushingTaskInstance(xcoms or SUCCESS_XCOMS, task_id="promote_model")
    context: dict[str, Any] = {"dag_run": FakeDagRun(gke_task_instances()), "ti": ti, "outlet_events": {}}
    op = PromoteModelOperator(
        task_id="promote_model", model="qwen3-30b-a3b", chips=32, min_reward_gain=min_reward_gain
    )
    try:
        return op.execute(context), ti
    except AirflowSkipException as skipped:
        return skipped, ti


@pytest.fixture(autouse=True)
def ledger(tmp_path, monkeypatch: pytest.MonkeyPatch) -> RunLedger:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_connection_uri(tmp_path / "ledger.db"))
    return RunLedger()


def test_a_gain_below_min_reward_gain_skips_and_the_ledger_says_not_promoted(ledger: RunLedger) -> None:
    # the fakes' rewards: 0.12 before, 0.34 after (gain 0.22)
    result, ti = run_gate(0.3)
    assert isinstance(result, AirflowSkipException)
    line = "not promoted: reward gain +0.22 < min_reward_gain 0.3 (mean reward 0.12 -> 0.34)"
    assert str(result) == line
    assert ti.pushed[PROMOTION_XCOM_KEY] == line
    (run,) = ledger.latest_runs()
    assert run.promotion == line
    assert run.promoted is False
    assert run.state == "running"  # record_run, the last teardown, ends it
    assert run.pre_mean_reward == 0.12
    assert run.export_uri == "gs://bucket/qwen3-30b-a3b/hf-trained/"


def test_a_gain_at_the_threshold_is_promoted(ledger: RunLedger) -> None:
    result, _ti = run_gate("0.2")
    assert result["promoted"] is True
    (run,) = ledger.latest_runs()
    assert run.promoted is True
    assert run.promotion.startswith("promoted: reward gain +0.22 >= min_reward_gain 0.2")


def test_evaluation_off_means_no_gate_said_once(ledger: RunLedger) -> None:
    xcoms = copy.deepcopy(SUCCESS_XCOMS)
    xcoms["train"]["num_test_batches"] = 0
    xcoms["train"]["metrics"]["pre"] = xcoms["train"]["metrics"]["post"] = None
    with mock.patch.object(PromoteModelOperator, "log") as log:
        result, _ = run_gate(0.5, xcoms)
    assert result["promoted"] is True
    said = [call.args[0] % call.args[1:] for call in log.info.call_args_list]
    assert said == ["promotion gate: promoted: no gate, evaluation off (num_test_batches=0)"]


def test_record_run_keeps_the_gates_line(ledger: RunLedger) -> None:
    from airflow_provider_tpu_rl.ledger.records import RunRecord

    run_gate(0.3)
    ledger.record(
        RunRecord("tpu_rl_gke_pipeline", "manual__2026-03-01T08:00:00+00:00", "qwen3-30b-a3b", "success")
    )
    (run,) = ledger.latest_runs()
    assert run.state == "success"
    assert run.promoted is False


def test_a_threshold_that_is_not_a_number_fails() -> None:
    from airflow_provider_tpu_rl.spec import SpecError

    with pytest.raises(SpecError, match="min_reward_gain"):
        run_gate("lots")
