"""Building blocks shared by the two pipeline DAGs: the trigger form, ``validate``, the ledger
record, the watcher. The DAG files in ``dags/`` only list their tasks.

Nothing here runs at import time beyond building Params; no cloud call, no rendering.
"""

from __future__ import annotations

import copy
import logging
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final

from airflow.providers.common.compat.sdk import (
    DAG,
    Param,
    TaskGroup,
    TriggerRule,
    chain,
    get_current_context,
    task,
)

from airflow_provider_tpu_rl.compat import (
    FORM_BOOLEAN_NULLABLE,
    FORM_NULL_CHOICE,
    FORM_OPEN_SECTION,
    AirflowFailException,
    conf,
)
from airflow_provider_tpu_rl.ledger.collect import task_states
from airflow_provider_tpu_rl.ledger.hook import record_run_started, step_callbacks
from airflow_provider_tpu_rl.operators.ledger import RecordRunOperator, run_settings
from airflow_provider_tpu_rl.operators.pipeline import (
    ERROR_XCOM_KEY,
    fail_in_one_line,
    failure_summary,
    note_failure,
    validate_pipeline_conf,
)
from airflow_provider_tpu_rl.spec import PRESETS, Runner, rules
from airflow_provider_tpu_rl.spec.cluster import CAPACITIES, RESERVATION, SliceShape
from airflow_provider_tpu_rl.spec.pipeline import PLACEHOLDERS
from airflow_provider_tpu_rl.spec.presets import presets_for
from airflow_provider_tpu_rl.timeouts import job_timeout, task_timeout

log = logging.getLogger(__name__)

LEDGER_CONN_ID: Final = "tpu_rl_ledger"
WATCHER_TASK_ID: Final = "watcher"
# The trigger form opens only its default section, "Run Parameters" (where params without a
# section go): Airflow 3.3's airflow-core/src/airflow/ui/src/components/ConfigForm.tsx renders the
# FlexibleForm inside <Accordion.Root defaultValue={[flexibleFormDefaultSection]}>, and
# FlexibleForm.tsx sets flexibleFormDefaultSection = "Run Parameters". The Cloud fields, which every
# user must change, are in it; the other sections start closed. Airflow 2's form opens only the
# params without a section (compat.FORM_OPEN_SECTION): there the Cloud fields have none.
UI_DEFAULT_SECTION: Final = "Run Parameters"
CLOUD, CLUSTER, VM, MODEL, SAFETY = UI_DEFAULT_SECTION, "Cluster", "VM", "Model & training", "Safety"


def optional(pattern: re.Pattern[str]) -> str:
    """The rule's regex, or the empty string (which, like null, means "the preset's value")."""
    return f"^$|(?:{pattern.pattern})"


VALIDATED_MACRO: Final = "validated"
# validate's XCom, per task try: (dag_id, run_id, task_id, map_index, try_number) -> the values
_validated_cache: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_VALIDATED_CACHE_SIZE: Final = 32


def validated(ti: Any) -> Any:
    """The ``validate`` task's XCom (the derived values), pulled once per task try.

    Every templated field of a pipeline task reads it (:func:`xcom`), and Airflow renders each
    field on its own: without this, a task makes one XCom request per field (about ten).
    """
    key = (ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1), getattr(ti, "try_number", None))
    if key not in _validated_cache:
        _validated_cache[key] = ti.xcom_pull(task_ids="validate")
        while len(_validated_cache) > _VALIDATED_CACHE_SIZE:
            _validated_cache.popitem(last=False)
    return _validated_cache[key]


def xcom(key: str) -> str:
    """Template reading one derived value from the ``validate`` task's XCom (:func:`validated`;
    the DAG gets it from :data:`PIPELINE_MACROS`)."""
    return "{{ " + VALIDATED_MACRO + "(ti)['" + key + "'] }}"


# A pipeline DAG's ``user_defined_macros``: what :func:`xcom` templates call.
PIPELINE_MACROS: Final[dict[str, Any]] = {VALIDATED_MACRO: validated}


def model_label(model: str) -> str:
    """A model preset in the forms' dropdowns, one style on both pipelines:
    ``qwen3-30b-a3b: Qwen/Qwen3-30B-A3B-Instruct-2507 on TPU v6e-32 (4x8)``."""
    preset = PRESETS[model]
    checkpoint = preset.hf_model_path or "MaxText's checkpoint"
    shape = SliceShape(preset.compute_type, preset.topology)
    slices = f" x {preset.num_slices}" if preset.num_slices > 1 else ""
    return f"{model}: {checkpoint} on TPU {shape.tpu_type}{slices} ({preset.topology})"


