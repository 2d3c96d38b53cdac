"""An example downstream DAG: it runs when a promoted model lands (its model asset's event).

Scheduled on the stable assets of the GKE pipeline's presets (``tpu-rl://models/<preset>``, any of
them), it reads the triggering event's ``extra``, checks the export in GCS (the weights, the
tokenizer and the model card ``README.md``) and writes a one-line summary: where an evaluation,
serving or publication DAG of your own would start. Nothing here runs at parse time.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.providers.common.compat.sdk import DAG, AssetAny

from airflow_provider_tpu_rl.assets import model_asset
from airflow_provider_tpu_rl.operators.promotion import CheckPromotedModelOperator
from airflow_provider_tpu_rl.spec import Runner
from airflow_provider_tpu_rl.spec.presets import tutorial_presets_for
from airflow_provider_tpu_rl.timeouts import task_timeout

MODELS = tutorial_presets_for(Runner.GKE)  # a rehearsal (qwen3-0.6b) is not served

with DAG(
    dag_id="tpu_rl_model_consumer_example",
    description="Runs when a promoted model lands: checks its export and card, says so in one line.",
    schedule=AssetAny(*(model_asset(model) for model in MODELS)),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),  # Airflow 2.11 needs one for a scheduled DAG
    catchup=False,
    tags=["tpu-rl", "example", "assets"],
    doc_md=__doc__,
):
    CheckPromotedModelOperator(
        task_id="check_model", models=list(MODELS), execution_timeout=task_timeout("short")
    )
