"""Hooks raise the provider's own errors (``exceptions.py``), never ``AirflowFailException``.

Operators decide what is fatal; a hook only says what went wrong: a :class:`ConfigurationError`
(a retry fails the same way), a :class:`CommandError` with a ``kind`` (and so ``retryable``), or an
:class:`OutputParseError`.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import airflow_provider_tpu_rl
from airflow_provider_tpu_rl.exceptions import (
    CommandError,
    ConfigurationError,
    FailureKind,
)
from airflow_provider_tpu_rl.hooks.gcluster import GclusterConfig, GclusterHook
from airflow_provider_tpu_rl.render.command import Command

PACKAGE = Path(airflow_provider_tpu_rl.__file__).parent
# Hook-level code: it reports errors, it never decides that a task must fail without retries.
HOOK_LEVEL = ["hooks", "triggers", "ledger", "maxtext", "links.py", "exceptions.py"]


def _python_files(relative: str) -> list[Path]:
    path = PACKAGE / relative
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def _uses_airflow_fail_exception(path: Path) -> list[int]:
    """Lines that name ``AirflowFailException`` in code (an import, a raise, an isinstance …)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if (
            (isinstance(node, ast.Name) and node.id == "AirflowFailException")
            or (isinstance(node, ast.Attribute) and node.attr == "AirflowFailException")
            or (isinstance(node, ast.alias) and node.name.rsplit(".", 1)[-1] == "AirflowFailException")
        ):
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize(
    "path",
    [p for folder in HOOK_LEVEL for p in _python_files(folder)],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_hook_level_code_never_uses_airflow_fail_exception(path: Path) -> None:
    assert _uses_airflow_fail_exception(path) == [], (
        f"{path.relative_to(PACKAGE)} uses AirflowFailException: raise ConfigurationError/CommandError "
        "and let the operator decide what is fatal"
    )


def test_the_scan_finds_every_way_of_naming_it(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from airflow.exceptions import AirflowFailException as Fatal\n"
        "import airflow.exceptions\n"
        "raise airflow.exceptions.AirflowFailException('x')\n"
        "'''AirflowFailException in a docstring does not count'''\n"
    )
    assert _uses_airflow_fail_exception(sample) == [1, 3]


def test_hooks_folder_does_not_even_mention_it_in_code() -> None:
    """The plain text scan the issue asks for: outside docstrings/comments, no hook names it."""
    offenders = []
    for path in _python_files("hooks"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if "AirflowFailException" in code and "``AirflowFailException``" not in code:
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert offenders == []


# ---------------------------------------------------------------- configuration problems
def test_undefined_named_connection_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_GCLUSTER_NOPE", raising=False)
    with pytest.raises(ConfigurationError, match="'gcluster_nope' is not defined"):
        _ = GclusterHook("gcluster_nope").config


def test_undefined_default_connection_falls_back_to_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_GCLUSTER_DEFAULT", raising=False)
    assert GclusterHook().config == GclusterConfig()


@pytest.mark.parametrize(
    ("inherit_env", "match"),
    [
        ("[not json", "not a JSON list"),
        ('["A", 3', "not a JSON list"),
        ({"A": "1"}, "must be a list of names, got dict"),
        (7, "must be a list of names, got int"),
        (["BAD-NAME"], "names must match"),
    ],
)
def test_bad_connection_extras_are_configuration_errors(
    monkeypatch: pytest.MonkeyPatch, inherit_env: object, match: str
) -> None:
    conn = {"conn_type": "gcluster", "extra": {"inherit_env": inherit_env}}
    monkeypatch.setenv("AIRFLOW_CONN_GCLUSTER_BAD_EXTRA", json.dumps(conn))
    with pytest.raises(ConfigurationError, match=match):
        _ = GclusterHook("gcluster_bad_extra").config


def test_missing_gcloud_is_a_configuration_error(make_hook, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="gcloud not found"):
        make_hook(gcloud_path=str(tmp_path / "no-gcloud")).tool_path("gcloud")


def test_gcluster_path_without_examples_is_a_configuration_error(tmp_path: Path) -> None:
    binary = tmp_path / "gcluster"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    with pytest.raises(ConfigurationError, match="set bundle_dir"):
        GclusterHook(config=GclusterConfig(gcluster_path=str(binary))).bundle_dir()


def test_bundle_download_without_sha256_is_a_configuration_error(tmp_path: Path) -> None:
    hook = GclusterHook(config=GclusterConfig(cache_dir=str(tmp_path), download_base_url="file:///nowhere"))
    with pytest.raises(ConfigurationError, match="unverified"):
        hook.tool_path("gcluster")


# ---------------------------------------------------------------- failed commands
def test_failed_command_carries_its_classified_kind(make_hook, fake_tools) -> None:
    fake_tools.respond(
        {"match": ["deploy"], "steps": [["err", "Error: ZONE_RESOURCE_POOL_EXHAUSTED"]], "exit": 1},
        {"match": ["destroy"], "steps": [["err", "Error: permission denied on project"]], "exit": 1},
    )
    hook = make_hook()
    with pytest.raises(CommandError) as capacity:
        hook.run_checked(Command(("gcluster", "deploy", "bp.yaml")), timeout=30)
    with pytest.raises(CommandError) as config:
        hook.run_checked(Command(("gcluster", "destroy", "c")), timeout=30)
    assert (capacity.value.kind, capacity.value.retryable) == (FailureKind.CAPACITY, True)
    assert (config.value.kind, config.value.retryable) == (FailureKind.CONFIG, False)