def model_field(runner: Runner, description: str) -> dict[str, Any]:
    models = presets_for(runner)
    return {
        "title": "Model",
        "section": MODEL,
        "description": description,
        "type": "string",
        "enum": models,
        "values_display": {m: model_label(m) for m in models},
    }


def replace_example(value: str, todo: str, option: str | None) -> str:
    """Help text for a field prefilled with the form's example (a placeholder) to replace."""
    once = f", or have [tpu_rl] {option} prefill it for this Airflow" if option else ""
    return f"The prefilled {value} is an example: {todo} (validate refuses it){once}."


# What a field still holding the form's example adds to its title: the fields a user outside the
# sandbox must change before the first run.
EXAMPLE_MARK: Final = " (example: replace it)"


def from_environment(option: str) -> str:
    """Help text for a field prefilled from this Airflow's configuration."""
    return f"Prefilled from this Airflow's [tpu_rl] {option}."


RUN_NAME_HELP: Final = (
    "MaxText run_name: the folder of this run's checkpoints and export (trained/RUN_NAME/, "
    "hf-trained/RUN_NAME/). Empty = a name unique to this DAG run, so every run trains its own "
    "model. Give an earlier run's name only on purpose, to resume that run: it goes on from that "
    "run's checkpoints, and never starts a second job on a folder a live job is writing."
)

# Form metadata of the keys both pipelines have; each DAG adds or overrides its own.
COMMON_FORM: Final[dict[str, dict[str, Any]]] = {
    "project": {
        "title": "GCP project",
        "section": CLOUD,
        "description": "Project ID that owns the TPUs, the bucket and the reservation.",
        "type": "string",
        "pattern": rules.PROJECT_ID.pattern,
        "rule": rules.PROJECT_ID_RULE,
    },
    "zone": {
        "title": "Zone",
        "section": CLOUD,
        "description": "Zone of the TPUs and their reservation, e.g. us-east5-b.",
        "type": "string",
        "pattern": rules.ZONE.pattern,
        "rule": rules.ZONE_RULE,
    },
    "capacity": {
        "title": "TPU capacity",
        "section": CLOUD,
        "description": (
            "How the TPUs are provisioned. on-demand (the default): the list price, no reservation, "
            "no preemption; the zone needs free v6e capacity and quota. reservation: from the "
            "reservation named in reservation. spot: Spot VMs, much cheaper but preemptible at any "
            "time; training resumes from its newest checkpoint. flex-start: Dynamic Workload "
            "Scheduler capacity, queued until free, then runs for a bounded time without preemption. "
            "Only reservation takes a reservation: leave it empty for the others. See the README's "
            "capacity table."
        ),
        "type": "string",
        "enum": list(CAPACITIES),
    },
    "bucket": {
        "title": "GCS bucket",
        "section": CLOUD,
        "description": "Bucket name without gs://. Created if missing, kept afterwards (see delete_bucket); "
        "bucket names are global.",
        "type": "string",
        "pattern": rules.BUCKET_CHARS.pattern,
        "rule": rules.BUCKET_CHARS_RULE,
        "minLength": 3,
        "maxLength": 222,
    },
    "hf_model_path": {
        "title": "Hugging Face checkpoint",
        "section": MODEL,
        "description": "HF repo id to convert (org/model); empty = the preset's.",
        "type": ["null", "string"],
        "pattern": optional(rules.HF_REPO_ID),
        "rule": rules.HF_REPO_ID_RULE,
    },
    "run_name": {
        "title": "Training run name",
        "section": MODEL,
        "description": RUN_NAME_HELP,
        "type": ["null", "string"],
        "pattern": optional(rules.RUN_NAME),
        "rule": rules.RUN_NAME_RULE,
    },
    "num_batches": {
        "title": "Training batches (steps)",
        "section": MODEL,
        "description": "GRPO steps; the exported checkpoint is the one of the last step. Empty = 50 (at most 10,000,000).",
        "type": ["null", "integer"],
        "minimum": 1,
    },
    "train_overrides": {
        "title": "MaxText overrides",
        "section": MODEL,
        "description": (
            'Extra train_rl key=value overrides as a JSON object, e.g. {"learning_rate": 1e-5}. Keys are '
            "checked against the MaxText release that runs them (0.2.4 on GKE, 0.2.3 on the TPU VM) and "
            "values against the key's type; paths, model_name, run_name, num_batches (use its field) "
            "and the HF token cannot be set here. Evaluation (the mean reward before and after "
            "training): MaxText greedily answers num_test_batches batches of batch_size test prompts "
            "before training, after it and every eval_interval (10) steps; the presets evaluate 2 batches "
            "(Qwen: 2 x 8 prompts, 7 evaluations over 50 steps = 112 answers, fewer generations than 4 "
            "training steps' rollouts), Gemma 5, Llama 10. "
            '{"num_test_batches": 0} turns it off: no reward is recorded.'
        ),
        "type": "object",
        "propertyNames": {"pattern": rules.MAXTEXT_KEY.pattern},
        "rule": rules.MAXTEXT_KEY_RULE,
        # null too: a NaN in the JSON reaches the task as null, and validate names it in one line
        "additionalProperties": {"type": ["null", "string", "number", "boolean", "object", "array"]},
    },
    "hf_token_conn_id": {
        "title": "HF token connection",
        "section": MODEL,
        "description": "Airflow connection holding the Hugging Face token (synced to Secret Manager).",
        "type": "string",
        "pattern": rules.CONN_ID.pattern,
        "rule": rules.CONN_ID_RULE,
    },
    "hf_token_secret": {
        "title": "HF token secret",
        "section": MODEL,
        "description": "Existing Secret Manager secret with the token; empty = sync from the connection.",
        "type": ["null", "string"],
        "pattern": optional(rules.SECRET_ID),
        "rule": rules.SECRET_ID_RULE,
    },
    "delete_bucket": {
        "title": "Delete the bucket",
        "section": SAFETY,
        "description": "Delete the bucket at teardown: this DELETES THE TRAINED MODEL. Off by default.",
        "type": "boolean",
    },
    "cancel_previous_writer": {
        "title": "Stop an orphaned job on this run_name",
        "section": SAFETY,
        "description": (
            "When run_name resumes a run whose worker crashed (its claim expired or its run ended) "
            "but whose job still trains or exports on its cluster or VM: stop that job and take its "
            "folder over. Off: this run refuses and names the job and how to stop it. A live run's "
            "job is never stopped."
        ),
        "type": "boolean",
    },
}


