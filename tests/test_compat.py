"""The compatibility module: version flags and the retry backoff each Airflow version accepts."""

from __future__ import annotations

from datetime import timedelta

import airflow
import pytest
from airflow.providers.common.compat.sdk import BaseOperator
from packaging.version import Version

from airflow_provider_tpu_rl import compat
from airflow_provider_tpu_rl.operators.pipeline import transient_retries


def expected_backoff_types() -> object:
    """What the installed BaseOperator type-checks ``retry_exponential_backoff`` against."""
    try:
        from airflow.sdk.bases.operator import BASEOPERATOR_ARGS_EXPECTED_TYPES
    except ImportError:  # Airflow 2
        from airflow.models.baseoperator import BASEOPERATOR_ARGS_EXPECTED_TYPES
    return BASEOPERATOR_ARGS_EXPECTED_TYPES["retry_exponential_backoff"]


def test_flags_follow_the_installed_airflow() -> None:
    version = Version(airflow.__version__)
    assert compat.airflow_version() == (version.major, version.minor, version.micro)
    assert compat.AIRFLOW_V_3_0_PLUS is (version.major >= 3)
    assert compat.AIRFLOW_V_3_2_PLUS is (version.release[:2] >= (3, 2))


def test_the_gate_matches_what_the_installed_base_operator_accepts() -> None:
    """A float multiplier exactly where BaseOperator's type check takes one (bool before 3.2)."""
    types = expected_backoff_types()
    accepts_float = isinstance(types, tuple) and float in types
    assert accepts_float is compat.AIRFLOW_V_3_2_PLUS
    assert isinstance(compat.exponential_backoff(), types)  # type: ignore[arg-type]


def test_before_airflow_3_2_backoff_is_true(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "AIRFLOW_V_3_2_PLUS", False)
    assert compat.exponential_backoff() is True
    assert compat.exponential_backoff(2.0) is True
    with pytest.raises(ValueError, match="only doubles"):
        compat.exponential_backoff(3.0)


def test_from_airflow_3_2_backoff_is_the_multiplier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "AIRFLOW_V_3_2_PLUS", True)
    backoff = compat.exponential_backoff()
    assert type(backoff) is float
    assert backoff == 2.0
    assert compat.exponential_backoff(3) == 3.0


@pytest.mark.parametrize(("new_airflow", "expected"), [(False, True), (True, 2.0)])
def test_transient_retries_take_the_backoff_from_compat(
    monkeypatch: pytest.MonkeyPatch, new_airflow: bool, expected: bool | float
) -> None:
    monkeypatch.setattr(compat, "AIRFLOW_V_3_2_PLUS", new_airflow)
    backoff = transient_retries()["retry_exponential_backoff"]
    assert type(backoff) is type(expected)
    assert backoff == expected


def test_an_operator_on_this_airflow_accepts_transient_retries() -> None:
    retries = transient_retries()
    operator = BaseOperator(task_id="transient", **retries)
    assert operator.retry_exponential_backoff == compat.exponential_backoff()
    assert operator.retries == retries["retries"]
    assert timedelta(0) < operator.retry_delay < operator.max_retry_delay
