"""``gcluster``'s argument rules: spf13/cobra + spf13/pflag, what it is built with.

:class:`CobraCommand` / :func:`cobra_parse`: ``--flag=value`` and ``--flag value``, shorthand
clusters (``-wl IGNORE``), bools that take a value only with ``=``, string slices parsed as CSV
and appended on repetition, persistent flags inherited by sub-commands, cobra's error texts.
"""

from __future__ import annotations

import csv
import difflib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

BOOL_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
BOOL_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


class CobraError(Exception):
    """A cobra/pflag error: printed as ``Error: <message>``, exit code 1."""

    def __init__(self, message: str, show_usage: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.show_usage = show_usage


class CobraHelp(Exception):
    """``-h/--help`` was given, or a non-runnable command group was called."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


@dataclass(frozen=True)
class Flag:
    """One pflag flag."""

    name: str
    kind: str = "string"  # string|bool|int|stringSlice|stringArray|stringToString|intSlice
    shorthand: str = ""
    default: Any = None
    usage: str = ""

    def initial(self) -> Any:
        if self.default is not None:
            return list(self.default) if isinstance(self.default, list) else self.default
        return {
            "string": "",
            "bool": False,
            "int": 0,
            "stringSlice": [],
            "stringArray": [],
            "stringToString": {},
            "intSlice": [],
        }[self.kind]

    def display(self) -> str:
        return f"-{self.shorthand}, --{self.name}" if self.shorthand else f"--{self.name}"


@dataclass
class CobraCommand:
    """A cobra command with its flags and children."""

    name: str
    short: str = ""
    flags: list[Flag] = field(default_factory=list)
    persistent_flags: list[Flag] = field(default_factory=list)
    children: list[CobraCommand] = field(default_factory=list)
    runnable: bool = True
    silence_usage: bool = False
    exact_args: int | None = None
    usage_line: str = ""
    parent: CobraCommand | None = None

    def add(self, *children: CobraCommand) -> CobraCommand:
        for child in children:
            child.parent = self
            self.children.append(child)
        return self

    def child(self, name: str) -> CobraCommand | None:
        return next((c for c in self.children if c.name == name), None)

    def command_path(self) -> str:
        return f"{self.parent.command_path()} {self.name}" if self.parent else self.name

    def all_flags(self) -> list[Flag]:
        """Local flags, then persistent flags of this command and its ancestors, then help."""
        result: list[Flag] = list(self.flags)
        node: CobraCommand | None = self
        while node is not None:
            result.extend(node.persistent_flags)
            node = node.parent
        result.append(Flag("help", "bool", "h", usage=f"help for {self.name}"))
        return result

    def usage(self) -> str:
        lines = ["Usage:"]
        if self.runnable:
            lines.append(f"  {self.usage_line or self.command_path() + ' [flags]'}")
        if self.children:
            lines.append(f"  {self.command_path()} [command]")
            lines += ["", "Available Commands:"]
            lines += [f"  {c.name:<12} {c.short}" for c in self.children]
        flags = sorted(self.all_flags(), key=lambda f: f.name)
        if flags:
            lines += ["", "Flags:"]
            lines += [f"  {f.display():<34} {f.usage}" for f in flags]
        if self.children:
            lines += [
                "",
                f'Use "{self.command_path()} [command] --help" for more information about a command.',
            ]
        return "\n".join(lines) + "\n"


@dataclass
class CobraParse:
    """Result of parsing: the command, flag values, which flags were set, positional args."""

    command: CobraCommand
    values: dict[str, Any]
    changed: set[str]
    args: list[str]

    def get(self, name: str) -> Any:
        return self.values[name]


def _csv_fields(value: str, flag: Flag) -> list[str]:
    if value == "":
        return []
    try:
        rows = list(csv.reader(io.StringIO(value), strict=True))
    except csv.Error as error:
        raise CobraError(f'invalid argument "{value}" for "{flag.display()}" flag: {error}') from None
    return rows[0] if rows else []


def _set_flag(flag: Flag, raw: str, values: dict[str, Any], changed: set[str]) -> None:
    first = flag.name not in changed
    if flag.kind == "bool":
        if raw in BOOL_TRUE:
            values[flag.name] = True
        elif raw in BOOL_FALSE:
            values[flag.name] = False
        else:
            raise CobraError(
                f'invalid argument "{raw}" for "{flag.display()}" flag: strconv.ParseBool: parsing "{raw}": invalid syntax'
            )
    elif flag.kind == "int":
        try:
            values[flag.name] = int(raw, 0) if raw.strip() == raw else int("x")
        except ValueError:
            raise CobraError(
                f'invalid argument "{raw}" for "{flag.display()}" flag: strconv.ParseInt: parsing "{raw}": invalid syntax'
            ) from None
    elif flag.kind in ("stringSlice", "intSlice"):
        items = _csv_fields(raw, flag)
        if flag.kind == "intSlice":
            try:
                items_int = [int(item) for item in items]
            except ValueError:
                raise CobraError(
                    f'invalid argument "{raw}" for "{flag.display()}" flag: strconv.Atoi: invalid syntax'
                ) from None
            values[flag.name] = items_int if first else values[flag.name] + items_int
        else:
            values[flag.name] = items if first else values[flag.name] + items
    elif flag.kind == "stringArray":
        values[flag.name] = [raw] if first else [*values[flag.name], raw]
    elif flag.kind == "stringToString":
        mapping: dict[str, str] = {} if first else dict(values[flag.name])
        for item in _csv_fields(raw, flag):
            key, sep, val = item.partition("=")
            if not sep:
                raise CobraError(
                    f'invalid argument "{raw}" for "{flag.display()}" flag: {item} must be formatted as key=value'
                )
            mapping[key] = val
        values[flag.name] = mapping
    else:
        values[flag.name] = raw
    changed.add(flag.name)


def _suggest(word: str, options: Sequence[str]) -> list[str]:
    return difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)


def _find(root: CobraCommand, args: list[str]) -> tuple[CobraCommand, list[str]]:
    """cobra's ``Find``: walk sub-command names, skipping flags (and their values)."""
    command = root
    remaining = list(args)
    while True:
        known = {f.name: f for f in command.all_flags()}
        shorts = {f.shorthand: f for f in command.all_flags() if f.shorthand}
        index = 0
        next_name: str | None = None
        while index < len(remaining):
            arg = remaining[index]
            if arg == "--":
                break
            if arg.startswith("--"):
                name = arg[2:].split("=", 1)[0]
                flag = known.get(name)
                if "=" not in arg and flag is not None and flag.kind != "bool":
                    index += 1
                index += 1
                continue
            if arg.startswith("-") and len(arg) > 1:
                flag = shorts.get(arg[1])
                if len(arg) == 2 and flag is not None and flag.kind != "bool":
                    index += 1
                index += 1
                continue
            next_name = arg
            break
        if next_name is None or not command.children:
            return command, remaining
        child = command.child(next_name)
        if child is None:
            if command.parent is None:
                hint = _suggest(next_name, [c.name for c in command.children])
                message = f'unknown command "{next_name}" for "{command.command_path()}"'
                if hint:
                    message += "\n\nDid you mean this?\n\t" + hint[0] + "\n"
                message += f"\nRun '{command.command_path()} --help' for usage."
                raise CobraError(message, show_usage=False)
            return command, remaining
        del remaining[index]
        command = child


def cobra_parse(root: CobraCommand, argv: Sequence[str]) -> CobraParse:
    """Find the command for ``argv`` and parse its flags like pflag does."""
    command, rest = _find(root, list(argv))
    flags = command.all_flags()
    by_name = {f.name: f for f in flags}
    by_short = {f.shorthand: f for f in flags if f.shorthand}
    values = {f.name: f.initial() for f in flags}
    changed: set[str] = set()
    positional: list[str] = []
    index = 0
    while index < len(rest):
        arg = rest[index]
        index += 1
        if arg == "--":
            positional.extend(rest[index:])
            break
        if arg.startswith("--") and len(arg) > 2:
            name, has_value, value = arg[2:].partition("=")
            flag = by_name.get(name)
            if flag is None:
                raise CobraError(f"unknown flag: --{name}")
            if has_value:
                _set_flag(flag, value, values, changed)
            elif flag.kind == "bool":
                _set_flag(flag, "true", values, changed)
            elif index < len(rest):
                _set_flag(flag, rest[index], values, changed)
                index += 1
            else:
                raise CobraError(f"flag needs an argument: --{name}")
            continue
        if arg.startswith("-") and len(arg) > 1 and arg != "--":
            shorts = arg[1:]
            position = 0
            while position < len(shorts):
                char = shorts[position]
                flag = by_short.get(char)
                if flag is None:
                    raise CobraError(f"unknown shorthand flag: '{char}' in -{shorts}")
                tail = shorts[position + 1 :]
                if flag.kind == "bool":
                    if tail.startswith("="):
                        _set_flag(flag, tail[1:], values, changed)
                        break
                    _set_flag(flag, "true", values, changed)
                    position += 1
                    continue
                if tail:
                    _set_flag(flag, tail[1:] if tail.startswith("=") else tail, values, changed)
                elif index < len(rest):
                    _set_flag(flag, rest[index], values, changed)
                    index += 1
                else:
                    raise CobraError(f"flag needs an argument: '{char}' in -{shorts}")
                break
            continue
        positional.append(arg)
    if values.get("help"):
        raise CobraHelp(command.usage())
    if not command.runnable:
        raise CobraHelp(command.usage())
    if command.exact_args is not None and len(positional) != command.exact_args:
        raise CobraError(f"accepts {command.exact_args} arg(s), received {len(positional)}")
    return CobraParse(command, values, changed, positional)


def required_flags_error(parsed: CobraParse, required: Sequence[str]) -> CobraError | None:
    """cobra's ``ValidateRequiredFlags``: names sorted like pflag's ``VisitAll``."""
    missing = sorted(name for name in required if name not in parsed.changed)
    if not missing:
        return None
    joined = '", "'.join(missing)
    return CobraError(f'required flag(s) "{joined}" not set')
