"""The pipelines' trigger forms: one Param per spec key, form metadata, and rules that agree with the spec.

A conf is refused by the ``validate`` task, in one line (whole conf: each field's rule, the spec's
cross-field rules and the unknown-key check); the params' JSON schema, which Airflow checks when
the run is created, refuses only a wrong JSON type or a value outside a dropdown's choices. The
tables below say for each bad conf its message and whether Airflow refuses it first.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import (
    FORM_BOOLEAN_NULLABLE,
    FORM_NULL_CHOICE,
    FORM_OPEN_SECTION,
    AirflowFailException,
    ParamValidationError,
)
from airflow_provider_tpu_rl.pipelines.form import form_schema
from airflow_provider_tpu_rl.pipelines.validate import validate_pipeline_conf
from airflow_provider_tpu_rl.spec import GKE_DEFAULTS, TPU_VM_DEFAULTS, Runner, params, rules
from airflow_provider_tpu_rl.spec.cluster import K8S_NAME, SYSTEM_MACHINE_TYPE
from airflow_provider_tpu_rl.spec.existing_cluster import EXISTING_CLUSTER_VALUE
from airflow_provider_tpu_rl.spec.presets import presets_for
from airflow_provider_tpu_rl.timeouts import resource_hours
from tests.support.dags import (
    DAGS_DIR,
    GKE_DAG_ID,
    PIPELINE_DAG_IDS,
    SWEEP_DAG_ID,
    TPU_VM_DAG_ID,
    trigger_time_validate,
)

DEFAULTS: dict[str, Mapping[str, Any]] = {GKE_DAG_ID: GKE_DEFAULTS, TPU_VM_DAG_ID: TPU_VM_DEFAULTS}
# A user's own project and bucket: `validate` refuses the form's examples.
OWN_VALUES: dict[str, dict[str, Any]] = {
    GKE_DAG_ID: {"project": "tpu-rl-form-test", "bucket": "tpu-rl-form-test-bucket"},
    TPU_VM_DAG_ID: {"project": "tpu-rl-form-test", "bucket": "tpu-rl-form-test-bucket"},
}
# The Cloud fields are in the part of the form that opens: Airflow 3's "Run Parameters" section,
# Airflow 2's fields without a section (None).
SECTIONS = {
    GKE_DAG_ID: {FORM_OPEN_SECTION, "Cluster", "Model & training", "Safety"},
    TPU_VM_DAG_ID: {FORM_OPEN_SECTION, "VM", "Model & training", "Safety"},
}
CLOUD_KEYS = {
    GKE_DAG_ID: ["project", "region", "zone", "bucket", "reservation", "capacity", "capacity_fallback"],
    TPU_VM_DAG_ID: [
        "project",
        "zone",
        "bucket",
        "reservation",
        "capacity",
        "capacity_fallback",
        "service_account",
    ],
}
RUNNERS = {GKE_DAG_ID: Runner.GKE, TPU_VM_DAG_ID: Runner.TPU_VM}
PIPELINES = {GKE_DAG_ID: params.GKE, TPU_VM_DAG_ID: params.TPU_VM}
# Which spec regex each pattern-carrying param must reuse.
PATTERNS: dict[str, dict[str, Any]] = {
    GKE_DAG_ID: {
        "project": rules.PROJECT_ID,
        "region": rules.REGION,
        "zone": rules.ZONE,
        "bucket": rules.BUCKET_CHARS,
        "reservation": rules.GCE_NAME,
        "cluster_name": rules.GKE_CLUSTER_NAME,
        "image": rules.IMAGE,
        "image_repository": rules.REPOSITORY_ID,
        "hf_model_path": rules.HF_REPO_ID,
        "run_name": rules.RUN_NAME,
        "hf_token_conn_id": rules.CONN_ID,
        "hf_token_secret": rules.SECRET_ID,
        "existing_cluster": EXISTING_CLUSTER_VALUE,
        "kueue_queue": K8S_NAME,
        "cpu_node_pool": K8S_NAME,
    },
    TPU_VM_DAG_ID: {
        "project": rules.PROJECT_ID,
        "zone": rules.ZONE,
        "bucket": rules.BUCKET_CHARS,
        "reservation": rules.GCE_NAME,
        "service_account": rules.SERVICE_ACCOUNT,
        "vm_name": rules.GCE_NAME,
        "cpu_machine_type": SYSTEM_MACHINE_TYPE,
        "workload_image": rules.IMAGE,
        "hf_model_path": rules.HF_REPO_ID,
        "run_name": rules.RUN_NAME,
        "hf_token_conn_id": rules.CONN_ID,
        "hf_token_secret": rules.SECRET_ID,
    },
}

# (case id, conf, message validate_pipeline_conf raises, whether the JSON schema refuses it first:
# a wrong type or a value outside a dropdown's choices)
GKE_BAD_CONFS = [
    ("unknown_key", {"clustr_name": "tpu-rl"}, "clustr_name: unknown conf key", False),
    (
        "cluster_name_uppercase",
        {"cluster_name": "TPU-rl"},
        "cluster_name: GKE cluster name must start",
        False,
    ),
    (
        "cluster_name_too_long",
        {"cluster_name": "a" * 21},
        "cluster_name: must be at most 20 characters",
        False,
    ),
    ("topology_not_v6e", {"topology": "3x3"}, "topology: not a v6e slice shape", True),
    ("topology_malformed", {"topology": "big"}, "topology: topology must look like 4x8", True),
    (
        "topology_vs_machine",
        {"topology": "2x4"},
        "topology: single-host v6e-8 (2x4) needs a VM with 8 chips",
        False,
    ),
    ("unknown_model", {"model": "llama-99b"}, "model: unknown model", True),
    (
        "tpu_vm_model",
        {"model": "llama3.1-8b-Instruct"},
        "runs on one TPU VM; use the tpu_rl_tpu_vm_pipeline",
        True,
    ),
    ("negative_batches", {"num_batches": -5}, "num_batches: must be >= 1", False),
    ("zero_batches", {"num_batches": 0}, "num_batches: must be >= 1", False),
    (
        "negative_batch_size",
        {"train_overrides": {"batch_size": -8}},
        "train_overrides.batch_size: must be >= 1",
        False,
    ),
    ("token_override", {"train_overrides": {"hf_access_token": "hf_x"}}, "cannot be overridden", False),
    (
        "override_key",
        {"train_overrides": {"Bad-Key": 1}},
        "train_overrides.Bad-Key: MaxText override keys",
        False,
    ),
    ("zone_outside_region", {"zone": "us-west1-a"}, "zone: zone must be inside region 'us-east5'", False),
    (
        "spot_with_reservation",
        {"capacity": "spot", "reservation": "res-1"},
        "capacity: spot capacity consumes no reservation: clear reservation (res-1)",
        False,
    ),
    ("unknown_capacity", {"capacity": "preemptible"}, "capacity: must be one of", True),
    (
        "fallback_unknown_kind",
        {"capacity_fallback": ["preemptible"]},
        "capacity_fallback: must list kinds of",
        False,
    ),
    ("fallback_not_a_list", {"capacity_fallback": "spot"}, "capacity_fallback: must be a list", True),
    (
        "fallback_repeats_capacity",
        {"capacity": "spot", "capacity_fallback": ["spot"]},
        "capacity_fallback: spot is tried already",
        False,
    ),
    (
        "bucket_with_scheme",
        {"bucket": "gs://my-bucket"},
        "bucket: give the bucket name without 'gs://'",
        False,
    ),
    ("zero_slices", {"num_slices": 0}, "num_slices: must be between 1 and 64", False),
    ("keep_cluster_text", {"keep_cluster": "yes"}, "keep_cluster: must be true or false", True),
    ("cluster_hours", {"max_cluster_hours": 337}, "max_cluster_hours: must be between 1 and 336", False),
    (
        "cluster_hours_below_the_stage_bounds",
        {"max_cluster_hours": 12},
        "max_cluster_hours: 12 h is shorter than the 68 h the run's stages may take while its cluster "
        "exists (deploy 90 min, short 20 min, copy 60 min, convert 3 h, checkpoint 2 h, deploy 90 min, train 48 h, "
        "checkpoint 2 h, teardown 90 min, export 3 h, checkpoint 2 h, teardown 90 min",
        False,
    ),
    # (these six were once `airflow dags test` runs; tests/dags/test_dag_runs.py's bad-conf run keeps the
    # one whose value changes on its way to the task)
    (
        "unknown_maxtext_key",
        {"train_overrides": {"lerning_rate": 1e-5}},
        "train_overrides.lerning_rate: not a MaxText config key (did you mean learning_rate?)",
        False,
    ),
    (
        "num_batches_in_overrides",
        {"num_batches": 50, "train_overrides": {"num_batches": 5}},
        "train_overrides.num_batches: cannot be overridden: set it with the `num_batches` param",
        False,
    ),
    ("num_batches_too_large", {"num_batches": 10**30}, "num_batches: must be <= 10000000", False),
    (
        "placeholder_project",
        {"project": "my-tpu-project"},
        "project: set project to your GCP project (my-tpu-project is the form's example)",
        False,
    ),
    (
        "placeholder_bucket",
        {"bucket": "my-tpu-rl-bucket"},
        "bucket: set bucket to a Cloud Storage bucket name of yours (my-tpu-rl-bucket is the form's example)",
        False,
    ),
    (
        "nan_in_overrides",
        {"train_overrides": {"learning_rate": float("nan")}},
        "train_overrides.learning_rate: must be a finite number (got nan)",
        False,
    ),
]
TPU_VM_BAD_CONFS = [
    ("gke_key", {"keep_cluster": True}, "keep_cluster: unknown conf key", False),
    ("vm_name", {"vm_name": "VM_1"}, "vm_name: VM name must be 1-63 lowercase letters", False),
    ("runtime", {"runtime": "docker"}, "runtime: must be one of ['container', 'install']", True),
    ("workload_image", {"workload_image": "img;id"}, "workload_image: container image must be", False),
    ("unknown_model", {"model": "gpt-5"}, "model: unknown model", True),
    ("gke_model", {"model": "qwen3-30b-a3b"}, "needs a multi-host slice; use the tpu_rl_gke_pipeline", True),
    ("negative_batches", {"num_batches": -1}, "num_batches: must be >= 1", False),
    # an empty reservation is valid in the form (all but reservation capacity take none): validate
    # refuses it with reservation capacity, in one line
    (
        "no_reservation",
        {"capacity": "reservation", "reservation": ""},
        "capacity: reservation capacity needs a reservation: name it in reservation, or set capacity "
        "to on-demand (no reservation)",
        False,
    ),
    (
        "flex_start_with_reservation",
        {"capacity": "flex-start", "reservation": "res-8"},
        "capacity: flex-start capacity consumes no reservation: clear reservation",
        False,
    ),
    (
        "unknown_capacity",
        {"capacity": "preemptible", "reservation": ""},
        "capacity: must be one of ['on-demand', 'reservation', 'spot', 'flex-start']",
        True,
    ),
    (
        "fallback_repeats_capacity",
        {"capacity": "spot", "reservation": "", "capacity_fallback": ["spot"]},
        "capacity_fallback: spot is tried already",
        False,
    ),
    (
        "service_account",
        {"service_account": "me@example.com"},
        "service_account: must be a service account",
        False,
    ),
    ("vm_hours", {"max_vm_hours": 169}, "max_vm_hours: must be between 1 and 168", False),
    (
        "vm_hours_below_the_stage_bounds",
        {"max_vm_hours": 6},
        "max_vm_hours: 6 h is shorter than the 68 h",
        False,
    ),
    (
        "negative_test_batches",
        {"train_overrides": {"num_test_batches": -1}},
        "num_test_batches: must be >= 0",
        False,
    ),
    ("keep_vm_number", {"keep_vm": 1}, "keep_vm: must be true or false", True),
    (
        # Every placeholder in one refusal: the untouched form fails once, not once per field.
        "all_placeholders",
        {"project": "my-tpu-project", "bucket": "my-tpu-rl-bucket"},
        "project, bucket: set project to your GCP project (my-tpu-project is the form's "
        "example); set bucket to a Cloud Storage bucket name of yours (my-tpu-rl-bucket is the form's "
        "example); or set [tpu_rl] default_project, default_bucket once for this Airflow",
        False,
    ),
]
BAD_CONFS = [
    pytest.param(GKE_DAG_ID, conf, message, schema_refuses, id=f"gke-{case}")
    for case, conf, message, schema_refuses in GKE_BAD_CONFS
] + [
    pytest.param(TPU_VM_DAG_ID, conf, message, schema_refuses, id=f"tpu_vm-{case}")
    for case, conf, message, schema_refuses in TPU_VM_BAD_CONFS
]


def run_validate(dag_id: str, conf: dict[str, Any]) -> dict[str, Any]:
    """The ``validate`` task's call: params are the defaults overlaid with the conf, as at run time."""
    params = {**DEFAULTS[dag_id], **OWN_VALUES[dag_id], **conf}
    return validate_pipeline_conf(dag_id, "manual__2026-01-01T00:00:00", conf, params)


