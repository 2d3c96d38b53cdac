"""Turn the tutorials' shell snippets into argv lists the way bash would, for comparison."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path

TUTORIALS = Path(__file__).parent / "tutorials"
_VAR = re.compile(r"\$\{([A-Z_]+)(?::?[?-][^}]*)?\}")


def expand(text: str, values: Mapping[str, str]) -> str:
    """Line continuations, ``${VAR}``/``${VAR:?}``/``${VAR:-}`` and the seed's one arithmetic form."""
    text = text.replace("\\\n", "")
    if "USE_PATHWAYS" in values:
        text = text.replace("$((1 - USE_PATHWAYS))", str(1 - int(values["USE_PATHWAYS"])))
    return _VAR.sub(lambda m: values[m.group(1)], text)


def commands(name: str, values: Mapping[str, str]) -> list[list[str]]:
    """Every command of a tutorial snippet as the argv bash would run."""
    text = expand((TUTORIALS / name).read_text(), values)
    return [[t.replace("\\$", "$") for t in shlex.split(line)] for line in text.splitlines() if line.strip()]


def flags(argv: list[str], bool_flags: set[str]) -> dict[str, list[str]]:
    """pflag-style parsing: ``--f=v``, ``--f v``, ``-l v``; booleans get ``"true"``."""
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("-"):
            name, eq, value = token.partition("=")
            if not eq:
                if name in bool_flags:
                    value = "true"
                else:
                    i += 1
                    value = argv[i]
            out.setdefault(name, []).append(value)
        i += 1
    return out


def module_args(command: str, module: str) -> dict[str, str]:
    """``key=value`` / ``--key=value`` / ``--flag`` arguments given to ``python3 -m module``."""
    tokens = shlex.split(command)
    start = tokens.index(module) + 1
    args: dict[str, str] = {}
    for token in tokens[start:]:
        if token in {";", "}", "&&", "||"}:
            break
        key, eq, value = token.partition("=")
        args[key] = value if eq else "true"
    return args


def python_c_snippets(command: str) -> list[str]:
    tokens = shlex.split(command)
    return [tokens[i + 2] for i in range(len(tokens) - 2) if tokens[i] == "python3" and tokens[i + 1] == "-c"]
