"""What ``gcloud`` prints: resources in a ``--format`` (yaml, json, ``value(...)``) or as a table,
the ``--filter`` it applies, and its errors (``ERROR: (gcloud.x) ...``, an API's error text)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

Write = Callable[[str], None]


class GcloudError(Exception):
    """An API/tool error: ``ERROR: (gcloud.x) <message>``, exit code 1 (or ``code``)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class StorageOpError(Exception):
    """A ``gcloud storage cp|rsync|ls|rm`` failure (:mod:`.storage_ops`): printed as
    ``ERROR: (gcloud.storage.<cmd>) <message>``, exit code 1."""


def unspecified_attribute(resource: str, attribute: str, prop: str) -> GcloudError:
    """A resource argument missing an attribute with neither its flag nor its property set
    (calliope/concepts/concepts.py l.430-433, deps.py l.386-393; checked with gcloud 528)."""
    return GcloudError(
        f"Error parsing [{resource}].\nThe [{resource}] resource is not properly specified.\n"
        f"Failed to find attribute [{attribute}]. The attribute can be set in the following ways: \n"
        f"- provide the argument `{resource}` on the command line with a fully specified name\n"
        f"- provide the argument `--{attribute}` on the command line\n- set the property `{prop}`"
    )


def api_error_text(problem: str, account: str = "") -> str:
    """How gcloud prints an API error: ``NOT_FOUND: ...`` / ``PERMISSION_DENIED: ...``; for a 403
    it appends who the command ran as (googlecloudsdk/api_lib/util/exceptions.py
    HttpErrorPayload + core/credentials/store.py CredentialInfo.GetInfoString)."""
    message = problem
    if message.startswith("google.api_core.exceptions."):
        message = message.split(": ", 1)[-1].replace("404 ", "NOT_FOUND: ", 1)
    if message.startswith("PERMISSION_DENIED") and account:
        info = f"This command is authenticated as {account} which is the active account specified by the [core/account] property."
        message = message + " " + info if message.endswith(".") else message + ". " + info[:-1]
    return message


def formatted(value: Any, fmt: str | None, default: str = "yaml") -> str:
    fmt = (fmt or default).strip()
    if fmt == "json":
        return json.dumps(value, indent=2, sort_keys=True) + "\n"
    if fmt in ("none", "disable"):
        return ""
    match = re.fullmatch(r"value\((.*)\)", fmt)
    if match:
        keys = [k.strip() for k in match.group(1).split(",") if k.strip()]
        rows = value if isinstance(value, list) else [value]
        lines = []
        for row in rows:
            lines.append("\t".join(str(dig(row, key) if dig(row, key) is not None else "") for key in keys))
        return "\n".join(lines) + ("\n" if lines else "")
    import yaml  # imported where used: each fake call is a fresh interpreter

    if isinstance(value, list):
        return "".join("---\n" + yaml.safe_dump(item, sort_keys=True) for item in value)
    return yaml.safe_dump(value, sort_keys=True)


def dig(resource: Any, dotted: str) -> Any:
    """``a.b`` and ``a[0].b`` keys of gcloud's resource projections."""
    current = resource
    for piece in dotted.split("."):
        match = re.fullmatch(r"([^\[]*)((?:\[\d+\])*)", piece)
        name, indexes = (match.group(1), re.findall(r"\d+", match.group(2))) if match else (piece, [])
        if name:
            if not isinstance(current, dict):
                return None
            current = current.get(name)
        for index in indexes:
            if not isinstance(current, list) or int(index) >= len(current):
                return None
            current = current[int(index)]
    return current


def matches_filter(resource: dict[str, Any], expression: str | None) -> bool:
    """gcloud's ``--filter`` for the forms the provider uses: ``a.b=v``, ``a.b:v``, ``a=(v OR w)``,
    ``a~"regex"``, ``AND``, ``NOT``. A ``~`` pattern holding parentheses must be quoted, as gcloud's
    filter lexer reads an unquoted ``(`` as the start of a value list (resource_filter.py)."""
    if not expression or not expression.strip():
        return True
    terms = re.split(r"\s+AND\s+|\s+(?=(?:NOT\s+|-)?[A-Za-z_][\w.]*\s*[:=~!])", expression.strip())
    for raw in terms:
        term = raw.strip()
        if not term:
            continue
        negate = False
        if term.startswith("NOT "):
            negate, term = True, term[4:].strip()
        elif term.startswith("-"):
            negate, term = True, term[1:].strip()
        match = re.fullmatch(r"([A-Za-z_][\w.\-]*)\s*(!=|=|:|~)\s*(.*)", term)
        if not match:
            raise GcloudError(f"Invalid value for [--filter]: unsupported expression [{raw}].")
        key, op, given = match.group(1), match.group(2), match.group(3).strip()
        quoted = len(given) >= 2 and given[0] == given[-1] and given[0] in "'\""
        if op == "~" and not quoted and "(" in given:
            raise GcloudError(f"Invalid value for [--filter]: Unexpected tokens [{raw}] in expression.")
        if quoted:
            choices = [given[1:-1]]
        elif given.startswith("(") and given.endswith(")") and " OR " in given:
            choices = [part.strip().strip("'\"") for part in given[1:-1].split(" OR ")]
        else:
            choices = [given.strip("'\"()")]
        actual = dig(resource, key)
        result = any(_term_matches(actual, op, wanted) for wanted in choices)
        if result == negate:
            return False
    return True


def _term_matches(actual: Any, op: str, wanted: str) -> bool:
    if op == ":" and wanted == "*":
        return actual is not None
    if actual is None:
        return False
    if op in ("=", "!="):
        equal = str(actual).lower() == wanted.lower() if not isinstance(actual, list) else wanted in actual
        return (not equal) if op == "!=" else equal
    if op == ":":
        text = json.dumps(actual) if isinstance(actual, (list, dict)) else str(actual)
        return wanted.lower() in text.lower()
    return re.search(wanted, str(actual)) is not None


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() + "\n" for row in rows
    )
