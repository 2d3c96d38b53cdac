"""The unit the renderer produces: one command as an argv list, never a shell string."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

SECRET_PLACEHOLDER = "***"


@dataclass(frozen=True)
class Command:
    """One process to run, without a shell.

    ``argv[0]`` is the tool name (``gcluster`` or ``gcloud``); the hook maps it to the configured
    binary. ``env`` holds extra, non-secret environment variables. ``stdin_secret`` names a secret
    (e.g. ``"hf_token"``) whose value the runner writes to the process's stdin; the value itself is
    never part of the command. ``stdin_text`` is a non-secret script for stdin (SSH stage scripts).
    ``ok_if_output_contains`` lists messages that mean "already done" for idempotent steps (an
    existing bucket, a secret that exists): a non-zero exit with one of them counts as success.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    stdin_secret: str | None = None
    stdin_text: str | None = None
    ok_if_output_contains: tuple[str, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        if not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise TypeError("Command.argv must be a non-empty tuple of str")
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    @property
    def tool(self) -> str:
        return self.argv[0]

    def to_plan_dict(self) -> dict[str, Any]:
        """JSON-ready form for ``tpu-rl plan``; a stdin secret is shown only as a placeholder."""
        out: dict[str, Any] = {"argv": list(self.argv), "env": dict(self.env)}
        if self.stdin_secret:
            out["stdin"] = SECRET_PLACEHOLDER
        elif self.stdin_text is not None:
            out["stdin"] = self.stdin_text
        return out


@dataclass(frozen=True)
class ApiCall:
    """One API request a task makes itself (through a client library), shown in ``tpu-rl plan``
    beside the commands; never run from here."""

    method: str
    url: str
    body: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    description: str = ""

    def to_plan_dict(self) -> dict[str, Any]:
        return {"api": f"{self.method} {self.url}", "body": dict(self.body)}
