"""The renderer's unit (render/command.py): one command as an argv tuple of strings, never a shell
string; its plan form shows a stdin secret only as a placeholder."""

from __future__ import annotations

import pytest

from airflow_provider_tpu_rl.render.command import SECRET_PLACEHOLDER, Command


@pytest.mark.parametrize("argv", [(), ("gcloud", 5), ("gcloud", None), ("gcloud", b"version")])
def test_argv_is_a_non_empty_sequence_of_strings(argv: tuple[object, ...]) -> None:
    with pytest.raises(TypeError, match="non-empty tuple of str"):
        Command(argv)  # type: ignore[arg-type]


def test_a_command_is_frozen_whatever_it_was_given() -> None:
    env = {"CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
    command = Command(["gcloud", "version"], env=env)  # type: ignore[arg-type]
    env["CLOUDSDK_CORE_PROJECT"] = "changed later"

    assert command.argv == ("gcloud", "version")
    assert command.tool == "gcloud"
    assert dict(command.env) == {"CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
    with pytest.raises(TypeError):
        command.env["X"] = "y"  # type: ignore[index]


def test_the_plan_shows_a_stdin_secret_as_a_placeholder_and_a_script_as_is() -> None:
    secret = Command(("gcloud", "secrets", "versions", "add", "s"), stdin_secret="hf_token")
    script = Command(("gcloud", "compute", "ssh", "vm"), stdin_text="set -e\necho hi\n")

    assert secret.to_plan_dict() == {
        "argv": ["gcloud", "secrets", "versions", "add", "s"],
        "env": {},
        "stdin": SECRET_PLACEHOLDER,
    }
    assert "hf_token" not in str(secret.to_plan_dict())
    assert script.to_plan_dict()["stdin"] == "set -e\necho hi\n"
    assert "stdin" not in Command(("gcloud", "version")).to_plan_dict()