def schemas(dag: Any) -> dict[str, dict[str, Any]]:
    return {key: dag.params.get_param(key).schema for key in dag.params}


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_one_param_per_spec_key_with_the_spec_default(dag_bag: Any, dag_id: str) -> None:
    params = dag_bag.dags[dag_id].params
    # The open section's fields first, then the others in the spec's order.
    cloud = [key for key in DEFAULTS[dag_id] if key in CLOUD_KEYS[dag_id]]
    assert list(params) == cloud + [key for key in DEFAULTS[dag_id] if key not in cloud]
    assert {key: params[key] for key in params} == dict(DEFAULTS[dag_id])


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_every_param_has_title_description_and_a_known_section(dag_bag: Any, dag_id: str) -> None:
    dag = dag_bag.dags[dag_id]
    used = set()
    for key in dag.params:
        param = dag.params.get_param(key)
        assert param.schema.get("title"), key
        assert param.description, key
        assert param.schema.get("section") in SECTIONS[dag_id], key
        assert "type" in param.schema, key
        used.add(param.schema.get("section"))
    assert used == SECTIONS[dag_id]


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_model_dropdown_offers_only_this_runners_presets(dag_bag: Any, dag_id: str) -> None:
    model = dag_bag.dags[dag_id].params.get_param("model").schema
    assert model["enum"] == presets_for(RUNNERS[dag_id])
    assert set(model["values_display"]) == set(model["enum"])


