"""Connection metadata: the declarative provider-info entries agree with the hook classes."""

from __future__ import annotations

import importlib

from airflow_provider_tpu_rl.hooks.connection_fields import GCLUSTER_CONN_FIELDS, connection_types
from airflow_provider_tpu_rl.hooks.gcluster import GclusterConfig, GclusterHook


def test_connection_types_point_at_real_hooks_with_matching_attributes():
    for entry in connection_types():
        module_name, _, class_name = entry["hook-class-name"].rpartition(".")
        hook_class = getattr(importlib.import_module(module_name), class_name)
        assert hook_class.conn_type == entry["connection-type"]
        assert hook_class.hook_name == entry["hook-name"]


def test_every_gcluster_form_field_is_a_config_field():
    config_fields = set(GclusterConfig.__dataclass_fields__)
    assert set(GCLUSTER_CONN_FIELDS) == config_fields
    for name in (
        "project",
        "region",
        "zone",
        "gcluster_path",
        "gcloud_path",
        "bundle_dir",
        "cache_dir",
        "version",
    ):
        assert name in GCLUSTER_CONN_FIELDS


def test_gcluster_hook_identity_and_defaults():
    assert GclusterHook.conn_name_attr == "gcluster_conn_id"
    assert GclusterHook.default_conn_name == "gcluster_default"
    assert GclusterHook.conn_type == "gcluster"
    assert GclusterHook.hook_name == "Cluster Toolkit (gcluster)"
    assert GclusterConfig().version == "v1.103.0"
    assert "password" in GclusterHook.get_ui_field_behaviour()["hidden_fields"]


def test_config_from_extra_reads_plain_and_prefixed_keys():
    config = GclusterConfig.from_extra(
        {"project": "p", "extra__gcluster__region": "us-east5", "zone": "", "version": "v1.104.0"}
    )
    assert (config.project, config.region, config.zone, config.version) == ("p", "us-east5", None, "v1.104.0")


def test_hook_reads_its_connection(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_GCLUSTER_TEST",
        '{"conn_type": "gcluster", "extra": {"project": "p1", "region": "us-east5", "gcluster_path": "/opt/g"}}',
    )
    config = GclusterHook("gcluster_test").config
    assert (config.project, config.region, config.gcluster_path) == ("p1", "us-east5", "/opt/g")
