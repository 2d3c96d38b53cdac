"""The blueprint edits on both shapes of the advanced example (render/blueprint.py): the develop shape
(the sandbox's copy, v1.92.0 on) and the v1.86.0 ... v1.89.0 shape (tests/fixtures/cluster_toolkit/),
and Kueue's template variables (issue 47, items 2 and 3)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import tpu_rl_sandbox
from airflow_provider_tpu_rl.render.blueprint import (
    BLUEPRINT_RELPATH,
    KUBECTL_APPLY_SOURCE,
    KUEUE_DEFAULT_TEMPLATE,
    BlueprintError,
    customize_blueprint,
    kueue_default_template,
)
from airflow_provider_tpu_rl.spec import gke_pipeline_from_conf
from airflow_provider_tpu_rl.spec.cluster import FLEX_START, ON_DEMAND, RESERVATION, SPOT
from tpu_rl_sandbox.clis.gcluster.deploy import check_intergroup_order, cluster_queue

DEVELOP = (Path(tpu_rl_sandbox.__file__).parent / "bundle" / BLUEPRINT_RELPATH).read_text()
V1_89 = (
    Path(__file__).parents[1] / "fixtures" / "cluster_toolkit" / "gke-tpu-v6e-advanced-v1.89.yaml"
).read_text()
SHAPES = pytest.mark.parametrize("text", [DEVELOP, V1_89], ids=["develop", "v1.89"])
POOL = "gke-tpu-v6e-pool"
# Every ${name} the Kueue templates readable at cluster-toolkit v1.85.0 ... c765092 use, where the
# blueprint's config_template_vars feed them (research notes: the example's kueue-configuration,
# the dws-flex-start queued-provisioning tpu-dws-queues template, kubectl-apply's kueue/ defaults
# with their own defaults left out).
TEMPLATE_VARIABLES = {"accelerator_type", "tpu_quota", "namespace", "tpu_topology"}


def _edit(text: str, capacity: str = RESERVATION) -> dict[str, Any]:
    cluster = gke_pipeline_from_conf(
        {"model": "qwen3-30b-a3b", "project": "my-proj-123", "bucket": "my-bkt"}
    ).cluster
    doc = yaml.safe_load(
        customize_blueprint(
            text, cluster.blueprint, tpu_quota=cluster.total_chips, capacity=capacity, slice_vms=8
        )
    )
    assert isinstance(doc, dict)
    return doc


def _modules(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for g in doc["deployment_groups"] for m in g["modules"]]


def _kueue(doc: dict[str, Any]) -> dict[str, Any]:
    (module,) = [m for m in _modules(doc) if m["source"].endswith(KUBECTL_APPLY_SOURCE)]
    kueue = module["settings"]["kueue"]
    assert isinstance(kueue, dict)
    return kueue


@SHAPES
@pytest.mark.parametrize("capacity", [RESERVATION, ON_DEMAND, SPOT, FLEX_START])
def test_the_edits_apply_to_both_shapes(text: str, capacity: str) -> None:
    doc = _edit(text, capacity)
    check_intergroup_order(doc["deployment_groups"])
    assert [g["group"] for g in doc["deployment_groups"]] == ["primary", "tpu"]
    (pool,) = doc["deployment_groups"][1]["modules"]
    assert pool["id"] == POOL
    assert "static_node_count" not in pool["settings"]
    if capacity == FLEX_START:
        assert pool["settings"]["enable_flex_start"] is True


@SHAPES
def test_kueue_gets_every_variable_its_templates_use(text: str) -> None:
    assert set(_kueue(_edit(text))["config_template_vars"]) >= TEMPLATE_VARIABLES


def test_the_develop_shape_takes_the_modules_pathways_queue() -> None:
    kueue = _kueue(_edit(DEVELOP))
    assert "config_path" not in kueue
    assert kueue["config_template_vars"]["accelerator_type"] == "$(vars.accelerator_type)"
    assert kueue["config_template_vars"]["namespace"] == "$(vars.user_namespace)"


def test_the_v1_89_shape_merges_the_modules_pathways_queue_into_the_examples() -> None:
    """Up to v1.91.0 kubectl-apply has no default Pathways queue: the example's template stays and
    ``kueue.enable_pathways_for_tpus`` adds the cpu-np flavor to the same ClusterQueue."""
    kueue = _kueue(_edit(V1_89))
    assert kueue["config_path"] == "$(vars.kueue_configuration_path)"
    assert kueue["enable_pathways_for_tpus"] is True
    assert kueue["config_template_vars"]["accelerator_type"] == "tpu-v6e-slice"
    assert kueue["config_template_vars"]["namespace"] == "default"
    assert kueue["config_template_vars"]["tpu_quota"] == 32


def test_a_blueprint_without_pathways_is_refused_in_one_line() -> None:
    text = V1_89.replace("      enable_pathways_for_tpus: true\n", "")
    with pytest.raises(
        BlueprintError, match=r"^blueprint must set enable_pathways_for_tpus: true \(in vars or"
    ):
        _edit(text)


def test_a_blueprint_without_the_topology_variable_is_refused_in_one_line() -> None:
    text = DEVELOP.replace("  tpu_topology:\n", "", 1)
    with pytest.raises(
        BlueprintError, match=r"no vars\.tpu_topology for the kueue template variable tpu_topology"
    ):
        _edit(text)


def test_a_set_static_node_count_is_kept() -> None:
    text = V1_89.replace("  static_node_count:\n", "  static_node_count: 8\n")
    (pool,) = _edit(text)["deployment_groups"][1]["modules"]
    assert pool["settings"]["static_node_count"] == "$(vars.static_node_count)"
    with pytest.raises(BlueprintError, match="sets static_node_count; spot capacity needs autoscaling"):
        _edit(text, SPOT)


def test_templatefile_refuses_a_variable_its_vars_map_lacks(tmp_path: Path) -> None:
    """The fake gcluster renders a staged Kueue template as Terraform's templatefile does: a
    reference to a key the vars map lacks fails, naming the key and where it is used."""
    template = tmp_path / "queues.yaml.tftpl"
    template.write_text("kind: ClusterQueue\nspec:\n  topology: ${tpu_topology}\n")
    kueue = {"install": True, "config_path": str(template), "config_template_vars": {"tpu_quota": 32}}
    error = cluster_queue(kueue, pathways=False, group_dir=None)["error"]
    assert re.search(
        r'vars map does not contain key "tpu_topology", referenced at \S+queues\.yaml\.tftpl:3,15-27\.$',
        error,
    )
    kueue["config_template_vars"] = {"tpu_quota": 32, "tpu_topology": "4x8", "unused": "x"}
    assert "error" not in cluster_queue(kueue, pathways=False, group_dir=None)


@pytest.mark.parametrize(
    ("text", "template"), [(DEVELOP, KUEUE_DEFAULT_TEMPLATE), (V1_89, None)], ids=["develop", "v1.89"]
)
def test_the_kueue_file_the_edited_blueprint_relies_on(text: str, template: str | None) -> None:
    """The develop shape drops config_path and relies on kubectl-apply's default (v1.92.0 on); the
    v1.89 shape keeps the example's own file."""
    edited = yaml.safe_dump(_edit(text), sort_keys=False)
    assert kueue_default_template(edited) == template
    assert KUEUE_DEFAULT_TEMPLATE == "kueue/kueue-configuration-pathways.yaml.tftpl"
    with pytest.raises(
        BlueprintError, match="no modules/management/kubectl-apply module with kueue settings"
    ):
        kueue_default_template(text.replace("kueue:", "other:", 1))


