"""A small reader of Dockerfile instructions for the static tests (no Docker engine here)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DOCKERFILES = ("Dockerfile", "toolchain.Dockerfile", "workload.Dockerfile", "sandbox.Dockerfile")


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, ARG, RUN, ...
    args: str  # the rest, continuation lines joined
    line: int


def instructions(path: Path) -> list[Instruction]:
    """The instructions of a Dockerfile, comments dropped and ``\\`` continuations joined."""
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment line inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(stripped)
        text = " ".join(part.strip() for part in pending)
        pending = []
        keyword, _, rest = text.partition(" ")
        out.append(Instruction(keyword.upper(), rest.strip(), start))
    return out


def arg_defaults(path: Path) -> dict[str, str]:
    """``ARG NAME=default`` of every stage (a name declared twice must have one default)."""
    defaults: dict[str, str] = {}
    for ins in instructions(path):
        if ins.keyword != "ARG" or "=" not in ins.args:
            continue
        name, _, value = ins.args.partition("=")
        value = value.strip().strip('"')
        if name in defaults and defaults[name] != value:
            raise AssertionError(f"{path.name}: ARG {name} has two defaults ({defaults[name]!r}, {value!r})")
        defaults[name] = value
    return defaults


def apt_packages(path: Path) -> list[str]:
    """Every ``name[=version]`` an ``apt-get install`` of a RUN installs."""
    packages: list[str] = []
    for ins in instructions(path):
        if ins.keyword != "RUN":
            continue
        for command in ins.args.split("&&"):
            if "apt-get install" not in command:
                continue
            words = shlex.split(command)
            if words[:2] == ["apt-get", "install"]:
                packages += [w for w in words[2:] if not w.startswith("-")]
    return packages


def copy_sources(path: Path) -> list[str]:
    """The build-context sources of every COPY/ADD without ``--from``."""
    sources: list[str] = []
    for ins in instructions(path):
        if ins.keyword not in ("COPY", "ADD"):
            continue
        words = shlex.split(ins.args)
        if any(w.startswith("--from=") for w in words):
            continue
        paths = [w for w in words if not w.startswith("--")]
        sources += paths[:-1]
    return sources