def test_tpu_vm_runtime_is_a_dropdown_of_the_spec_runtimes(dag_bag: Any) -> None:
    """The TPU VM form's runtime: the spec's choices, container first (the default)."""
    from airflow_provider_tpu_rl.spec.pipeline import TPU_VM_RUNTIMES

    param = dag_bag.dags[TPU_VM_DAG_ID].params.get_param("runtime")
    assert param.schema["enum"] == list(TPU_VM_RUNTIMES) == ["container", "install"]
    assert param.value == "container"
    assert param.schema["title"]
    assert "install" in param.description


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_patterns_reuse_the_spec_regexes(dag_id: str) -> None:
    fields = params.form_fields(PIPELINES[dag_id])
    found = {key: field["pattern"] for key, field in fields.items() if "pattern" in field}
    assert set(found) == set(PATTERNS[dag_id])
    for key, regex in PATTERNS[dag_id].items():
        assert found[key] in (regex.pattern, f"^$|(?:{regex.pattern})"), key


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_the_params_leave_the_value_rules_to_validate(dag_bag: Any, dag_id: str) -> None:
    """No Param carries a pattern, a bound or a length: Airflow would refuse a value breaking one
    with jsonschema's multi-line dump before validate could say it in one line."""
    for key, schema in schemas(dag_bag.dags[dag_id]).items():
        assert not set(params.VALUE_RULES) & set(schema), (key, schema)
        assert "rule" not in schema, key


