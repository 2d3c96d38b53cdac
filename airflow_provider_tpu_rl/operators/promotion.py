"""``promote_model``: the promotion gate after the export check (the model's asset event, when it passes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.providers.common.compat.sdk import BaseOperator, Context

from airflow_provider_tpu_rl.compat import AirflowSkipException
from airflow_provider_tpu_rl.ledger.collect import GKE_CLUSTER_TASK_IDS, collect_run_from_context
from airflow_provider_tpu_rl.ledger.hook import DEFAULT_CONN_ID, RunLedger
from airflow_provider_tpu_rl.ledger.promotion import decide
from airflow_provider_tpu_rl.ledger.records import RunRecord, RunSummary, make_run_id
from airflow_provider_tpu_rl.operators.ledger import default_usd_per_chip_hour, run_settings
from airflow_provider_tpu_rl.spec.pipeline import min_reward_gain as check_min_reward_gain

PROMOTION_XCOM_KEY = "promotion"


def _number_or_text(value: Any) -> Any:
    """A templated number rendered as text (a DAG without native templates) back as a number."""
    if isinstance(value, str) and value.strip():
        try:
            return float(value)
        except ValueError:
            return value
    return value


class PromoteModelOperator(BaseOperator):
    """Decide whether the run's trained model is promoted, from the ledger's values.

    Records the run so far in the ledger (state ``running``: its steps, rewards, artifacts and TPU
    time; ``record_run`` completes it), then reads its row back and applies the gate: with
    evaluation on and ``min_reward_gain`` set, a model whose mean reward gained less is *not
    promoted*. The decision's one line goes to the ledger's ``promotion`` column and to XCom (key
    ``promotion``). A model that is not promoted **skips** this task (``AirflowSkipException``): the
    run still succeeds (the export exists, nothing broke), and a skipped task emits no asset event
    for its outlets on either Airflow line. Evaluation off, or no threshold: no gate, said once.

    :param model: the model preset.
    :param min_reward_gain: the gate's threshold (a number; None or "" = no gate). Templated.
    :param chips: the TPU chips the run trained on (the ledger's chip-hours).
    :param conn_id: the ledger's Airflow connection.
    :param cluster_task_ids: the tasks that create and destroy the billed TPU capacity.
    :param validate_task_id: the task whose XCom holds the resolved values (the run's settings).
    :param usd_per_chip_hour: the price the billed chip-hours are costed at; None = ``[tpu_rl]``.
    :param collect_options: more arguments of the ledger's collector (``train_task_id``, ...).
    """

    template_fields: Sequence[str] = ("model", "min_reward_gain", "chips")
    ui_color = "#f4ecd8"

    def __init__(
        self,
        *,
        model: str,
        min_reward_gain: float | str | None = None,
        chips: int | str | None = None,
        conn_id: str = DEFAULT_CONN_ID,
        cluster_task_ids: Sequence[str] = GKE_CLUSTER_TASK_IDS,
        validate_task_id: str = "validate",
        usd_per_chip_hour: float | None = None,
        collect_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.min_reward_gain = min_reward_gain
        self.chips = chips
        self.conn_id = conn_id
        self.cluster_task_ids = tuple(cluster_task_ids)
        self.validate_task_id = validate_task_id
        self.usd_per_chip_hour = usd_per_chip_hour
        self.collect_options = dict(collect_options or {})

    def execute(self, context: Context) -> dict[str, Any]:
        threshold = check_min_reward_gain(_number_or_text(self.min_reward_gain))
        ledger = RunLedger(self.conn_id)
        run, summary = self.record_so_far(context, ledger)
        decision = decide(
            summary.pre_mean_reward, summary.post_mean_reward, summary.num_test_batches, threshold
        )
        ledger.record(dataclasses.replace(run, promotion=decision.line))
        context["ti"].xcom_push(key=PROMOTION_XCOM_KEY, value=decision.line)
        if not decision.gated:
            self.log.info("promotion gate: %s", decision.line)
        if not decision.promoted:
            raise AirflowSkipException(decision.line)
        if decision.gated:
            self.log.info("%s", decision.line)
        return {"promoted": True, "promotion": decision.line, "run_id": summary.run_id}

    def record_so_far(self, context: Context, ledger: RunLedger) -> tuple[RunRecord, RunSummary]:
        """Upsert the run as it stands (``running``) and read its ledger row back."""
        dag_run = context["dag_run"]
        run_id = make_run_id(dag_run.dag_id, dag_run.run_id)
        chips = None if self.chips in (None, "") else int(self.chips)  # type: ignore[arg-type]
        run, steps, metrics, artifacts = collect_run_from_context(
            context,
            model=str(self.model),
            chips=chips,
            cluster_task_ids=(self.cluster_task_ids[0], self.cluster_task_ids[1]),
            recorded_steps=ledger.recorded_steps(run_id),
            usd_per_chip_hour=(
                default_usd_per_chip_hour() if self.usd_per_chip_hour is None else self.usd_per_chip_hour
            ),
            **self.collect_options,
        )
        derived = context["ti"].xcom_pull(task_ids=self.validate_task_id) or {}
        run = dataclasses.replace(
            run, state="running", ended_at=None, settings=run_settings(derived) if derived else None
        )
        ledger.record(run, steps, metrics, artifacts)
        summary = ledger.run_summary(run_id)
        if summary is None:  # the row was just written: only a ledger that lost it gets here
            raise RuntimeError(f"the ledger lost run {run_id} just recorded")
        return run, summary