def test_a_module_copy_without_the_default_template_applies_no_tpu_queue(tmp_path: Path) -> None:
    """The sandbox's Terraform reads the module gcluster wrote: before v1.92.0 it has no default,
    only v1.91.0's Pathways queue (cpu, memory) where Pathways is on, else none."""
    kueue = {"install": True, "config_template_vars": {"accelerator_type": "tpu-v6e-slice", "tpu_quota": 32}}
    module = tmp_path / "kubectl-apply"
    (module / "kueue").mkdir(parents=True)
    (module / "kueue" / "pathways.yaml.tftpl").write_text("")
    assert cluster_queue(kueue, True, None, module)["covered"] == []
    (module / "variables.tf").write_text("")
    assert cluster_queue(kueue, True, None, module)["covered"] == ["cpu", "memory"]
    (module / "kueue" / "kueue-configuration-pathways.yaml.tftpl").write_text("")
    assert cluster_queue(kueue, True, None, module)["covered"] == ["google.com/tpu", "cpu", "memory"]


@SHAPES
def test_an_empty_var_no_module_uses_any_more_is_dropped(text: str) -> None:
    """gcluster refuses a var left empty (pkg/config/validate.go validateVars): with no pool bound
    to the reservation, ``vars.reservation`` goes (the run passes none); so does v1.89's
    ``static_node_count`` with its setting."""
    on_demand = _edit(text, ON_DEMAND)["vars"]
    assert "reservation" not in on_demand
    assert "static_node_count" not in on_demand
    assert "reservation" in _edit(text, RESERVATION)["vars"]
    assert "tpu_topology" in on_demand  # empty, but the deploy passes it