def breaking_values(field: Mapping[str, Any]) -> list[Any]:
    """One value of the field's type per value rule it has, each breaking that rule."""
    values: list[Any] = []
    if "pattern" in field:
        values.append("Bad Value!")
    if "propertyNames" in field:
        values.append({"Bad Key": 1})
    if "minimum" in field:
        values.append(field["minimum"] - 1)
    if "maximum" in field:
        values.append(field["maximum"] + 1)
    if "minLength" in field:
        values.append("a" * (field["minLength"] - 1))
    if "maxLength" in field:
        values.append("a" * (field["maxLength"] + 1))
    return values


def value_rule_cases() -> list[Any]:
    cases = []
    for dag_id in PIPELINE_DAG_IDS:
        for key, field in params.form_fields(PIPELINES[dag_id]).items():
            for index, value in enumerate(breaking_values(field)):
                cases.append(pytest.param(dag_id, key, value, id=f"{dag_id}-{key}-{index}"))
    return cases


@pytest.mark.parametrize(("dag_id", "key", "value"), value_rule_cases())
def test_a_value_breaking_a_fields_rule_is_refused_in_one_line_naming_the_field(
    serialized_dags: dict[str, Any], dag_id: str, key: str, value: Any
) -> None:
    """The form, the REST API and `dags test` create the run (Airflow's Param takes the value);
    validate refuses it in one line: the field, its rule, the value."""
    trigger_time_validate(serialized_dags[dag_id], {key: value})
    with pytest.raises(AirflowFailException) as refused:
        run_validate(dag_id, {key: value})
    said = str(refused.value)
    assert "\n" not in said, said
    assert said.startswith(f"invalid pipeline conf: {key}"), said


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_params_whose_default_means_preset_value_are_nullable(dag_bag: Any, dag_id: str) -> None:
    for key, schema in schemas(dag_bag.dags[dag_id]).items():
        if DEFAULTS[dag_id][key] is None:
            assert isinstance(schema["type"], list), key
            assert "null" in schema["type"], key


@pytest.mark.parametrize(("dag_id", "conf", "message", "schema_refuses"), BAD_CONFS)
def test_bad_conf_is_refused_by_validate(
    dag_id: str, conf: dict[str, Any], message: str, schema_refuses: bool
) -> None:
    with pytest.raises(AirflowFailException, match="invalid pipeline conf") as refused:
        run_validate(dag_id, conf)
    assert message in str(refused.value)


@pytest.mark.parametrize(("dag_id", "conf", "message", "schema_refuses"), BAD_CONFS)
def test_bad_conf_is_refused_by_the_form_where_json_schema_can_say_it(
    serialized_dags: dict[str, Any], dag_id: str, conf: dict[str, Any], message: str, schema_refuses: bool
) -> None:
    if schema_refuses:
        # only a wrong JSON type or a value outside the form's choices (its dropdown): the value
        # rules are validate's, in one line
        with pytest.raises(
            ParamValidationError, match=f"Invalid input for param {next(iter(conf))}"
        ) as refused:
            trigger_time_validate(serialized_dags[dag_id], conf)
        assert re.search(r"Failed validating '(type|enum|anyOf)'", str(refused.value)), refused.value
    else:
        # Value rules, cross-field rules, override ranges and unknown keys: the validate task's.
        trigger_time_validate(serialized_dags[dag_id], conf)


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_a_patterned_fields_description_shows_what_validate_says_of_a_bad_value(
    dag_bag: Any, dag_id: str
) -> None:
    """The form's own refusal is Airflow's JSON-schema dump (the regex); the spec's rule, the one
    line validate gives, is in the field's description, which the form shows next to it."""
    for key in PATTERNS[dag_id]:
        with pytest.raises(AirflowFailException) as refused:
            run_validate(dag_id, {key: "Bad Value!"})
        said = str(refused.value)
        rule = said.split(f"{key}: ", 1)[1].rsplit(" (got ", 1)[0]
        description = dag_bag.dags[dag_id].params.get_param(key).description
        assert f" Rule: {rule}" in description, (key, rule, description)
    overrides = dag_bag.dags[dag_id].params.get_param("train_overrides").description
    assert overrides.endswith(f" Rule: {rules.MAXTEXT_KEY_RULE}.")


def test_a_form_field_with_a_pattern_must_carry_its_rule() -> None:
    field = {"title": "X", "description": "An x.", "type": "string", "pattern": "^x$"}
    with pytest.raises(ValueError, match="has a pattern but no rule"):
        form_schema(field)
    assert form_schema({**field, "rule": "x only"})["description"] == "An x. Rule: x only."


