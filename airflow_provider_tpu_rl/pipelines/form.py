"""The trigger form of a pipeline: one ``Param`` per row of the run parameters' table
(``spec/params.py``), its default from this Airflow's ``[tpu_rl]`` option where one is set.

Nothing here runs at import time beyond building Params; no cloud call, no rendering.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from airflow.providers.common.compat.sdk import Param

from airflow_provider_tpu_rl.compat import FORM_BOOLEAN_NULLABLE, FORM_NULL_CHOICE, FORM_OPEN_SECTION, conf
from airflow_provider_tpu_rl.spec import params
from airflow_provider_tpu_rl.spec.cluster import RESERVATION
from airflow_provider_tpu_rl.spec.pipeline import PLACEHOLDERS

# The trigger form opens only its default section, "Run Parameters" (where params without a
# section go): Airflow 3.3's airflow-core/src/airflow/ui/src/components/ConfigForm.tsx renders the
# FlexibleForm inside <Accordion.Root defaultValue={[flexibleFormDefaultSection]}>, and
# FlexibleForm.tsx sets flexibleFormDefaultSection = "Run Parameters". The Cloud fields, which every
# user must change, are in it; the other sections start closed. Airflow 2's form opens only the
# params without a section (compat.FORM_OPEN_SECTION): there the Cloud fields have none.
UI_DEFAULT_SECTION: Final = params.CLOUD

# What a field still holding the form's example adds to its title: the fields a user outside the
# sandbox must change before the first run.
EXAMPLE_MARK: Final = " (example: replace it)"

# The dialect of the forms' schemas. Airflow checks a value against its Param's schema with
# jsonschema.validate, which first checks the schema itself against its dialect's metaschema, on
# every resolve (each task's context resolves every Param). Without "$schema" that is 2020-12's,
# whose $dynamicRef metaschema makes the check about 3x dearer than draft-07's; the forms use no
# keyword draft-07 lacks (type, title, enum, pattern, minimum, maximum, min/maxLength,
# propertyNames, additionalProperties).
FORM_SCHEMA_DIALECT: Final = "http://json-schema.org/draft-07/schema#"


def replace_example(value: str, todo: str, option: str | None) -> str:
    """Help text for a field prefilled with the form's example (a placeholder) to replace."""
    once = f", or have [tpu_rl] {option} prefill it for this Airflow" if option else ""
    return f"The prefilled {value} is an example: {todo} (validate refuses it){once}."


def from_environment(option: str) -> str:
    """Help text for a field prefilled from this Airflow's configuration."""
    return f"Prefilled from this Airflow's [tpu_rl] {option}."


def pipeline_params(pipeline: str, keys: Iterable[str] | None = None, **defaults: Any) -> dict[str, Param]:
    """One Param per conf key of ``pipeline`` (``gke`` or ``tpu_vm``): its default and its form
    metadata from the table, the open section's fields first.

    A key with a ``[tpu_rl]`` option takes the option's value as its default when the option is
    set (a reservation set there makes ``reservation`` the capacity's default, as a conf naming a
    reservation and no capacity means); a field still holding the form's example says so in its
    title and help text. ``keys`` picks some of the pipeline's keys (a hand-written DAG's form) and
    ``defaults`` gives some of them another default.
    """
    fields = params.form_fields(pipeline)
    chosen = list(fields) if keys is None else list(keys)
    unknown = [key for key in chosen + list(defaults) if key not in fields]
    if unknown:
        raise ValueError(f"not a conf key of the {pipeline} pipeline: {unknown}")
    options = params.environment_options_of(pipeline)
    values = {key: params.PARAMS_BY_KEY[key].default_on(pipeline) for key in chosen}
    metadata = {key: dict(fields[key]) for key in chosen}
    for key, configured in environment_defaults(
        {key: option for key, option in options.items() if key in values}, fields
    ).items():
        values[key] = configured
        metadata[key]["description"] += " " + from_environment(options[key])
    if "capacity" in values and values.get("reservation"):
        # a reservation every run of this Airflow shares: the form consumes it unless told otherwise
        values["capacity"] = RESERVATION
        metadata["capacity"]["description"] += (
            f" Prefilled {RESERVATION}: [tpu_rl] {options['reservation']} names this Airflow's reservation."
        )
    values.update(defaults)
    for key, (example, todo) in PLACEHOLDERS.items():
        if key in values and values[key] == example:
            metadata[key]["description"] += " " + replace_example(example, todo, options.get(key))
            metadata[key]["title"] += EXAMPLE_MARK
    ordered = sorted(chosen, key=lambda key: metadata[key].get("section") != UI_DEFAULT_SECTION)
    return {key: Param(copy.deepcopy(values[key]), **form_schema(metadata[key])) for key in ordered}


