"""The provider's own errors (exceptions.py): Airflow exceptions a retry can follow, never fatal ones;
a command's error is retryable as its kind says.

That the hooks raise only these is tests/hooks/test_typed_errors.py's."""

from __future__ import annotations

import pytest

from airflow_provider_tpu_rl import exceptions
from airflow_provider_tpu_rl.compat import AirflowException, AirflowFailException
from airflow_provider_tpu_rl.exceptions import (
    CommandError,
    ConfigurationError,
    FailureKind,
    OutputParseError,
    TpuRlError,
)
from airflow_provider_tpu_rl.toolchain import failures


def test_error_types_are_airflow_exceptions_but_never_fatal_ones() -> None:
    for error in (
        ConfigurationError("x"),
        CommandError("x", FailureKind.TRANSIENT),
        OutputParseError("x"),
    ):
        assert isinstance(error, TpuRlError)
        assert isinstance(error, AirflowException)
        assert not isinstance(error, AirflowFailException)


@pytest.mark.parametrize(
    ("kind", "retryable"),
    [(FailureKind.CAPACITY, True), (FailureKind.TRANSIENT, True), (FailureKind.CONFIG, False)],
)
def test_command_error_is_retryable_as_its_kind(kind: FailureKind, retryable: bool) -> None:
    assert CommandError("x", kind).retryable is retryable
    assert CommandError("x", kind).kind is kind


def test_failure_kind_lives_in_exceptions_and_the_old_errors_are_gone() -> None:
    assert failures.FailureKind is exceptions.FailureKind
    assert not hasattr(failures, "GclusterTransientError")
    assert not hasattr(failures, "GclusterOutputError")
    from airflow_provider_tpu_rl.hooks import gcluster

    assert not hasattr(gcluster, "GclusterTransientError")
    assert not hasattr(gcluster, "GclusterOutputError")