# Wrong JSON types and NaN/Infinity for a top-level number: only the form's JSON schema sees them
# (Airflow's own check when the run is created, the same in the UI, the REST API and `dags test -c`).
SCHEMA_ONLY_REFUSED = [
    pytest.param({"compute_type": ["ct6e-standard-4t"]}, id="list-for-compute-type"),
    pytest.param({"num_batches": float("nan")}, id="nan-for-num-batches"),
    pytest.param({"max_cluster_hours": float("inf")}, id="infinity-for-max-cluster-hours"),
]


@pytest.mark.parametrize("conf", SCHEMA_ONLY_REFUSED)
def test_a_wrong_json_type_is_refused_by_the_form(
    serialized_dags: dict[str, Any], conf: dict[str, Any]
) -> None:
    with pytest.raises(ParamValidationError, match=f"Invalid input for param {next(iter(conf))}: "):
        trigger_time_validate(serialized_dags[GKE_DAG_ID], conf)


def integer_bounds() -> list[Any]:
    cases: list[Any] = []
    for dag_id, keys in (
        (GKE_DAG_ID, ("num_slices", "num_batches", "max_cluster_hours")),
        (TPU_VM_DAG_ID, ("num_batches", "max_vm_hours")),
    ):
        cases.extend(pytest.param(dag_id, key, id=f"{dag_id}-{key}") for key in keys)
    return cases


@pytest.mark.parametrize(("dag_id", "key"), integer_bounds())
def test_integer_bounds_of_the_form_are_the_specs(
    serialized_dags: dict[str, Any], dag_id: str, key: str
) -> None:
    schema = params.form_fields(PIPELINES[dag_id])[key]
    words = params.value_rule_words(schema)
    assert f"Rule: {words}." in serialized_dags[dag_id].params.get_param(key).description
    inside = [schema["minimum"]] + ([schema["maximum"]] if "maximum" in schema else [])
    outside = [schema["minimum"] - 1] + ([schema["maximum"] + 1] if "maximum" in schema else [])
    # an expiry must also cover the stage bounds (validate's own rule, read from [tpu_rl])
    least = {"max_cluster_hours": resource_hours("gke"), "max_vm_hours": resource_hours("tpu_vm")}.get(key, 0)
    for value in inside:
        trigger_time_validate(serialized_dags[dag_id], {key: value})
        run_validate(dag_id, {key: max(value, least)})
    for value in outside:
        trigger_time_validate(serialized_dags[dag_id], {key: value})
        with pytest.raises(AirflowFailException, match=f"{key}: must be"):
            run_validate(dag_id, {key: value})


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_empty_optional_fields_mean_the_preset_value_for_form_and_spec(
    serialized_dags: dict[str, Any], dag_id: str
) -> None:
    optional = [
        key
        for key, schema in schemas(serialized_dags[dag_id]).items()
        if isinstance(schema["type"], list) and "null" in schema["type"] and "boolean" not in schema["type"]
    ]
    assert optional
    for key in optional:
        trigger_time_validate(serialized_dags[dag_id], {key: None})
        assert run_validate(dag_id, {key: None})["model"] == DEFAULTS[dag_id]["model"]
        if "pattern" in params.form_fields(PIPELINES[dag_id])[key]:
            trigger_time_validate(serialized_dags[dag_id], {key: ""})
            run_validate(dag_id, {key: ""})


def test_preset_choices_of_the_gke_form_are_accepted_by_the_spec(serialized_dags: dict[str, Any]) -> None:
    gke = serialized_dags[GKE_DAG_ID]
    for model in gke.params.get_param("model").schema["enum"]:
        trigger_time_validate(gke, {"model": model})
        assert run_validate(GKE_DAG_ID, {"model": model})["model"] == model
    # The multi-host shapes the dropdown offers that ct6e-standard-4t can build.
    for topology in ("4x4", "4x8", "8x8"):
        trigger_time_validate(gke, {"topology": topology})
        assert run_validate(GKE_DAG_ID, {"topology": topology})["chips"] == chips_of(topology)


def test_the_gke_forms_shape_choices_left_at_the_preset_value_can_be_submitted(
    serialized_dags: dict[str, Any],
) -> None:
    """The shape dropdowns default to null (the preset's value). Airflow 2's form submits a null
    option as the string "None" (compat.FORM_NULL_CHOICE): there the fields are text fields
    proposing the choices, and empty submits null; either way "None" is refused."""
    gke = serialized_dags[GKE_DAG_ID]
    for key in ("compute_type", "topology"):
        schema = gke.params.get_param(key).schema
        assert (None in schema.get("enum", ())) is FORM_NULL_CHOICE, schema
        assert ("examples" in schema) is not FORM_NULL_CHOICE, schema
        trigger_time_validate(gke, {key: None})
        with pytest.raises(ParamValidationError, match=f"Invalid input for param {key}"):
            trigger_time_validate(gke, {key: "None"})


def chips_of(topology: str) -> int:
    a, b = topology.split("x")
    return int(a) * int(b)