def pipeline_params(
    defaults: Mapping[str, Any],
    form: Mapping[str, dict[str, Any]],
    options: Mapping[str, str] | None = None,
) -> dict[str, Param]:
    """One Param per conf key: its default and the form metadata (common, then own).

    A key with a ``[tpu_rl]`` option in ``options`` (field → option, ``ENVIRONMENT_OPTIONS``)
    takes the option's value as its default when the option is set (a reservation set there makes
    ``reservation`` the capacity's default, as a conf naming a reservation and no capacity means);
    a field still holding the form's example says so in its title and help text.
    """
    merged = {**COMMON_FORM, **form}
    values = dict(defaults)
    metadata = {key: dict(merged[key]) for key in defaults}
    for key, configured in environment_defaults(options or {}, merged).items():
        values[key] = configured
        metadata[key]["description"] += " " + from_environment((options or {})[key])
    if "capacity" in values and values.get("reservation"):
        # a reservation every run of this Airflow shares: the form consumes it unless told otherwise
        values["capacity"] = RESERVATION
        metadata["capacity"]["description"] += (
            f" Prefilled {RESERVATION}: [tpu_rl] {(options or {})['reservation']} names this Airflow's "
            "reservation."
        )
    for key, (example, todo) in PLACEHOLDERS.items():
        if key in values and values[key] == example:
            metadata[key]["description"] += " " + replace_example(example, todo, (options or {}).get(key))
            metadata[key]["title"] += EXAMPLE_MARK
    # The open section (the Cloud fields) first, then the others in the spec's order.
    keys = sorted(defaults, key=lambda key: metadata[key].get("section") != CLOUD)
    return {key: Param(copy.deepcopy(values[key]), **form_schema(metadata[key])) for key in keys}


def environment_defaults(
    options: Mapping[str, str], form: Mapping[str, Mapping[str, Any]] = COMMON_FORM
) -> dict[str, str]:
    """field → its ``[tpu_rl]`` option's value, for the fields of ``options`` (field → option,
    ``spec.pipeline.ENVIRONMENT_OPTIONS[kind]``) whose option is set.

    What an untouched trigger form holds besides its own defaults: the forms
    (:func:`pipeline_params`), ``tpu-rl plan`` and the hand-written example DAGs all read them here.
    A value is checked against its field's pattern in ``form`` (the shared fields' by default; the
    spec checks the others): one that would be refused raises one line naming the option.
    """
    found = {}
    for key, option in options.items():
        configured = environment_default(option, form.get(key, {}))
        if configured is not None:
            found[key] = configured
    return found


