"""HuggingFaceTokenHook: connection password, extra fallback, Secret Manager, masking, clear errors."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import CommandError, ConfigurationError, FailureKind
from airflow_provider_tpu_rl.hooks import hf_token as hf_module
from airflow_provider_tpu_rl.hooks.hf_token import HuggingFaceTokenHook, get_hf_token

TOKEN = "hf_abcdefghijklmnopqrstuvwxyz012345"


@pytest.fixture
def masked(monkeypatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(hf_module, "mask_secret", calls.append)
    return calls


def _conn(monkeypatch, conn_id: str, **fields) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "huggingface", **fields}))


def test_token_from_password_is_masked_and_not_logged(monkeypatch, masked, recording_logger):
    _conn(monkeypatch, "huggingface_default", password=TOKEN + "\n")
    hook = HuggingFaceTokenHook()
    hook._log = recording_logger  # type: ignore[assignment]
    assert hook.get_token() == TOKEN
    assert TOKEN in masked
    assert TOKEN not in recording_logger.text
    assert "huggingface_default" in recording_logger.text


def test_token_from_extra_when_password_is_empty(monkeypatch, masked):
    _conn(monkeypatch, "hf_other", extra={"token": TOKEN})
    assert get_hf_token("hf_other") == TOKEN
    assert TOKEN in masked


def test_missing_connection_is_a_clear_failure(monkeypatch, masked):
    monkeypatch.delenv("AIRFLOW_CONN_HF_NOPE", raising=False)
    with pytest.raises(ConfigurationError, match="connection 'hf_nope' is not defined"):
        HuggingFaceTokenHook("hf_nope").get_token()


def test_connection_without_token_is_a_clear_failure(monkeypatch, masked):
    _conn(monkeypatch, "hf_empty", login="someone")
    with pytest.raises(ConfigurationError, match="neither a password nor an extra 'token'"):
        HuggingFaceTokenHook("hf_empty").get_token()


class _FakeSecretManagerHook:
    instances: list[_FakeSecretManagerHook] = []
    payload: bytes = TOKEN.encode()
    error: Exception | None = None

    def __init__(self, gcp_conn_id: str) -> None:
        self.gcp_conn_id = gcp_conn_id
        self.calls: list[dict] = []
        _FakeSecretManagerHook.instances.append(self)

    def access_secret(self, **kwargs):
        self.calls.append(kwargs)
        if self.error is not None:
            raise self.error
        return SimpleNamespace(payload=SimpleNamespace(data=self.payload))


@pytest.fixture
def fake_secret_manager(monkeypatch):
    import airflow.providers.google.cloud.hooks.secret_manager as sm

    _FakeSecretManagerHook.instances = []
    _FakeSecretManagerHook.error = None
    _FakeSecretManagerHook.payload = TOKEN.encode()
    monkeypatch.setattr(sm, "GoogleCloudSecretManagerHook", _FakeSecretManagerHook)
    return _FakeSecretManagerHook


def test_token_from_secret_manager(fake_secret_manager, masked, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_HUGGINGFACE_DEFAULT", raising=False)
    hook = HuggingFaceTokenHook(secret_id="hf-token", secret_project_id="proj", gcp_conn_id="gcp")
    assert hook.get_token() == TOKEN
    (instance,) = fake_secret_manager.instances
    assert instance.gcp_conn_id == "gcp"
    assert instance.calls == [{"project_id": "proj", "secret_id": "hf-token", "secret_version": "latest"}]
    assert TOKEN in masked


def test_secret_manager_error_is_a_clear_failure(fake_secret_manager, masked):
    fake_secret_manager.error = PermissionError("403 Permission denied on secret")
    with pytest.raises(ConfigurationError, match="cannot read Secret Manager secret 'hf-token'") as info:
        HuggingFaceTokenHook(secret_id="hf-token").get_token()
    assert not isinstance(info.value, AirflowFailException)


def test_secret_manager_outage_is_a_retryable_command_error(fake_secret_manager, masked):
    from google.api_core.exceptions import ServiceUnavailable

    fake_secret_manager.error = ServiceUnavailable("the service is down")
    with pytest.raises(CommandError, match="cannot read Secret Manager secret 'hf-token'") as info:
        HuggingFaceTokenHook(secret_id="hf-token").get_token()
    assert info.value.kind is FailureKind.TRANSIENT
    assert info.value.retryable


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (TimeoutError("read timed out"), FailureKind.TRANSIENT),
        (ConnectionResetError("connection reset by peer"), FailureKind.TRANSIENT),
        (PermissionError("403 denied"), FailureKind.CONFIG),
        (FileNotFoundError("404 secret not found"), FailureKind.CONFIG),
        (RuntimeError("Error 503: backendError"), FailureKind.TRANSIENT),
        (RuntimeError("something else"), FailureKind.CONFIG),
    ],
)
def test_secret_read_failure_kind(error, kind):
    assert hf_module.secret_read_failure_kind(error) is kind


def test_secret_read_failure_kind_of_google_api_errors():
    from google.api_core import exceptions as api

    assert hf_module.secret_read_failure_kind(api.TooManyRequests("slow down")) is FailureKind.TRANSIENT
    assert hf_module.secret_read_failure_kind(api.DeadlineExceeded("late")) is FailureKind.TRANSIENT
    assert hf_module.secret_read_failure_kind(api.NotFound("no such secret")) is FailureKind.CONFIG
    assert hf_module.secret_read_failure_kind(api.PermissionDenied("denied")) is FailureKind.CONFIG


def test_empty_secret_is_a_clear_failure(fake_secret_manager, masked):
    fake_secret_manager.payload = b"  \n"
    with pytest.raises(ConfigurationError, match="is empty"):
        HuggingFaceTokenHook(secret_id="hf-token").get_token()


def test_ui_field_behaviour_relabels_password():
    behaviour = HuggingFaceTokenHook.get_ui_field_behaviour()
    assert behaviour["relabeling"]["password"] == "Hugging Face token"
    assert "password" not in behaviour["hidden_fields"]
