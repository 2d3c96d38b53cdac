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


# -- one reading of a chain for gcloud, Terraform and the google provider (issue 43, item 3) ---------
def test_a_comma_separated_string_is_the_chain_gcloud_reads_for_every_hook() -> None:
    """``"a,b"`` used to pass Terraform's one-account check as one account while gcloud read it
    as a two-account chain (and the google provider as the one account "a,b")."""
    from airflow_provider_tpu_rl.operators.base import chain_of

    assert chain_of(f"{DELEGATE}, {TARGET}") == [DELEGATE, TARGET]  # the google provider: delegates, target
    assert chain_of(f" {TARGET} ") == TARGET
    for empty in ("", [], None):
        assert chain_of(empty) is None
    with pytest.raises(ConfigurationError, match="Terraform under gcluster deploy cannot take"):
        impersonation_env(f"{DELEGATE},{TARGET}", _command("gcluster", "deploy", "folder"))
    assert impersonation_env(f"{DELEGATE},{TARGET}", _command("gcloud", "secrets", "list")) == {
        "CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT": f"{DELEGATE},{TARGET}"
    }


@pytest.mark.parametrize(
    "chain",
    [
        f"{DELEGATE},,{TARGET}",
        f"{TARGET},",
        [f"{DELEGATE},{TARGET}"],
        [DELEGATE, 7],
        "deployer",
        "deployer@example.com",
        f"{TARGET} {DELEGATE}",
        f"{TARGET}\nx",
        {"account": TARGET},
        42,
    ],
    ids=["empty-item", "trailing-comma", "comma-in-item", "number-item", "no-domain", "not-a-service-account",
         "space", "newline", "mapping", "number"],
)  # fmt: skip
def test_a_chain_gcloud_and_the_google_provider_would_read_differently_is_refused_in_one_line(
    chain: object,
) -> None:
    from airflow_provider_tpu_rl.operators.base import chain_of
    from airflow_provider_tpu_rl.spec.errors import SpecError

    with pytest.raises(SpecError) as refused:
        chain_of(chain)  # type: ignore[arg-type]
    message = str(refused.value)
    assert message.startswith("impersonation_chain: must be a service account e-mail")
    assert "\n" not in message
    with pytest.raises(ConfigurationError, match=r"^impersonation_chain: "):
        impersonation_env(chain, _command("gcloud", "secrets", "list"))  # type: ignore[arg-type]