def environment_default(option: str, metadata: Mapping[str, Any]) -> str | None:
    """``[tpu_rl] option`` when set (None when not), checked against the field's form pattern: a
    value the form would refuse fails the DAG's parse with one line naming the option."""
    value = (conf.get("tpu_rl", option, fallback="") or "").strip()
    if not value:
        return None
    pattern = metadata.get("pattern")
    if pattern and re.search(pattern, value) is None:
        raise ValueError(
            f"[tpu_rl] {option}: {value!r} is not a valid {metadata.get('title', option)} "
            f"(must match {pattern})"
        )
    return value


# The dialect of the forms' schemas. Airflow checks a value against its Param's schema with
# jsonschema.validate, which first checks the schema itself against its dialect's metaschema, on
# every resolve (each task's context resolves every Param). Without "$schema" that is 2020-12's,
# whose $dynamicRef metaschema makes the check about 3x dearer than draft-07's; the forms use no
# keyword draft-07 lacks (type, title, enum, pattern, minimum, maximum, min/maxLength,
# propertyNames, additionalProperties).
FORM_SCHEMA_DIALECT: Final = "http://json-schema.org/draft-07/schema#"


def form_schema(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A key's form metadata, its section the one the installed Airflow's trigger form opens,
    in the forms' JSON Schema dialect (``FORM_SCHEMA_DIALECT``).

    A field with a ``pattern`` carries the spec's ``rule`` for it (what ``validate`` says of a value
    the pattern refuses): it is added to the description, which the form shows next to the field,
    since the form's own refusal is a raw JSON-schema dump of the regex.

    A dropdown with a null choice ("the preset's value") where the form cannot submit null
    (``FORM_NULL_CHOICE``, Airflow 2) becomes a text field proposing the other choices; empty
    submits null, and ``anyOf`` still refuses anything but null and the choices.
    """
    schema = dict(metadata)
    if not FORM_NULL_CHOICE and None in schema.get("enum", ()):
        choices = [choice for choice in schema.pop("enum") if choice is not None]
        schema["examples"] = choices
        schema["anyOf"] = [{"type": "null"}, {"enum": choices}]
    rule = schema.pop("rule", None)
    patterned = "pattern" in schema or "pattern" in schema.get("propertyNames", {})
    if patterned and not rule:
        raise ValueError(f"form field {schema.get('title')!r} has a pattern but no rule to show")
    if rule:
        schema["description"] = f"{schema['description']} Rule: {rule}."
    if FORM_BOOLEAN_NULLABLE and schema.get("type") == "boolean":
        # a switch is always on or off: not "required" (validate refuses a null from the REST API)
        schema["type"] = ["boolean", "null"]
    if schema.get("section") == CLOUD and FORM_OPEN_SECTION is None:
        del schema["section"]
    schema["$schema"] = FORM_SCHEMA_DIALECT
    return schema


def pipeline_callbacks(conn_id: str = LEDGER_CONN_ID) -> dict[str, Any]:
    """Task callbacks of the pipelines' ``default_args``: the ledger's step rows, and on failure
    the first line of the error in XCom (what the watcher names)."""
    callbacks: dict[str, Any] = dict(step_callbacks(conn_id))
    callbacks["on_failure_callback"] = [callbacks["on_failure_callback"], note_failure]
    return callbacks


def bounded(stage: str) -> dict[str, Any]:
    """``execution_timeout`` of a task of ``stage`` (:func:`~airflow_provider_tpu_rl.timeouts.task_timeout`).

    Given to every task of the shipped DAGs. A job operator's own ``job_timeout`` defaults to a
    little less (:func:`~airflow_provider_tpu_rl.timeouts.job_timeout`), so it cancels its job first.
    """
    return {"execution_timeout": task_timeout(stage)}


def sensor_bounds() -> dict[str, Any]:
    """A checkpoint sensor's ``timeout`` (how long it waits, deferred or not) and its task's bound.

    In Airflow 3 a deferred task's wait is bounded by the trigger's timeout (the sensor's
    ``timeout``), not by ``execution_timeout``: the worker's deferral request leaves it out
    (airflow-core ``execution_api/routes/task_instances.py``, "TODO: HANDLE execution timeout
    later"); Airflow 2.11 bounds it by both (``TaskInstance._defer_task``). Both are set, the
    sensor's a little shorter so it fails with its own message.
    """
    return {
        "timeout": job_timeout("checkpoint").total_seconds(),
        "execution_timeout": task_timeout("checkpoint"),
    }


def validate_task() -> Any:
    """``validate``: refuse a bad conf (unknown keys included) before anything is spent."""

    # One XCom (return_value), not one per key: a dict return type would make TaskFlow push every
    # key apart too (``multiple_outputs``), ~30 more API calls that nothing reads.
    @task(task_id="validate", retries=0, multiple_outputs=False, **bounded("validate"))
    def validate() -> dict[str, Any]:
        """Check the whole conf with the spec; XCom the derived paths the sensors watch.

        A bad conf fails the task with its one line (no traceback: it is not a bug).
        """
        context = get_current_context()
        dag_run = context["dag_run"]
        try:
            resolved = validate_pipeline_conf(
                dag_run.dag_id, dag_run.run_id, dag_run.conf or {}, dict(context["params"])
            )
        except AirflowFailException as err:
            fail_in_one_line(str(err))
        note_run_started(context, resolved)
        return resolved

    return validate()


def note_run_started(context: Mapping[str, Any], resolved: Mapping[str, Any]) -> None:
    """List the validated run in the ledger as ``running``, with its settings (the runs dashboard
    shows it while it runs). A ledger error is logged, never raised: it must not fail the run."""
    try:
        record_run_started(
            context,
            model=str(resolved["model"]),
            chips=resolved.get("chips"),
            settings=run_settings(resolved),
            conn_id=LEDGER_CONN_ID,
        )
    except Exception:
        log.exception("ledger: could not list this run as running; it goes on")


def record_run_task(cluster_task_ids: Sequence[str], **collect_options: Any) -> RecordRunOperator:
    """``record_run``: a teardown writing the run, its steps, metrics and artifacts to the ledger,
    and the run's curves to a PNG in its output folder (linked from the task)."""
    return RecordRunOperator(
        task_id="record_run",
        conn_id=LEDGER_CONN_ID,
        cluster_task_ids=tuple(cluster_task_ids),
        # A failed destroy fails the run here too (it leaked a billed resource), as the watcher does.
        teardown_task_ids=(),
        ignored_task_ids=(WATCHER_TASK_ID,),
        collect_options=collect_options,
        **bounded("short"),
    ).as_teardown()


# The graph's groups of a pipeline's stages: what each holds, in words (the group's tooltip).
STAGE_GROUP_TOOLTIPS: Final[Mapping[str, str]] = {
    "prepare": "Checks, the bucket, the HF token secret and the machines the conversion runs on",
    "conversion": "Hugging Face checkpoint to MaxText, and its commit in the bucket",
    "training": "The billed TPUs: created, trained on until the actor checkpoint is committed, deleted",
    "export": "MaxText checkpoint to Hugging Face, and its commit in the bucket",
    "teardown": "What is left deleted, and the run recorded in the ledger",
}


def stage_group(group_id: str) -> TaskGroup:
    """A group of one of a pipeline's stages in the graph (``with stage_group("training"): ...``).

    Its tasks keep their own ids (``prefix_group_id=False``): the task orders, the ledger's rows,
    the watcher's and preflight's lines, ``tpu-rl plan`` and the docs name tasks by id.
    """
    return TaskGroup(group_id=group_id, prefix_group_id=False, tooltip=STAGE_GROUP_TOOLTIPS[group_id])


def chain_in_order(order: Sequence[str], dag: DAG) -> None:
    """Chain the DAG's tasks in the pipeline's task order (``GKE_TASK_ORDER`` / ``TPU_VM_TASK_ORDER``)."""
    by_id = dag.task_dict
    missing = [task_id for task_id in order if task_id not in by_id]
    if missing:
        raise ValueError(f"the DAG lacks tasks of its order: {missing}")
    chain(*(by_id[task_id] for task_id in order))


def add_watcher(dag: DAG) -> None:
    """Fail the run when any task failed, a teardown included (Airflow ignores those by default).

    Setups may not be directly upstream of a ONE_FAILED task; their failure reaches the watcher
    through their downstream tasks (upstream_failed).
    """

    @task(task_id=WATCHER_TASK_ID, trigger_rule=TriggerRule.ONE_FAILED, retries=0, **bounded("short"))
    def watcher() -> None:
        """Fail with one line naming the failed task(s) and the first line of each one's error."""
        context = get_current_context()
        ti = context["ti"]
        dag_tasks = getattr(context.get("dag"), "task_ids", None) or ()
        fail_in_one_line(
            failure_summary(
                task_states(context),
                lambda task_id: ti.xcom_pull(task_ids=task_id, key=ERROR_XCOM_KEY),
                order=list(dag_tasks),
                ignored=(WATCHER_TASK_ID,),
            )
        )

    [t for t in dag.tasks if not t.is_setup] >> watcher()
