"""The impersonation chain reaches every gcloud and gcluster process the hook starts."""

from __future__ import annotations

import pytest

from airflow_provider_tpu_rl.exceptions import ConfigurationError
from airflow_provider_tpu_rl.hooks.gcluster import GclusterConfig, GclusterHook, impersonation_env
from airflow_provider_tpu_rl.render.command import Command

TARGET = "deployer@p.iam.gserviceaccount.com"
DELEGATE = "hop@p.iam.gserviceaccount.com"


def _command(*argv: str) -> Command:
    return Command(argv=tuple(argv), description=" ".join(argv[:3]))


def test_gcloud_gets_the_chain_as_its_property_comma_separated() -> None:
    gcloud = _command("gcloud", "secrets", "list", "--project=p")
    assert impersonation_env(TARGET, gcloud) == {"CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT": TARGET}
    assert impersonation_env([DELEGATE, TARGET], gcloud) == {
        "CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT": f"{DELEGATE},{TARGET}"
    }
    assert impersonation_env(None, gcloud) == {}


def test_gcluster_deploy_also_gives_terraform_its_one_account() -> None:
    deploy = _command("gcluster", "deploy", "folder", "--auto-approve")
    assert impersonation_env([TARGET], deploy) == {
        "CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT": TARGET,
        "GOOGLE_IMPERSONATE_SERVICE_ACCOUNT": TARGET,
    }
    job = _command("gcluster", "job", "list", "--project=p")
    assert impersonation_env([DELEGATE, TARGET], job) == {
        "CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT": f"{DELEGATE},{TARGET}"
    }
    with pytest.raises(ConfigurationError, match="Terraform under gcluster destroy cannot take"):
        impersonation_env([DELEGATE, TARGET], _command("gcluster", "destroy", "folder"))


def test_the_hook_puts_the_chain_in_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT", "worker-default@p.iam.gserviceaccount.com"
    )
    hook = GclusterHook(config=GclusterConfig(), impersonation_chain=[DELEGATE, TARGET])
    prepared = hook._prepare(
        _command("gcloud", "secrets", "list"), "/bin/true", secrets=None, cwd=None, job_home=None
    )
    try:
        assert prepared.env["CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT"] == f"{DELEGATE},{TARGET}"
    finally:
        prepared.cleanup()
    plain = GclusterHook(config=GclusterConfig())._prepare(
        _command("gcloud", "secrets", "list"), "/bin/true", secrets=None, cwd=None, job_home=None
    )
    try:  # no chain: the worker's own setting (inherited CLOUDSDK_*) is left as it is
        assert (
            plain.env["CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT"]
            == "worker-default@p.iam.gserviceaccount.com"
        )
    finally:
        plain.cleanup()
