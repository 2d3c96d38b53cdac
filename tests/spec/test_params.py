"""The run parameters' table is the one place a conf key is written: the forms, the defaults, the
per-environment options, the docs' table and ``tpu-rl plan --help`` hold exactly its keys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.cli import conf_keys_help
from airflow_provider_tpu_rl.get_provider_info import get_provider_info
from airflow_provider_tpu_rl.spec import params
from airflow_provider_tpu_rl.spec.pipeline import (
    ENVIRONMENT_OPTIONS,
    GKE_DEFAULTS,
    PLACEHOLDERS,
    TPU_VM_DEFAULTS,
)
from tools import params_doc

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = {params.GKE: GKE_DEFAULTS, params.TPU_VM: TPU_VM_DEFAULTS}


def table_keys(pipeline: str) -> list[str]:
    return [param.key for param in params.params_of(pipeline)]


def test_keys_are_unique_and_every_row_names_a_pipeline() -> None:
    keys = [param.key for param in params.RUN_PARAMS]
    assert len(keys) == len(set(keys))
    for param in params.RUN_PARAMS:
        assert param.pipelines, param.key
        assert set(param.pipelines) <= set(params.PIPELINES), param.key


@pytest.mark.parametrize("pipeline", params.PIPELINES)
def test_the_default_tables_hold_the_tables_keys(pipeline: str) -> None:
    assert list(DEFAULTS[pipeline]) == table_keys(pipeline)
    assert set(ENVIRONMENT_OPTIONS[pipeline]) <= set(table_keys(pipeline))


def test_every_tpu_rl_default_option_is_a_rows_option_and_the_reverse() -> None:
    """The provider's ``[tpu_rl] default_*`` options (get_provider_info) are the table's."""
    declared = {o for o in get_provider_info()["config"]["tpu_rl"]["options"] if o.startswith("default_")}
    in_table = {option for options in ENVIRONMENT_OPTIONS.values() for option in options.values()}
    assert declared == in_table


def test_placeholders_are_rows_whose_default_is_the_example() -> None:
    for key, (example, _) in PLACEHOLDERS.items():
        param = params.PARAMS_BY_KEY[key]
        assert all(param.default_on(p) == example for p in param.pipelines)


@pytest.mark.parametrize("pipeline", params.PIPELINES)
def test_every_form_field_is_well_formed(pipeline: str) -> None:
    for key, field in params.form_fields(pipeline).items():
        assert field["title"], key
        assert field["description"].endswith("."), key
        assert field["section"] in (params.CLOUD, params.CLUSTER, params.VM, params.MODEL, params.SAFETY), key
        patterned = "pattern" in field or "pattern" in field.get("propertyNames", {})
        assert patterned == ("rule" in field), f"{key}: a pattern needs a rule in words, and only a pattern"
        default = params.PARAMS_BY_KEY[key].default_on(pipeline)
        if "pattern" in field and default not in (None, ""):
            assert re.search(field["pattern"], default), key
        if "enum" in field:
            assert default in field["enum"], key


def test_the_docs_table_is_the_one_the_table_writes() -> None:
    document = (ROOT / "docs" / "params.md").read_text()
    assert params_doc.document_with_table(document) == document, (
        "docs/params.md's table is stale: run python -m tools.params_doc --write"
    )
    rows = re.findall(r"^\| `([a-z_]+)` \|", document, flags=re.M)
    assert rows == [param.key for param in params.RUN_PARAMS]


def test_plan_help_lists_each_pipelines_keys() -> None:
    text = conf_keys_help()
    for pipeline in params.PIPELINES:
        for key in table_keys(pipeline):
            assert f"    {key} (" in text
    listed = re.findall(r"^    ([a-z_]+) \(", text, flags=re.M)
    assert sorted(listed) == sorted(table_keys(params.GKE) + table_keys(params.TPU_VM))
