"""The few shell strings the tools need (render/shell.py): every value quoted, so a shell reads back
exactly the tokens given; the token read into a variable no other command sees; a body run on the
first pod only."""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from airflow_provider_tpu_rl.render.shell import (
    HF_TOKEN_VAR,
    hf_token_from_gcloud,
    hf_token_from_secret_manager,
    key_values,
    on_first_pod_only,
    quote_all,
    with_hf_token,
)

HOSTILE = ["plain", "two words", "$(id)", "`id`", "a'b", 'a"b', "x; rm -rf /", "*", "", "line\nbreak"]


def _bash(script: str, **env: str) -> str:
    done = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env={**os.environ, **env},
    )
    return done.stdout


def test_quote_all_gives_a_shell_back_exactly_its_tokens() -> None:
    line = quote_all(HOSTILE)
    assert shlex.split(line) == HOSTILE
    assert _bash(f"printf '%s\\0' {line}").split("\0")[:-1] == HOSTILE


def test_key_values_are_one_token_each_once_quoted() -> None:
    pairs = key_values([("learning_rate", "3e-6"), ("stop_strings", "a b")])
    assert pairs == ["learning_rate=3e-6", "stop_strings=a b"]
    assert shlex.split(quote_all(pairs)) == pairs


def test_the_token_variable_reaches_only_the_command_given_it() -> None:
    (read,) = hf_token_from_gcloud("hf-token", "proj-123")
    assert read.startswith(f"{HF_TOKEN_VAR}=$(")
    assert shlex.split(read.split("$(", 1)[1].rstrip(")"))[:5] == [
        "gcloud",
        "secrets",
        "versions",
        "access",
        "latest",
    ]
    script = f"{HF_TOKEN_VAR}=s3cret; {with_hf_token('printenv HF_TOKEN')}; printenv HF_TOKEN || echo unset"
    assert _bash(script).split() == ["s3cret", "unset"]


def test_the_pod_reads_the_secret_in_one_line_without_a_shell_value_in_it() -> None:
    fetch = hf_token_from_secret_manager("projects/p/secrets/s; echo pwned/versions/latest")
    assert "\n" not in fetch
    assert fetch.endswith("&& export HF_TOKEN")
    assert shlex.quote("projects/p/secrets/s; echo pwned/versions/latest") in fetch


@pytest.mark.parametrize(("index", "ran"), [("0", "ran"), ("1", ""), ("", "")])
def test_a_body_runs_on_the_first_pod_only(index: str, ran: str) -> None:
    assert _bash(on_first_pod_only("echo ran"), JOB_COMPLETION_INDEX=index).strip() == ran