def test_a_full_custom_gke_conf_passes_both_checks(serialized_dags: dict[str, Any]) -> None:
    conf = {
        "model": "gemma4-26b",
        "project": "team-tpu-42",
        "region": "europe-west4",
        "zone": "europe-west4-a",
        "cluster_name": "gemma-rl-2",
        "bucket": "team-tpu-42-rl",
        "reservation": "v6e-res",
        "topology": "4x8",
        "num_slices": 2,
        "num_batches": 10,
        "train_overrides": {"batch_size": 2, "rl.num_generations": 8},
        "hf_token_secret": "hf-token",
        "authorized_cidr": "10.0.0.0/8",
        "max_cluster_hours": 96,
    }
    trigger_time_validate(serialized_dags[GKE_DAG_ID], conf)
    derived = run_validate(GKE_DAG_ID, conf)
    assert derived["final_step"] == 10
    assert derived["chips"] == 64
    assert derived["actor_root"].startswith("gs://team-tpu-42-rl/gemma4-26b/")


def open_form_section() -> str | None:
    """The installed Airflow's trigger form: which section it opens when it loads (None: no section).

    Airflow 3.3: the React form's default section, named in its bundle. Airflow 2: the Flask template,
    which lists the params without a section in the open panel and every section collapsed.
    """
    import airflow

    root = Path(airflow.__file__).parent
    bundle = root / "ui" / "dist" / "assets"
    if any("`Run Parameters`" in js.read_text() for js in bundle.glob("index-*.js")):
        return "Run Parameters"
    template = (root / "www" / "templates" / "airflow" / "trigger.html").read_text()
    unsectioned = template.index(
        '{% if ("section" not in form_details.schema or not form_details.schema.section)'
    )
    assert (
        template.index("DAG conf Parameters")
        < unsectioned
        < template.index('class="panel-collapse collapse"')
    )
    return None


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_the_cloud_fields_are_in_the_section_the_form_opens(
    dag_bag: Any, serialized_dags: dict[str, Any], dag_id: str
) -> None:
    """Airflow 3.3's trigger form opens only "Run Parameters"; Airflow 2's only the unsectioned fields."""
    opened = open_form_section()
    assert opened == FORM_OPEN_SECTION
    for dag in (dag_bag.dags[dag_id], serialized_dags[dag_id]):
        sections = {key: dag.params.get_param(key).schema.get("section") for key in dag.params}
        assert [key for key, section in sections.items() if section == opened] == [
            key for key in dag.params if key in CLOUD_KEYS[dag_id]
        ]
        first = list(dag.params)[: len(CLOUD_KEYS[dag_id])]
        assert set(first) == set(CLOUD_KEYS[dag_id])


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
@pytest.mark.parametrize("key", ["project", "bucket"])
def test_the_prefilled_examples_say_to_replace_them(dag_bag: Any, dag_id: str, key: str) -> None:
    param = dag_bag.dags[dag_id].params.get_param(key)

    assert param.value in ("my-tpu-project", "my-tpu-rl-bucket")
    assert f"prefilled {param.value} is an example: set {key} to" in param.description
    assert f"or have [tpu_rl] default_{key} prefill it for this Airflow" in param.description
    # the title, which the form shows in bold, marks what a user outside the sandbox must change
    assert param.schema["title"].endswith(" (example: replace it)")


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_only_the_fields_holding_an_example_are_marked(dag_bag: Any, dag_id: str) -> None:
    params = dag_bag.dags[dag_id].params
    marked = [
        key for key in params if params.get_param(key).schema["title"].endswith("(example: replace it)")
    ]
    assert marked == ["project", "bucket"]


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_a_switch_is_never_marked_required(dag_bag: Any, dag_id: str) -> None:
    """Airflow 3's form marks every field whose type lacks "null" as required, a switch too
    (compat.FORM_BOOLEAN_NULLABLE); Airflow 2's never marks a checkbox, drawn for "boolean" alone."""
    params = dag_bag.dags[dag_id].params
    switches = {key: params.get_param(key).schema["type"] for key in params if isinstance(params[key], bool)}
    assert {"delete_bucket"} < set(switches)
    expected = ["boolean", "null"] if FORM_BOOLEAN_NULLABLE else "boolean"
    assert switches == dict.fromkeys(switches, expected)
    for key in switches:  # the REST API could send null: validate refuses it in one line
        with pytest.raises(AirflowFailException, match=f"{key}: must be true or false"):
            run_validate(dag_id, {key: None})


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_the_rules_the_form_shows_are_words_not_regexes(dag_bag: Any, dag_id: str) -> None:
    params = dag_bag.dags[dag_id].params
    shown = [params.get_param(key).description.split(" Rule: ", 1) for key in params]
    rules_shown = [parts[1] for parts in shown if len(parts) == 2]
    assert len(rules_shown) >= 8
    for rule in rules_shown:
        assert not set("[]{}^$*+\\|") & set(rule), rule


