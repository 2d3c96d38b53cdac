"""The spec layer's one error (spec/errors.py): one line ``field: rule (got value)``, the value cut
short, a value too large or deep to show named by its type, a key that would break the line quoted."""

from __future__ import annotations

import sys

from airflow_provider_tpu_rl.spec.errors import SpecError, field_name, short_repr


def test_the_error_is_one_line_naming_field_rule_and_value() -> None:
    error = SpecError("num_slices", "must be between 1 and 64", 0)
    assert str(error) == "num_slices: must be between 1 and 64 (got 0)"
    assert (error.field, error.rule, error.value) == ("num_slices", "must be between 1 and 64", 0)
    assert str(SpecError("hf_token", "never shown", "hf_secret", show_value=False)) == "hf_token: never shown"


def test_a_long_value_is_cut_to_the_limit() -> None:
    assert short_repr("x" * 10, limit=8) == "'xxxx..."
    assert len(short_repr("x" * 1000)) == 60
    assert short_repr("short") == "'short'"


def test_a_value_that_cannot_be_shown_is_named_by_its_type() -> None:
    huge = 10 ** (sys.get_int_max_str_digits() + 1)
    deep: list[object] = []
    for _ in range(sys.getrecursionlimit() + 10):
        deep = [deep]
    assert short_repr(huge) == "<a int too large or too deep to show>"
    assert short_repr(deep) == "<a list too large or too deep to show>"
    assert "\n" not in str(SpecError("num_batches", "must be <= 10000000", huge))


def test_a_key_with_a_line_break_is_quoted_and_a_plain_one_is_not() -> None:
    assert field_name("train_overrides.learning_rate") == "train_overrides.learning_rate"
    assert field_name("a\nb") == "'a\\nb'"
    assert str(SpecError("a\u2028b", "unknown conf key")) == "'a\\u2028b': unknown conf key (got None)"
