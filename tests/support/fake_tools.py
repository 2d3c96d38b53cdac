"""Fake ``gcluster``/``gcloud`` executables (``fake_tool.py``) and a recording logger, for the tests of
the hooks and of the tool runtime; ``tests/hooks/conftest.py`` and ``tests/toolchain/conftest.py``
provide the fixtures (``fake_tools``, ``recording_logger``, ``make_hook``)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tpu_rl_sandbox.clis.tool_stubs import write_tool_stubs

FAKE_TOOL = Path(__file__).with_name("fake_tool.py")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gcluster"


class RecordingLogger:
    """Stands in for a hook's/trigger's ``self.log``: keeps every formatted message in order."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str]] = []

    def _add(self, level: str, msg: str, *args: Any, **_: Any) -> None:
        self.records.append((level, msg % args if args else msg))

    def info(self, msg: str, *args: Any, **kw: Any) -> None:
        self._add("info", msg, *args, **kw)

    def warning(self, msg: str, *args: Any, **kw: Any) -> None:
        self._add("warning", msg, *args, **kw)

    def debug(self, msg: str, *args: Any, **kw: Any) -> None:
        self._add("debug", msg, *args, **kw)

    def error(self, msg: str, *args: Any, **kw: Any) -> None:
        self._add("error", msg, *args, **kw)

    @property
    def messages(self) -> list[str]:
        return [m for _, m in self.records]

    @property
    def text(self) -> str:
        return "\n".join(self.messages)


@dataclass
class FakeTools:
    """The bin/ folder holding fake ``gcluster`` and ``gcloud``; configure with :meth:`respond`."""

    bin_dir: Path

    @property
    def gcluster(self) -> str:
        return str(self.bin_dir / "gcluster")

    @property
    def gcloud(self) -> str:
        return str(self.bin_dir / "gcloud")

    def respond(self, *responses: dict[str, Any]) -> None:
        (self.bin_dir / "spec.json").write_text(json.dumps({"responses": list(responses)}))

    def calls(self) -> list[dict[str, Any]]:
        path = self.bin_dir / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]


def _install(bin_dir: Path, name: str) -> None:
    target = bin_dir / name
    target.write_text(f"#!{sys.executable}\n" + FAKE_TOOL.read_text())
    target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def make_fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeTools:
    """Fake ``gcluster``/``gcloud`` in ``tmp_path/bin``, put first on PATH.

    The sandbox's terraform/packer/kubectl/gke-gcloud-auth-plugin stubs go on PATH too (their own
    folder), so the toolchain check before ``gcluster deploy``/``job`` passes; the cache is under
    ``tmp_path``.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("gcluster", "gcloud"):
        _install(bin_dir, name)
    stubs = tmp_path / "tool-stubs"  # apart from gcloud's folder, which the toolchain puts on PATH
    write_tool_stubs(stubs)
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), str(stubs), os.environ.get("PATH", "")]))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    tools = FakeTools(bin_dir)
    tools.respond()
    return tools


@pytest.fixture
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeTools:
    return make_fake_tools(tmp_path, monkeypatch)


@pytest.fixture
def recording_logger() -> RecordingLogger:
    return RecordingLogger()


@pytest.fixture
def make_hook(fake_tools: FakeTools, recording_logger: RecordingLogger) -> Callable[..., Any]:
    from airflow_provider_tpu_rl.hooks.gcluster import GclusterConfig, GclusterHook

    def make(**overrides: Any) -> GclusterHook:
        values = {"gcluster_path": fake_tools.gcluster, "gcloud_path": fake_tools.gcloud, "project": "proj"}
        values.update(overrides)
        hook = GclusterHook(config=GclusterConfig(**values))
        hook._log = recording_logger  # type: ignore[assignment]
        return hook

    return make


def fixture_path(name: str) -> str:
    return str(FIXTURES / name)


def copy_fixture(name: str, dest: Path) -> Path:
    return Path(shutil.copy(FIXTURES / name, dest))
