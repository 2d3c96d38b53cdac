"""A call of the fake ``gcloud`` joins only its command's mixin (``clis/gcloud/dispatch.py``), and
that class finds every method its handler uses, the same ones the whole ``Gcloud`` finds."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tpu_rl_sandbox
from tpu_rl_sandbox.clis.gcloud.app import Gcloud
from tpu_rl_sandbox.clis.gcloud.commands import COMMANDS
from tpu_rl_sandbox.clis.gcloud.dispatch import HANDLER_MIXINS, GcloudDispatch, gcloud_class, handler_mixin
from tpu_rl_sandbox.clis.gcloud.parser import GcloudCommand
from tpu_rl_sandbox.commands.lifecycle import SandboxInfo


def _handler_name(path: tuple[str, ...]) -> str:
    return "cmd_" + "_".join(part.replace("-", "_") for part in path)


def _owner(cls: type, name: str) -> type:
    return next(klass for klass in cls.__mro__ if name in vars(klass))


def _self_attributes(cls: type) -> tuple[set[str], set[str]]:
    """The ``self.<name>`` a class's own methods read, and those they assign."""
    read: set[str] = set()
    assigned: set[str] = set()
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            (assigned if isinstance(node.ctx, ast.Store) else read).add(node.attr)
    return read, assigned


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: " ".join(command.path))
def test_each_commands_class_holds_the_handler_the_whole_gcloud_runs(command: GcloudCommand) -> None:
    name = _handler_name(command.path)
    lean = gcloud_class(list(command.path))
    assert issubclass(lean, GcloudDispatch)
    assert _owner(lean, name) is _owner(Gcloud, name)


def test_no_two_mixins_define_the_same_name() -> None:
    """So a class of fewer mixins resolves each name it has to the definition the whole one uses."""
    owners: dict[str, list[str]] = {}
    for klass in Gcloud.__mro__[1:-1]:
        for name in vars(klass):
            if not name.startswith("__"):
                owners.setdefault(name, []).append(klass.__name__)
    assert {name: found for name, found in owners.items() if len(found) > 1} == {}


@pytest.mark.parametrize("key", sorted(HANDLER_MIXINS), ids=" ".join)
def test_a_mixins_methods_use_only_what_its_call_class_has(key: tuple[str, ...]) -> None:
    lean = type("Gcloud", (GcloudDispatch, handler_mixin(key)), {})
    read: set[str] = set()
    assigned: set[str] = set()
    for klass in lean.__mro__[1:-1]:
        more_read, more_assigned = _self_attributes(klass)
        read |= more_read
        assigned |= more_assigned
    assert sorted(name for name in read - assigned if not hasattr(lean, name)) == []


def test_a_command_that_does_not_resolve_gets_the_dispatch_alone() -> None:
    assert gcloud_class(["no-such-group", "list"]) is GcloudDispatch
    assert gcloud_class([]) is GcloudDispatch


def _imported(sandbox: SandboxInfo, *argv: str) -> tuple[int, set[str]]:
    """The modules a call imports run as its own interpreter: what the shim's client runs when no
    call server answers (tpu_rl_sandbox/clis/call_client.py), with the shim's PYTHONPATH."""
    env = {
        **os.environ,
        **sandbox.env,
        "PYTHONPROFILEIMPORTTIME": "1",
        "PYTHONPATH": str(Path(tpu_rl_sandbox.__file__).resolve().parents[1]),
    }
    result = subprocess.run(
        [sys.executable, "-m", "tpu_rl_sandbox.clis.gcloud", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    return result.returncode, {line.rsplit("|", 1)[-1].strip() for line in lines[1:]}


def test_a_fake_gcloud_call_imports_its_command_groups_module_alone(sandbox: SandboxInfo) -> None:
    code, modules = _imported(sandbox, "version")
    assert code == 0
    groups = {f"tpu_rl_sandbox.clis.gcloud.{module}" for module, _ in HANDLER_MIXINS.values()}
    assert "tpu_rl_sandbox.clis.gcloud.auth" in modules
    assert sorted(modules & groups) == ["tpu_rl_sandbox.clis.gcloud.auth"]
    assert "tpu_rl_sandbox.clis.gcloud.app" not in modules
    code, modules = _imported(sandbox, "storage", "ls", "--project=sandbox-project")
    assert code == 0
    assert "tpu_rl_sandbox.clis.gcloud.storage" in modules
    assert "tpu_rl_sandbox.clis.gcloud.compute_instances" not in modules
