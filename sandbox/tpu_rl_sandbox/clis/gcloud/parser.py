"""``gcloud``'s argument rules (its argparse-based parser): ``--flag=value`` or ``--flag value``,
``unrecognized arguments`` and ``Must be specified`` errors with exit code 2."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

GCLOUD_SEARCH_HINT = "\nTo search the help text of gcloud commands, run:\n  gcloud help -- SEARCH_TERMS"


class GcloudUsageError(Exception):
    """An argument error: ``ERROR: (gcloud.x.y) <message>``, exit code 2."""

    def __init__(self, command: str, message: str) -> None:
        super().__init__(message)
        self.command = command
        self.message = message

    def render(self) -> str:
        return f"ERROR: ({self.command}) {self.message}\n{GCLOUD_SEARCH_HINT}\n"


@dataclass(frozen=True)
class GFlag:
    """One gcloud flag."""

    name: str  # without leading dashes
    kind: str = "value"  # value|bool|append
    required: bool = False
    choices: tuple[str, ...] = ()
    short: str = ""
    negatable: bool = False


@dataclass(frozen=True)
class GPositional:
    """One gcloud positional argument."""

    name: str
    required: bool = True
    many: bool = False


@dataclass(frozen=True)
class GcloudCommand:
    """A gcloud command (``path`` like ``("storage", "buckets", "create")``)."""

    path: tuple[str, ...]
    positionals: tuple[GPositional, ...] = ()
    flags: tuple[GFlag, ...] = ()
    # mutually exclusive groups of flag names (argparse's add_mutually_exclusive_group)
    exclusive: tuple[tuple[str, ...], ...] = ()

    @property
    def dotted(self) -> str:
        return "gcloud." + ".".join(self.path)


GLOBAL_FLAGS = (
    GFlag("project"),
    GFlag("quiet", "bool", short="q"),
    GFlag("format"),
    GFlag("verbosity"),
    GFlag("account"),
    GFlag("configuration"),
    GFlag("impersonate-service-account"),
    GFlag("billing-project"),
    GFlag("log-http", "bool"),
    GFlag("user-output-enabled", "bool", negatable=True),
    GFlag("trace-token"),
    GFlag("help", "bool", short="h"),
)


@dataclass
class GcloudParse:
    """Parsed gcloud arguments."""

    command: GcloudCommand
    values: dict[str, Any]
    given: set[str]
    positionals: dict[str, Any]

    def get(self, name: str, default: Any = None) -> Any:
        value = self.values.get(name)
        return default if value is None else value


def gcloud_resolve(commands: Sequence[GcloudCommand], argv: Sequence[str]) -> tuple[GcloudCommand, list[str]]:
    """Longest command path that prefixes ``argv`` (flags may not come before the path)."""
    best: GcloudCommand | None = None
    for command in commands:
        size = len(command.path)
        if tuple(argv[:size]) == command.path and (best is None or size > len(best.path)):
            best = command
    if best is not None:
        return best, list(argv[len(best.path) :])
    # Report the first level that does not match, like gcloud does.
    groups: set[tuple[str, ...]] = set()
    for command in commands:
        for depth in range(len(command.path)):
            groups.add(command.path[: depth + 1])
    matched: tuple[str, ...] = ()
    for word in argv:
        candidate = (*matched, word)
        if candidate in groups:
            matched = candidate
            continue
        options = sorted(
            {g[len(matched)] for g in groups if len(g) > len(matched) and g[: len(matched)] == matched}
        )
        dotted = "gcloud" + "".join("." + part for part in matched)
        message = f"Invalid choice: '{word}'."
        import difflib  # here: only a mistyped command asks

        hint = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
        if hint:
            message += "\nMaybe you meant:\n  gcloud " + " ".join((*matched, hint[0]))
        raise GcloudUsageError(dotted, message)
    dotted = "gcloud" + "".join("." + part for part in matched)
    raise GcloudUsageError(dotted, "Command name argument expected.")


def gcloud_parse(command: GcloudCommand, args: Sequence[str]) -> GcloudParse:
    """Parse ``args`` (after the command path) with gcloud's rules."""
    flags = {f.name: f for f in (*command.flags, *GLOBAL_FLAGS)}
    shorts = {f.short: f for f in flags.values() if f.short}
    values: dict[str, Any] = {name: ([] if f.kind == "append" else None) for name, f in flags.items()}
    given: set[str] = set()
    order: list[str] = []  # the flags given, as they came
    loose: list[str] = []
    unknown: list[str] = []
    index = 0
    args = list(args)
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            loose.extend(args[index:])
            break
        if arg.startswith("--") and len(arg) > 2:
            name, has_value, value = arg[2:].partition("=")
            flag = flags.get(name)
            negated = False
            if flag is None and name.startswith("no-") and name[3:] in flags and flags[name[3:]].negatable:
                flag, negated = flags[name[3:]], True
            if flag is None:
                unknown.append(arg)
                continue
            if flag.kind == "bool":
                if has_value:
                    raise GcloudUsageError(
                        command.dotted, f"argument --{name}: ignored explicit argument '{value}'"
                    )
                values[flag.name] = not negated
                given.add(flag.name)
                order.append(flag.name)
                continue
            if not has_value:
                if index >= len(args) or (args[index].startswith("-") and len(args[index]) > 1):
                    raise GcloudUsageError(command.dotted, f"argument --{name}: expected one argument")
                value = args[index]
                index += 1
            if flag.choices and value not in flag.choices:
                raise GcloudUsageError(
                    command.dotted,
                    f"argument --{name}: Invalid choice: '{value}'.",
                )
            if flag.kind == "append":
                values[flag.name].append(value)
            else:
                values[flag.name] = value
            given.add(flag.name)
            order.append(flag.name)
            continue
        if arg.startswith("-") and len(arg) == 2 and arg[1] in shorts:
            flag = shorts[arg[1]]
            if flag.kind == "bool":
                values[flag.name] = True
                given.add(flag.name)
                continue
            if index >= len(args):
                raise GcloudUsageError(command.dotted, f"argument {arg}: expected one argument")
            values[flag.name] = args[index]
            given.add(flag.name)
            index += 1
            continue
        if arg.startswith("-") and len(arg) > 1:
            unknown.append(arg)
            continue
        loose.append(arg)
    positionals: dict[str, Any] = {}
    for spec in command.positionals:
        if spec.many:
            positionals[spec.name] = list(loose)
            loose = []
        elif loose:
            positionals[spec.name] = loose.pop(0)
        else:
            positionals[spec.name] = None
    unknown.extend(loose)
    if values.get("help"):
        raise GcloudUsageError(command.dotted, "help is not available in the sandbox")
    if unknown:
        raise GcloudUsageError(command.dotted, "unrecognized arguments: " + " ".join(unknown) + " ")
    for spec in command.positionals:
        if spec.required and not positionals.get(spec.name):
            # argparse shows a one-or-more positional (nargs='+') as "NAME [NAME ...]"
            shown = f"{spec.name} [{spec.name} ...]" if spec.many else spec.name
            raise GcloudUsageError(command.dotted, f"argument {shown}: Must be specified.")
    for group in command.exclusive:
        seen = list(dict.fromkeys(name for name in order if name in group))
        if len(seen) > 1:
            choices = " | ".join(f"--{name}" for name in sorted(group))
            raise GcloudUsageError(
                command.dotted, f"argument --{seen[1]}: At most one of {choices} can be specified."
            )
    missing = [f"--{f.name}" for f in command.flags if f.required and f.name not in given]
    if missing:
        raise GcloudUsageError(command.dotted, f"argument {' '.join(missing)}: Must be specified.")
    return GcloudParse(command, values, given, positionals)