def test_both_model_dropdowns_label_a_preset_in_one_style(dag_bag: Any) -> None:
    labels = {
        dag_id: dag_bag.dags[dag_id].params.get_param("model").schema["values_display"]
        for dag_id in PIPELINE_DAG_IDS
    }
    assert labels[GKE_DAG_ID]["qwen3-30b-a3b"] == (
        "qwen3-30b-a3b: Qwen/Qwen3-30B-A3B-Instruct-2507 on TPU v6e-32 (4x8)"
    )
    assert labels[TPU_VM_DAG_ID]["llama3.1-8b-Instruct"] == (
        "llama3.1-8b-Instruct: MaxText's checkpoint on TPU v6e-8 (2x4)"
    )
    style = re.compile(r"^(?P<model>[\w.-]+): \S.* on TPU v6e-\d+ \(\d+x\d+\)$")
    for shown in labels.values():
        for model, label in shown.items():
            found = style.match(label)
            assert found is not None, label
            assert found["model"] == model, label


ENVIRONMENT = {
    "AIRFLOW__TPU_RL__DEFAULT_PROJECT": "team-tpu-project",
    "AIRFLOW__TPU_RL__DEFAULT_REGION": "europe-west4",
    "AIRFLOW__TPU_RL__DEFAULT_ZONE": "europe-west4-a",
    "AIRFLOW__TPU_RL__DEFAULT_BUCKET": "team-tpu-rl-bucket",
    "AIRFLOW__TPU_RL__DEFAULT_GKE_RESERVATION": "team-v6e-32",
    "AIRFLOW__TPU_RL__DEFAULT_TPU_VM_RESERVATION": "team-v6e-8",
    "AIRFLOW__TPU_RL__DEFAULT_AUTHORIZED_CIDR": "203.0.113.0/24",
    "AIRFLOW__TPU_RL__DEFAULT_SERVICE_ACCOUNT": "tpu-rl-vm@team-tpu-project.iam.gserviceaccount.com",
    "AIRFLOW__TPU_RL__DEFAULT_HF_TOKEN_SECRET": "team-hf-token",
}
ENVIRONMENT_DEFAULTS = {
    GKE_DAG_ID: {
        "project": "team-tpu-project",
        "region": "europe-west4",
        "zone": "europe-west4-a",
        "bucket": "team-tpu-rl-bucket",
        "reservation": "team-v6e-32",
        "authorized_cidr": "203.0.113.0/24",
        "hf_token_secret": "team-hf-token",
    },
    TPU_VM_DAG_ID: {
        "project": "team-tpu-project",
        "zone": "europe-west4-a",
        "bucket": "team-tpu-rl-bucket",
        "reservation": "team-v6e-8",
        "service_account": "tpu-rl-vm@team-tpu-project.iam.gserviceaccount.com",
        "hf_token_secret": "team-hf-token",
    },
}


