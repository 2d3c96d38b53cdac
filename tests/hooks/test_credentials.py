"""One set of credentials per connection per process (``hooks/credentials.py``), google provider hooks."""

from __future__ import annotations

import json

import pytest

from airflow_provider_tpu_rl.hooks import credentials
from airflow_provider_tpu_rl.hooks.credentials import gcs_hook, shared_hook_class


def _anonymous(project: str) -> str:
    return json.dumps(
        {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": project}}
    )


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    credentials.clear()


def test_hooks_of_one_connection_share_credentials_and_a_changed_connection_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.providers.google.cloud.hooks.gcs import GCSHook
    from airflow.providers.google.cloud.hooks.secret_manager import GoogleCloudSecretManagerHook

    monkeypatch.setenv("AIRFLOW_CONN_SHARED_GCP", _anonymous("proj-a"))
    first, second = gcs_hook("shared_gcp"), gcs_hook("shared_gcp")
    assert isinstance(first, GCSHook)
    assert first.get_credentials() is second.get_credentials()
    assert first.project_id == "proj-a"
    other_kind = shared_hook_class(GoogleCloudSecretManagerHook)(gcp_conn_id="shared_gcp")
    assert isinstance(other_kind, GoogleCloudSecretManagerHook)
    assert other_kind.get_credentials() is first.get_credentials()

    monkeypatch.setenv("AIRFLOW_CONN_SHARED_GCP", _anonymous("proj-b"))  # the connection changed
    changed = gcs_hook("shared_gcp")
    assert changed.get_credentials() is not first.get_credentials()
    assert changed.project_id == "proj-b"


def test_shared_credentials_are_built_again_after_the_reuse_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SHARED_GCP", _anonymous("proj-a"))
    first = gcs_hook("shared_gcp").get_credentials()
    monkeypatch.setattr(credentials, "REUSE_SECONDS", 0.0)
    assert gcs_hook("shared_gcp").get_credentials() is not first


def test_every_shared_hook_reads_a_chain_as_gcloud_does_and_refuses_one_it_would_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sensor or trigger handing its templated string to a google provider hook gets the same
    chain gcloud reads (issue 43): ``"a,b"`` is delegates then target, never the one account "a,b"."""
    from airflow_provider_tpu_rl.exceptions import ConfigurationError

    monkeypatch.setenv("AIRFLOW_CONN_SHARED_GCP", _anonymous("proj-a"))
    target, hop = "deployer@p.iam.gserviceaccount.com", "hop@p.iam.gserviceaccount.com"
    hook = gcs_hook("shared_gcp", f"{hop}, {target}")
    hook.get_credentials()
    assert hook.impersonation_chain == [hop, target]
    from airflow.providers.google.cloud.utils.credentials_provider import (
        _get_target_principal_and_delegates,
    )

    assert _get_target_principal_and_delegates(hook.impersonation_chain) == (target, [hop])
    with pytest.raises(ConfigurationError, match=r"^impersonation_chain: must be a service account e-mail"):
        gcs_hook("shared_gcp", f"{hop},,{target}").get_credentials()
