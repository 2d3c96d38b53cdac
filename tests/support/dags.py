"""The project's DAG folder and its DAG ids, for the tests of the shipped DAGs (``tests/dags``) and of
what builds them (``tests/pipelines``); ``tests/conftest.py`` parses the folder once per session
(the ``dag_bag`` and ``serialized_dags`` fixtures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DAGS_DIR = Path(__file__).resolve().parents[2] / "dags"
GKE_DAG_ID = "tpu_rl_gke_pipeline"
TPU_VM_DAG_ID = "tpu_rl_tpu_vm_pipeline"
JANITOR_DAG_ID = "tpu_rl_janitor"
SWEEP_DAG_ID = "tpu_rl_sweep_example"
CONSUMER_DAG_ID = "tpu_rl_model_consumer_example"
PIPELINE_DAG_IDS = (GKE_DAG_ID, TPU_VM_DAG_ID)


def parse_dags_folder() -> Any:
    """The DagBag of ``dags/``; an import error fails the caller."""
    from tests.support.compat import make_dag_bag

    bag = make_dag_bag(str(DAGS_DIR))
    assert bag.import_errors == {}, bag.import_errors
    return bag


def serialize_dags(dag_bag: Any) -> dict[str, Any]:
    """The DAGs as the scheduler and the API server see them (serialized and read back)."""
    from tests.support.compat import serialize_roundtrip

    return {dag_id: serialize_roundtrip(dag) for dag_id, dag in dag_bag.dags.items()}


def trigger_time_validate(serialized_dag: Any, conf: dict[str, Any]) -> dict[str, Any]:
    """What creating a run with ``conf`` does to the params (UI, REST API, ``airflow dags trigger``)."""
    from tests.support.compat import trigger_time_validate as _validate

    return _validate(serialized_dag, conf)
