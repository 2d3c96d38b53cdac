"""Declarative connection-form metadata for this provider's connection types.

Plain dicts in the provider-info format (``conn-fields`` / ``ui-field-behaviour``) that Airflow 3.2+
reads without importing the hooks; the hooks derive their legacy ``get_connection_form_widgets`` /
``get_ui_field_behaviour`` from the same data. No Airflow import here.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_tpu_rl.toolchain.pins import PACKER_DEFAULT_VERSION, TERRAFORM_DEFAULT_VERSION

CLUSTER_TOOLKIT_DEFAULT_VERSION = "v1.103.0"

_STRING = ["string", "null"]

GCLUSTER_CONN_FIELDS: dict[str, dict[str, Any]] = {
    "project": {"label": "Project Id", "schema": {"type": _STRING}},
    "region": {"label": "Region", "schema": {"type": _STRING}},
    "zone": {"label": "Zone", "schema": {"type": _STRING}},
    "gcluster_path": {
        "label": "gcluster binary",
        "description": "Path to an installed gcluster; empty = use or download the release bundle.",
        "schema": {"type": _STRING},
    },
    "gcloud_path": {
        "label": "gcloud binary",
        "description": "Path to gcloud; empty = look it up on PATH.",
        "schema": {"type": _STRING},
    },
    "bundle_dir": {
        "label": "Bundle folder",
        "description": "The Cluster Toolkit folder that holds examples/ (the bundle root).",
        "schema": {"type": _STRING},
    },
    "cache_dir": {
        "label": "Cache folder",
        "description": "Where downloaded bundles are kept (default ~/.cache/airflow-provider-tpu-rl).",
        "schema": {"type": _STRING},
    },
    "version": {
        "label": "Cluster Toolkit version",
        "schema": {"type": _STRING, "default": CLUSTER_TOOLKIT_DEFAULT_VERSION},
    },
    "sha256": {
        "label": "Bundle SHA-256",
        "description": "SHA-256 of gcluster_bundle_<os>_<arch>.tgz; required to download the bundle.",
        "schema": {"type": _STRING},
    },
    "inherit_env": {
        "label": "Inherited environment",
        "description": (
            "Worker environment variables passed on to gcluster/gcloud besides the built-in allow-list "
            "(PATH, proxies, CLOUDSDK_*): a JSON list of names; NAME* is a prefix."
        ),
        "schema": {"type": ["array", "null"], "items": {"type": "string"}},
    },
    "download_base_url": {
        "label": "Release download URL",
        "description": "Base URL of the release assets (a mirror); <base>/<version>/<asset>.",
        "schema": {"type": _STRING},
    },
    "terraform_version": {
        "label": "Terraform version",
        "description": (
            "Minimum Terraform taken from PATH, and the version installed into the cache otherwise "
            "(default: what the pinned gcluster requires)."
        ),
        "schema": {"type": _STRING, "default": TERRAFORM_DEFAULT_VERSION},
    },
    "terraform_sha256": {
        "label": "Terraform zip SHA-256",
        "description": (
            "SHA-256 of terraform_<version>_<os>_<arch>.zip, or a JSON object keyed linux_amd64 etc.; "
            "needed only for a non-default terraform_version."
        ),
        "schema": {"type": _STRING},
    },
    "packer_version": {
        "label": "Packer version",
        "description": "The Packer installed into the cache when none is on PATH.",
        "schema": {"type": _STRING, "default": PACKER_DEFAULT_VERSION},
    },
    "packer_sha256": {
        "label": "Packer zip SHA-256",
        "description": (
            "SHA-256 of packer_<version>_<os>_<arch>.zip, or a JSON object keyed linux_amd64 etc.; "
            "needed only for a non-default packer_version."
        ),
        "schema": {"type": _STRING},
    },
    "hashicorp_base_url": {
        "label": "HashiCorp releases URL",
        "description": "Base URL for Terraform/Packer zips (a mirror); <base>/<tool>/<version>/<zip>.",
        "schema": {"type": _STRING},
    },
    "install_tools": {
        "label": "Install Terraform/Packer",
        "description": (
            "true (default): download the pinned, checksum-verified Terraform/Packer into the cache "
            "when PATH lacks them; false: only use what is on PATH."
        ),
        "schema": {"type": ["boolean", "null"], "default": True},
    },
}

GCLUSTER_UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": ["host", "schema", "login", "password", "port"],
    "relabeling": {},
    "placeholders": {
        "version": CLUSTER_TOOLKIT_DEFAULT_VERSION,
        "project": "my-gcp-project",
        "terraform_version": TERRAFORM_DEFAULT_VERSION,
        "packer_version": PACKER_DEFAULT_VERSION,
        "install_tools": "true",
    },
}

HUGGINGFACE_CONN_FIELDS: dict[str, dict[str, Any]] = {
    "token": {
        "label": "Token (fallback)",
        "description": "Used only when the password field is empty.",
        "schema": {"type": _STRING, "format": "password"},
    },
}

HUGGINGFACE_UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": ["host", "schema", "login", "port"],
    "relabeling": {"password": "Hugging Face token"},
    "placeholders": {},
}


def connection_types() -> list[dict[str, Any]]:
    """The ``connection-types`` entries for ``get_provider_info()``."""
    return [
        {
            "hook-class-name": "airflow_provider_tpu_rl.hooks.gcluster.GclusterHook",
            "hook-name": "Cluster Toolkit (gcluster)",
            "connection-type": "gcluster",
            "conn-fields": GCLUSTER_CONN_FIELDS,
            "ui-field-behaviour": GCLUSTER_UI_FIELD_BEHAVIOUR,
        },
        {
            "hook-class-name": "airflow_provider_tpu_rl.hooks.hf_token.HuggingFaceTokenHook",
            "hook-name": "Hugging Face token",
            "connection-type": "huggingface",
            "conn-fields": HUGGINGFACE_CONN_FIELDS,
            "ui-field-behaviour": HUGGINGFACE_UI_FIELD_BEHAVIOUR,
        },
    ]


def legacy_form_widgets(fields: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """wtforms fields for Airflow < 3.2 (needs flask-appbuilder; ImportError otherwise)."""
    from flask_appbuilder.fieldwidgets import BS3PasswordFieldWidget, BS3TextFieldWidget
    from flask_babel import lazy_gettext
    from wtforms import BooleanField, PasswordField, StringField

    widgets: dict[str, Any] = {}
    for name, spec in fields.items():
        label = lazy_gettext(spec["label"])
        if "boolean" in spec["schema"]["type"]:
            widgets[name] = BooleanField(label, default=spec["schema"].get("default"))
        elif spec["schema"].get("format") == "password":
            widgets[name] = PasswordField(label, widget=BS3PasswordFieldWidget())
        else:
            widgets[name] = StringField(
                label, widget=BS3TextFieldWidget(), default=spec["schema"].get("default")
            )
    return widgets


def legacy_field_behaviour(behaviour: dict[str, Any]) -> dict[str, Any]:
    """The provider-info behaviour in the python-style keys of ``get_ui_field_behaviour``."""
    return {
        "hidden_fields": list(behaviour["hidden-fields"]),
        "relabeling": dict(behaviour["relabeling"]),
        "placeholders": dict(behaviour["placeholders"]),
    }
