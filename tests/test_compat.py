"""The compatibility module: version flags and the retry backoff each Airflow version accepts."""

from __future__ import annotations

import contextlib
import types
from datetime import timedelta
from typing import Any

import airflow
import pytest
from airflow.providers.common.compat.sdk import BaseOperator
from packaging.version import Version

from airflow_provider_tpu_rl import compat
from airflow_provider_tpu_rl.pipelines.arguments import transient_retries


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


@pytest.mark.parametrize("name", sorted(compat.SDK_FALLBACKS))
def test_each_sdk_name_resolves_like_common_compat(name: str) -> None:
    """With the installed common-compat: its own object when it has the name, else Airflow's."""
    from airflow.providers.common.compat import sdk

    value = getattr(compat, name)
    assert value is compat.sdk_name(name)
    if hasattr(sdk, name):
        assert value is getattr(sdk, name)


class _OldSdk(types.ModuleType):
    """A common-compat ``sdk`` module from before the fallback names (1.8.0)."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


def newest_sdk_name(name: str) -> Any:
    """What a common-compat with the name gives (the installed one, unless it is too old)."""
    from airflow.providers.common.compat import sdk

    with contextlib.suppress(AttributeError):
        return getattr(sdk, name)
    pytest.skip(f"the installed common-compat has no {name}: nothing to compare the fallback with")


@pytest.mark.parametrize("name", sorted(compat.SDK_FALLBACKS))
def test_each_sdk_name_falls_back_to_airflows_own(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Without the name in common-compat's sdk, the fallback is the very object common-compat gives."""
    import airflow.providers.common.compat as common_compat

    expected = newest_sdk_name(name)
    monkeypatch.setattr(common_compat, "sdk", _OldSdk("sdk"))
    assert compat.sdk_name(name) is expected


def test_with_common_compat_1_8_every_name_still_resolves(monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow.providers.common.compat as common_compat

    monkeypatch.setattr(common_compat, "sdk", _OldSdk("sdk"))
    resolved = {name: compat.sdk_name(name) for name in compat.SDK_FALLBACKS}
    exceptions = (
        "AirflowException",
        "AirflowFailException",
        "AirflowNotFoundException",
        "AirflowSkipException",
        "TaskDeferred",
    )
    for name in (*exceptions, "ParamValidationError"):
        assert issubclass(resolved[name], BaseException), name
        assert resolved[name].__name__ == name
    assert resolved["conf"].has_option("core", "dags_folder")
    assert callable(resolved["mask_secret"])
    assert resolved["TaskInstanceKey"]("d", "t", "r").dag_id == "d"


def test_an_unknown_name_is_not_invented() -> None:
    with pytest.raises(AttributeError):
        compat.sdk_name("NoSuchName")
    with pytest.raises(AttributeError):
        _ = compat.NoSuchName  # type: ignore[attr-defined]


class _Hook:
    """A GoogleBaseHook from before ``get_client_options`` (google provider < 22.0.0)."""


class _NewHook:
    def get_client_options(self, api_endpoint_override: str | None = None) -> object:
        return ("hook's own", api_endpoint_override)


def test_client_options_asks_the_hook_when_it_can() -> None:
    assert compat.client_options(_NewHook(), "http://x") == ("hook's own", "http://x")  # type: ignore[arg-type]


def test_client_options_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_CLOUD_UNIVERSE_DOMAIN", "example.test")
    hook: Any = _Hook()
    assert compat.client_options(hook, "http://127.0.0.1:1").api_endpoint == "http://127.0.0.1:1"
    assert compat.client_options(hook).universe_domain == "example.test"
    monkeypatch.delenv("GOOGLE_CLOUD_UNIVERSE_DOMAIN")
    defaults = compat.client_options(hook)
    assert (defaults.api_endpoint, defaults.universe_domain) == (None, None)


def test_task_error_unwraps_airflow_2s_system_exit_text() -> None:
    wrapped = "Task failed due to SystemExit(invalid pipeline conf: zone: must be (a) zone)"
    assert compat.task_error(wrapped) == "invalid pipeline conf: zone: must be (a) zone"
    error = ValueError("Task failed due to SystemExit(x)")
    assert compat.task_error(error) is error
    assert compat.task_error("Task failed: other") == "Task failed: other"
    assert compat.task_error(None) is None
