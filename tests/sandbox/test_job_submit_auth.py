"""``gcluster job submit`` needs gcloud's active account and ADC, as Cluster Toolkit checks them.

cmd/job/prereq.go (v1.95.0) ``ensurePrerequisites``: ``ensureGCloudAuthenticated`` (``gcloud auth
list --filter=status:ACTIVE --format=value(account)`` exits 0 with an account) and
``getADCSetupCommand`` (golang/oauth2 ``FindDefaultCredentials`` then a token). The fake gcloud
without an account prints what gcloud 528 prints with an empty CLOUDSDK_CONFIG.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox.conftest import Cli, Result, submit_args
from tpu_rl_sandbox.world.settings import reset_settings, update_settings

AUTH_ITEM = "\n - Google Cloud Authentication\n   Command: gcloud auth login\n"
ADC_ITEM = "\n - Application Default Credentials (ADC)\n   Command: gcloud auth application-default login\n"
REFUSED = "Error: job could not be submitted because some prerequisites are missing."
# gcloud 528, CLOUDSDK_CONFIG empty: `gcloud services list ...` (stderr, exit 1)
NO_ACCOUNT_ERROR = (
    "ERROR: (gcloud.services.list) You do not currently have an active account selected.\n"
    "Please run:\n\n  $ gcloud auth login\n\nto obtain new credentials.\n\n"
    "If you have already logged in with a different account, run:\n\n"
    "  $ gcloud config set account ACCOUNT\n\nto select an already authenticated account to use.\n"
)


@pytest.fixture
def logged_out(cli: Cli) -> Iterator[Cli]:
    update_settings(cli.layout, gcloud_logged_in=False)
    try:
        yield cli
    finally:
        reset_settings(cli.layout)


def _submit(cli: Cli, names: dict[str, str], env: dict[str, str] | None = None) -> Result:
    folder = Path(cli.env["HOME"]) / ".docker"
    folder.mkdir(parents=True, exist_ok=True)
    helpers = {"gcr.io": "gcloud", f"{names['region']}-docker.pkg.dev": "gcloud"}
    (folder / "config.json").write_text(json.dumps({"credHelpers": helpers}))
    argv = submit_args("j1", "echo hi")
    flags = ["--project", names["project"], "--location", names["region"], "--cluster", names["cluster"]]
    return cli.shim("gcluster", *argv[:2], *flags, *argv[2:], env=env)


def test_gcloud_without_an_account_lists_none_as_gcloud_does(logged_out: Cli) -> None:
    plain = logged_out.gcloud("auth", "list")
    assert (plain.code, plain.out) == (0, "")
    assert plain.err == "\nNo credentialed accounts.\n\nTo login, run:\n  $ gcloud auth login `ACCOUNT`\n\n"
    filtered = logged_out.gcloud("auth", "list", "--filter=status:ACTIVE", "--format=value(account)")
    assert (filtered.code, filtered.out) == (0, "")
    assert filtered.err == "WARNING: The following filter keys were not present in any resource : status\n"


def test_gcloud_without_an_account_refuses_api_commands(logged_out: Cli, names: dict[str, str]) -> None:
    result = logged_out.gcloud(
        "services", "list", "--enabled", f"--project={names['project']}", "--format=value(config.name)"
    )
    assert (result.code, result.out, result.err) == (1, "", NO_ACCOUNT_ERROR)
    assert logged_out.gcloud("version").code == 0


def test_job_submit_without_a_gcloud_account_refuses(logged_out: Cli, names: dict[str, str]) -> None:
    result = _submit(logged_out, names)
    assert result.code == 1
    assert AUTH_ITEM in result.out
    # gcloud services list fails too, so gcluster reads the API as not enabled (as the real one does)
    assert " - Artifact Registry API\n" in result.out
    assert ADC_ITEM not in result.out
    assert REFUSED in result.err
    assert not (Path(logged_out.env["HOME"]) / ".gcluster" / "job_prereq_state.json").exists()


def test_job_submit_without_adc_refuses(cli: Cli, names: dict[str, str]) -> None:
    env = {k: v for k, v in cli.env.items() if k != "GOOGLE_APPLICATION_CREDENTIALS"}
    cli.env = env
    result = _submit(cli, names)
    assert result.code == 1
    assert ADC_ITEM in result.out
    assert AUTH_ITEM not in result.out
    assert "Artifact Registry" not in result.out
    assert REFUSED in result.err


def test_job_submit_with_an_unreadable_adc_file_refuses(
    cli: Cli, names: dict[str, str], tmp_path: Path
) -> None:
    result = _submit(cli, names, env={"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "missing.json")})
    assert result.code == 1
    assert ADC_ITEM in result.out


def test_job_submit_finds_adc_in_the_well_known_file(cli: Cli, names: dict[str, str]) -> None:
    key = Path(cli.env.pop("GOOGLE_APPLICATION_CREDENTIALS"))
    known = Path(cli.env["HOME"]) / ".config" / "gcloud" / "application_default_credentials.json"
    known.parent.mkdir(parents=True)
    shutil.copy(key, known)
    result = _submit(cli, names)
    assert "Prerequisites checked successfully." in result.text, result.text


def test_job_submit_reads_no_adc_from_cloudsdk_config(
    cli: Cli, names: dict[str, str], tmp_path: Path
) -> None:
    """golang/oauth2's wellKnownFile is under $HOME, whatever CLOUDSDK_CONFIG says."""
    key = Path(cli.env.pop("GOOGLE_APPLICATION_CREDENTIALS"))
    config = tmp_path / "gcloud-config"
    config.mkdir()
    shutil.copy(key, config / "application_default_credentials.json")
    result = _submit(cli, names, env={"CLOUDSDK_CONFIG": str(config)})
    assert ADC_ITEM in result.out
