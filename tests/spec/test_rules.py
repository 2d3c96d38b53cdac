"""The validation rules the specs share (spec/rules.py), called directly: Cloud Storage's naming of
dotted buckets and object paths, the text a Jinja template renders a number or a switch to, a
canonical CIDR, and an impersonation chain read as gcloud and the google provider both read it.

Every rule is also met through the conf field it guards (tests/spec/test_pipeline.py's tables)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.errors import SpecError

SA = "deployer@proj-123.iam.gserviceaccount.com"
HOP = "hop@proj-123.iam.gserviceaccount.com"


def _refused(check: Any, *args: Any) -> str:
    with pytest.raises(SpecError) as refused:
        check("f", *args)
    return refused.value.rule


def test_a_dotted_bucket_name_may_pass_63_characters_but_no_part_may() -> None:
    long_dotted = ".".join(["a" * 63, "b" * 63, "c" * 63])  # 191 characters
    assert rules.bucket_name("f", long_dotted) == long_dotted
    assert "63 per part" in _refused(rules.bucket_name, "a" * 64 + ".b")
    assert "at most 222" in _refused(rules.bucket_name, ".".join(["a" * 60] * 4))
    assert "'..', '.-' or '-.'" in _refused(rules.bucket_name, "a.-b")


@pytest.mark.parametrize(
    ("uri", "rule"),
    [
        ("s3://bkt/x", "must be a gs:// URI"),
        ("gs://bkt/../etc", "object path"),
        ("gs://bkt/a b", "object path"),
        ("gs://Bkt/x", "bucket name must use only"),
    ],
)
def test_a_gs_uri_names_a_valid_bucket_and_a_safe_path(uri: str, rule: str) -> None:
    assert rule in _refused(rules.gs_uri, uri)
    assert rules.gs_uri("f", "gs://bkt/qwen/trained/rl-1/") == "gs://bkt/qwen/trained/rl-1/"


def test_numbers_and_switches_are_also_taken_as_a_template_renders_them() -> None:
    assert rules.integer("f", " 42 ", 1) == 42
    assert rules.boolean("f", "False") is False
    assert rules.boolean("f", " TRUE ") is True
    assert _refused(rules.integer, "4.0", 1) == "must be an integer"
    assert _refused(rules.integer, True, 0) == "must be an integer"
    assert _refused(rules.boolean, 1) == "must be true or false"


def test_a_cidr_is_a_network_in_its_canonical_form() -> None:
    assert rules.cidr("f", "10.0.0.0/8") == "10.0.0.0/8"
    assert "canonical CIDR form" in _refused(rules.cidr, "10.0.0.0")
    assert "CIDR form" in _refused(rules.cidr, "10.0.0.1/8")


def test_an_impersonation_chain_is_read_as_gcloud_reads_a_string_and_the_provider_a_list() -> None:
    assert rules.impersonation_accounts("f", None) == ()
    assert rules.impersonation_accounts("f", "  ") == ()
    assert rules.impersonation_accounts("f", f"{HOP}, {SA}") == (HOP, SA)
    assert rules.impersonation_accounts("f", ["", HOP, SA]) == (HOP, SA)  # a template left empty
    assert rules.impersonation_accounts("f", "1234567890") == ("1234567890",)
    assert "an empty item is not one" in _refused(rules.impersonation_accounts, f"{HOP},,{SA}")
    assert "is not one" in _refused(rules.impersonation_accounts, ["me@example.com"])
    assert _refused(rules.impersonation_accounts, 5) == rules.IMPERSONATION_CHAIN_RULE