def environment_defaults(
    options: Mapping[str, str], form: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, str]:
    """field → its ``[tpu_rl]`` option's value, for the fields of ``options`` (field → option,
    ``spec.pipeline.ENVIRONMENT_OPTIONS[pipeline]``) whose option is set.

    What an untouched trigger form holds besides its own defaults: the forms
    (:func:`pipeline_params`), ``tpu-rl plan`` and the hand-written example DAGs all read them here.
    A value is checked against its field's pattern in ``form`` (the table's, by default): one
    that would be refused raises one line naming the option.
    """
    found = {}
    for key, option in options.items():
        metadata = form[key] if form is not None and key in form else _any_form_field(key)
        configured = environment_default(option, metadata)
        if configured is not None:
            found[key] = configured
    return found


def _any_form_field(key: str) -> Mapping[str, Any]:
    param = params.PARAMS_BY_KEY.get(key)
    return param.form_field(param.pipelines[0]) if param is not None else {}


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


def form_schema(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A key's form metadata, its section the one the installed Airflow's trigger form opens,
    in the forms' JSON Schema dialect (``FORM_SCHEMA_DIALECT``).

    The field's value rules (``params.VALUE_RULES``: pattern, bounds, length) are not in the
    Param's schema: Airflow would refuse a value breaking one before any task runs, with
    jsonschema's message and the schema dumped over ~40 lines (in the form, the REST API and
    ``airflow dags test``). ``validate`` refuses it in one line naming the field and the rule
    (the spec's ``check_value_rules``), and the rule, in words, is added to the description, which
    the form shows next to the field. A field with a ``pattern`` must carry the spec's ``rule``.

    A dropdown with a null choice ("the preset's value") where the form cannot submit null
    (``FORM_NULL_CHOICE``, Airflow 2) becomes a text field proposing the other choices; empty
    submits null, and ``anyOf`` still refuses anything but null and the choices.
    """
    schema = dict(metadata)
    if not FORM_NULL_CHOICE and None in schema.get("enum", ()):
        choices = [choice for choice in schema.pop("enum") if choice is not None]
        schema["examples"] = choices
        schema["anyOf"] = [{"type": "null"}, {"enum": choices}]
    patterned = "pattern" in schema or "pattern" in schema.get("propertyNames", {})
    if patterned and not schema.get("rule"):
        raise ValueError(f"form field {schema.get('title')!r} has a pattern but no rule to show")
    words = params.value_rule_words(schema)
    for keyword in (*params.VALUE_RULES, "rule"):
        schema.pop(keyword, None)
    if words:
        schema["description"] = f"{schema['description']} Rule: {words}."
    if FORM_BOOLEAN_NULLABLE and schema.get("type") == "boolean":
        # a switch is always on or off: not "required" (validate refuses a null from the REST API)
        schema["type"] = ["boolean", "null"]
    if schema.get("section") == UI_DEFAULT_SECTION and FORM_OPEN_SECTION is None:
        del schema["section"]
    schema["$schema"] = FORM_SCHEMA_DIALECT
    return schema
