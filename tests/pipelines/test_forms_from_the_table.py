"""The shipped DAGs' forms (and the sweep example's) are the run parameters' table: the same keys,
in its order within each section, nothing added or left out."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tpu_rl.spec import params
from tests.support.dags import GKE_DAG_ID, TPU_VM_DAG_ID

PIPELINE_OF = {GKE_DAG_ID: params.GKE, TPU_VM_DAG_ID: params.TPU_VM}


@pytest.mark.parametrize("dag_id", sorted(PIPELINE_OF))
def test_a_pipelines_form_holds_the_tables_keys(dag_bag: Any, dag_id: str) -> None:
    pipeline = PIPELINE_OF[dag_id]
    form = list(dag_bag.dags[dag_id].params)
    keys = [param.key for param in params.params_of(pipeline)]
    assert sorted(form) == sorted(keys)
    # the open section first, then the table's order
    open_first = sorted(keys, key=lambda key: params.PARAMS_BY_KEY[key].section != params.CLOUD)
    assert form == open_first


def test_the_sweep_examples_form_takes_its_fields_from_the_table(dag_bag: Any) -> None:
    form = dag_bag.dags["tpu_rl_sweep_example"].params
    own = {"sweep"}
    for key in set(form) - own:
        assert params.GKE in params.PARAMS_BY_KEY[key].pipelines, key
        assert form.get_param(key).schema["title"].startswith(params.PARAMS_BY_KEY[key].title)