def parse_dag_file(dag_id: str) -> Any:
    """The DAG file imported afresh (what the DAG processor does), so it reads the config now."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{dag_id}_env_test", DAGS_DIR / f"{dag_id}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_the_environment_options_prefill_the_form_and_the_untouched_form_validates(
    monkeypatch: pytest.MonkeyPatch, dag_id: str
) -> None:
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    form = parse_dag_file(dag_id).dag.params
    params = {key: form.get_param(key) for key in form}

    prefilled = {key: params[key].value for key in ENVIRONMENT_DEFAULTS[dag_id]}
    assert prefilled == ENVIRONMENT_DEFAULTS[dag_id]
    for key in ENVIRONMENT_DEFAULTS[dag_id]:
        assert "Prefilled from this Airflow's [tpu_rl] default_" in params[key].description
        assert "is an example" not in params[key].description
    # the environment's reservation is the runs' capacity unless a run says otherwise
    assert params["capacity"].value == "reservation"
    assert "Prefilled reservation: [tpu_rl] default_" in params["capacity"].description
    # The untouched form (no conf at all) passes validate.
    values = {key: param.value for key, param in params.items()}
    resolved = validate_pipeline_conf(dag_id, "manual__2026-01-01T00:00:00", {}, values)
    assert {key: resolved[key] for key in ("project", "bucket", "reservation")} == {
        key: ENVIRONMENT_DEFAULTS[dag_id][key] for key in ("project", "bucket", "reservation")
    }
    assert resolved["capacity"] == "reservation"
    # a REST conf clearing the reservation, with no capacity, runs on-demand (as the spec reads it)
    cleared = validate_pipeline_conf(
        dag_id, "manual__2026-01-01T00:00:00", {"reservation": None}, {**values, "reservation": None}
    )
    assert (cleared["capacity"], cleared["reservation"]) == ("on-demand", "")


def test_an_environment_option_the_form_would_refuse_fails_the_parse_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__TPU_RL__DEFAULT_ZONE", "Europe West")
    with pytest.raises(ValueError, match=r"^\[tpu_rl\] default_zone: 'Europe West' is not a valid Zone"):
        parse_dag_file(GKE_DAG_ID)


def test_every_environment_option_is_declared_in_the_provider_config() -> None:
    from airflow_provider_tpu_rl.get_provider_info import get_provider_info
    from airflow_provider_tpu_rl.spec.pipeline import ENVIRONMENT_OPTIONS

    declared = get_provider_info()["config"]["tpu_rl"]["options"]
    for options in ENVIRONMENT_OPTIONS.values():
        for option in options.values():
            assert declared[option]["default"] == ""
            assert declared[option]["type"] == "string"
            assert "prefill" in declared[option]["description"]


def test_authorized_cidr_keeps_the_open_default_and_says_what_it_opens(dag_bag: Any) -> None:
    param = dag_bag.dags[GKE_DAG_ID].params.get_param("authorized_cidr")

    assert param.value == "0.0.0.0/0"
    text = param.description
    assert "control plane's authorized networks" in text
    assert "0.0.0.0/0" in text
    assert "whole internet" in text
    assert "Composer" in text
    assert "egress range" in text


def test_the_machine_type_dropdown_counts_chips_in_good_english(dag_bag: Any) -> None:
    shown = dag_bag.dags[GKE_DAG_ID].params.get_param("compute_type").schema["values_display"]

    assert shown["ct6e-standard-1t"] == "ct6e-standard-1t (1 chip per VM)"
    assert shown["ct6e-standard-4t"] == "ct6e-standard-4t (4 chips per VM)"
    assert shown["ct6e-standard-8t"] == "ct6e-standard-8t (8 chips per VM)"
    assert not any("1 chips" in text for text in shown.values() if text)


def test_the_sweep_example_takes_its_cloud_fields_from_the_same_environment_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hand-written example reads the forms' ``[tpu_rl] default_*`` (``environment_defaults``)."""
    for name in [n for n in os.environ if n.startswith("AIRFLOW__TPU_RL__DEFAULT_")]:
        monkeypatch.delenv(name)
    cloud = ("project", "region", "zone", "bucket", "reservation")
    params = parse_dag_file(SWEEP_DAG_ID).dag.params
    assert {key: params[key] for key in cloud} == {
        "project": "my-tpu-project",
        "region": "us-east5",
        "zone": "us-east5-b",
        "bucket": "my-tpu-rl-bucket",
        "reservation": "",
    }
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    params = parse_dag_file(SWEEP_DAG_ID).dag.params
    assert {key: params[key] for key in cloud} == {
        key: ENVIRONMENT_DEFAULTS[GKE_DAG_ID][key] for key in cloud
    }


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_every_field_is_draft_07_and_its_dialect_still_refuses(dag_bag: Any, dag_id: str) -> None:
    """Each Param's schema names draft-07 (the cheaper metaschema jsonschema checks it against on
    every resolve), is valid draft-07, and Airflow's resolve still refuses what its keywords refuse."""
    from jsonschema import Draft7Validator, validators

    dag_params = dag_bag.dags[dag_id].params
    for key in dag_params:
        schema = dag_params.get_param(key).schema
        assert validators.validator_for(schema) is Draft7Validator, key
        Draft7Validator.check_schema(schema)
    bad = {"project": 7, "num_batches": "ten", "model": "no-such-model"}
    for key, value in bad.items():
        with pytest.raises(ParamValidationError):
            dag_params.get_param(key).resolve(value)


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_the_reservation_may_be_left_empty_on_both_forms(
    serialized_dags: dict[str, Any], dag_id: str
) -> None:
    """Spot, flex-start and on-demand take no reservation: the field is not required (the TPU VM
    form's was, and "This field is required" disabled its Trigger button once it was cleared)."""
    schema = serialized_dags[dag_id].params.get_param("reservation").schema
    assert "null" in schema["type"], schema
    for empty in (None, ""):
        conf = {"capacity": "spot", "reservation": empty}
        trigger_time_validate(serialized_dags[dag_id], conf)
        resolved = run_validate(dag_id, conf)
        assert (resolved["capacity"], resolved["reservation"]) == ("spot", "")


@pytest.mark.parametrize("dag_id", PIPELINE_DAG_IDS)
def test_the_capacity_fallback_is_a_list_field_whose_lines_keep_their_order(
    serialized_dags: dict[str, Any], dag_id: str
) -> None:
    """A plain array of strings, nullable, no choices: Airflow 2.11's form renders it as a textarea
    of one item a line (its valuetype="array", trimmed lines, none = null) and Airflow 3.3's as its
    string-array textarea (the lines as typed, blank ones too); "examples" or "enum" would make
    both a multi-select, whose 2.11 version submits in the options' order."""
    param = serialized_dags[dag_id].params.get_param("capacity_fallback")
    schema = {key: value for key, value in param.schema.items() if key not in {"title", "description"}}
    expected = {
        "type": ["null", "array"],
        "items": {"type": "string"},
        "$schema": "http://json-schema.org/draft-07/schema#",
    }
    if FORM_OPEN_SECTION is not None:  # Airflow 2: the open part's fields have no section
        expected["section"] = FORM_OPEN_SECTION
    assert schema == expected, schema
    assert param.value == []
    base = {"capacity": "spot", "reservation": ""}
    for submitted in (["on-demand", "flex-start"], ["on-demand", "flex-start", ""], [" on-demand "]):
        trigger_time_validate(serialized_dags[dag_id], {**base, "capacity_fallback": submitted})
    for emptied in (None, [], [""]):
        trigger_time_validate(serialized_dags[dag_id], {**base, "capacity_fallback": emptied})
        assert run_validate(dag_id, {**base, "capacity_fallback": emptied})["capacity"] == "spot"
    resolved = run_validate(dag_id, {**base, "capacity_fallback": ["on-demand", "flex-start", ""]})
    assert resolved["capacity"] == ["spot", "on-demand", "flex-start"]
