"""Structured edits of the Cluster Toolkit ``gke-tpu-v6e-advanced.yaml`` blueprint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from airflow_provider_tpu_rl.spec.presets import BlueprintEdits

BLUEPRINT_RELPATH = "examples/gke-tpu-v6e/gke-tpu-v6e-advanced.yaml"
BLUEPRINT_FILENAME = "gke-tpu-v6e-advanced.yaml"
NODE_POOL_SA_MODULE = "node_pool_service_account"


class BlueprintError(ValueError):
    """The blueprint does not have the shape the edits expect."""


class QuotedStr(str):
    """A string always written in double quotes.

    gcluster reads blueprints with Go's yaml.v3 (YAML 1.2), where a plain ``123e45`` is a float;
    PyYAML (YAML 1.1) writes it unquoted. A run suffix or an expiry label can look like that.
    """

    __slots__ = ()


class _BlueprintDumper(yaml.SafeDumper):
    pass


_BlueprintDumper.add_representer(
    QuotedStr, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style='"')
)


def _modules(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    groups = doc.get("deployment_groups")
    if not isinstance(groups, list):
        raise BlueprintError("blueprint has no deployment_groups list")
    return [m for g in groups for m in (g.get("modules") or []) if isinstance(m, dict)]


def customize_blueprint(text: str, edits: BlueprintEdits, labels: Mapping[str, str] | None = None) -> str:
    """Apply the tutorial edits to the blueprint text and return the new YAML."""
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("vars"), dict):
        raise BlueprintError("blueprint must be a mapping with a 'vars' mapping")
    modules = _modules(doc)
    if edits.grant_storage_admin:
        sa = next((m for m in modules if m.get("id") == NODE_POOL_SA_MODULE), None)
        if sa is None:
            raise BlueprintError(f"blueprint has no module with id {NODE_POOL_SA_MODULE!r}")
        roles = list(sa.setdefault("settings", {}).get("project_roles") or [])
        if "storage.objectViewer" in roles:
            roles[roles.index("storage.objectViewer")] = "storage.admin"
        elif "storage.admin" not in roles:
            roles.append("storage.admin")
        sa["settings"]["project_roles"] = roles
    if edits.system_node_pool_machine_type is not None or edits.pin_system_node_pool_zone:
        cluster = next(
            (m for m in modules if "system_node_pool_machine_type" in (m.get("settings") or {})), None
        )
        if cluster is None:
            raise BlueprintError("blueprint has no module setting system_node_pool_machine_type")
        if edits.system_node_pool_machine_type is not None:
            cluster["settings"]["system_node_pool_machine_type"] = edits.system_node_pool_machine_type
        if edits.pin_system_node_pool_zone:
            cluster["settings"]["system_node_pool_zones"] = ["$(vars.zone)"]
    if labels:
        merged = dict(doc["vars"].get("labels") or {})
        merged.update(labels)
        doc["vars"]["labels"] = {key: QuotedStr(value) for key, value in merged.items()}
    return yaml.dump(doc, Dumper=_BlueprintDumper, sort_keys=False, default_flow_style=False)
