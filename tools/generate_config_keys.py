"""Generate ``config_keys.py``: the MaxText config keys ``train_rl`` accepts, per pinned MaxText version.

A developer tool, not part of the provider wheel. Read from MaxText's own source, never imported
(it needs JAX): ``src/maxtext/configs/types.py`` (the pydantic models) and
``src/maxtext/configs/pyconfig.py`` (how a ``key=value`` is looked up); from the repository root::

    python tools/generate_config_keys.py \\
        --source 0.2.4=/path/to/maxtext.git@maxtext-v0.2.4 \\
        --source 0.2.3=/path/to/maxtext.git@maxtext-v0.2.3 > airflow_provider_tpu_rl/maxtext/config_keys.py

(or ``python -m tools.generate_config_keys``). A source is a git directory and a ref
(``DIR@REF``) or a checkout folder (``DIR``, with ``--commit VERSION=SHA``). The newest version
gets a full table; each older one is written as its difference from it (keys added, changed and
removed). tests/maxtext/test_config_keys.py regenerates the file from a copy of these inputs and
fails when it is stale.

What the model says (MaxText ``maxtext-v0.2.4``): ``train_rl`` builds ``types.RLConfig``
(``pyconfig.initialize(argv, config_class=types.RLConfig)``); ``pyconfig._prepare_for_pydantic``
refuses a key that is not a field of that class or of a nested model field
(``_check_for_invalid_keys``); a dotted ``rl.num_generations=4`` is nested by OmegaConf under the
field ``rl``, whose own model ignores unknown sub-keys. At ``maxtext-v0.2.3`` ``train_rl`` builds
``types.MaxTextConfig`` and only its own fields are keys.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TYPES_PATH = "src/maxtext/configs/types.py"
PYCONFIG_PATH = "src/maxtext/configs/pyconfig.py"
REPOSITORY = "AI-Hypercomputer/maxtext"
_GIT_TIMEOUT = 60

# pydantic's constrained types (pydantic/types.py) and MaxText's aliases of plain types.
_PLAIN: dict[str, tuple[str, dict[str, float]]] = {
    "bool": ("bool", {}),
    "int": ("int", {}),
    "float": ("float", {}),
    "str": ("str", {}),
    "PositiveInt": ("int", {"gt": 0}),
    "NonNegativeInt": ("int", {"ge": 0}),
    "NegativeInt": ("int", {"lt": 0}),
    "PositiveFloat": ("float", {"gt": 0}),
    "NonNegativeFloat": ("float", {"ge": 0}),
    "list": ("list", {}),
    "tuple": ("list", {}),
    "dict": ("dict", {}),
    "Any": ("any", {}),
}
_BOUNDS = ("ge", "gt", "le", "lt")


@dataclass(frozen=True)
class Source:
    """One pinned MaxText version's inputs."""

    version: str
    ref: str
    commit: str
    types_py: str
    pyconfig_py: str

    def sha256(self, text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Key:
    kind: str
    nullable: bool = False
    choices: tuple[Any, ...] = ()
    bounds: dict[str, float] = field(default_factory=dict)
    model: str | None = None  # a nested pydantic model's class name

    def render(self) -> str:
        parts = [_lit(self.kind)]
        if self.nullable:
            parts.append("nullable=True")
        if self.choices:
            parts.append(f"choices={_lit(self.choices)}")
        parts += [f"{name}={_lit(self.bounds[name])}" for name in _BOUNDS if name in self.bounds]
        return f"K({', '.join(parts)})"


def _lit(value: Any) -> str:
    """A Python literal as ``ruff format`` writes it (double quotes)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple):
        items = [_lit(v) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return repr(value)


@dataclass
class _Module:
    classes: dict[str, ast.ClassDef]
    aliases: dict[str, ast.expr]
    enums: dict[str, tuple[str, tuple[Any, ...]]]


def _parse(text: str) -> _Module:
    tree = ast.parse(text)
    classes: dict[str, ast.ClassDef] = {}
    aliases: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = node
        elif (
            isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ):
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "NewType":
                value = value.args[1]  # NewType("X", str) is a str
            aliases[node.targets[0].id] = value
    enums: dict[str, tuple[str, tuple[Any, ...]]] = {}
    for name, cls in classes.items():
        bases = {_name(b) for b in cls.bases}
        if not bases & {"Enum", "IntEnum", "enum.IntEnum", "enum.Enum"}:
            continue
        values = []
        for item in cls.body:
            if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant):
                values.append(item.value.value)
        if "str" in bases:
            enums[name] = ("str", tuple(values))
        elif "IntEnum" in bases or "enum.IntEnum" in bases:
            enums[name] = ("int", tuple(values))
        else:
            enums[name] = ("any", ())
    return _Module(classes, aliases, enums)


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def _is_model(module: _Module, name: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether ``name`` is a pydantic model class of the file (a ``BaseModel`` subclass)."""
    cls = module.classes.get(name)
    if cls is None or name in seen:
        return False
    bases = [_name(b) for b in cls.bases]
    return "BaseModel" in bases or any(_is_model(module, b, seen | {name}) for b in bases)


def _union(items: Iterable[ast.expr]) -> list[ast.expr]:
    out: list[ast.expr] = []
    for item in items:
        if isinstance(item, ast.BinOp) and isinstance(item.op, ast.BitOr):
            out += _union([item.left, item.right])
        else:
            out.append(item)
    return out


def _key_of(module: _Module, node: ast.expr, depth: int = 0) -> Key:
    """The kind of value an annotation admits."""
    if depth > 10:
        return Key("any")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _of_union(module, _union([node]), depth)
    if isinstance(node, ast.Subscript):
        head = _name(node.value)
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head in {"Optional", "typing.Optional"}:
            return _of_union(module, [*args, ast.Constant(None)], depth)
        if head in {"Union", "typing.Union"}:
            return _of_union(module, args, depth)
        if head in {"Literal", "typing.Literal"}:
            values = tuple(a.value for a in args if isinstance(a, ast.Constant))
            kinds = {type(v).__name__ for v in values if v is not None}
            kind = kinds.pop() if len(kinds) == 1 else "any"
            return Key(kind, nullable=None in values, choices=tuple(v for v in values if v is not None))
        if head in {"list", "List", "tuple", "Tuple", "Sequence", "set"}:
            return Key("list")
        if head in {"dict", "Dict", "Mapping"}:
            return Key("dict")
        return Key("any")
    name = _name(node)
    if isinstance(node, ast.Constant) and node.value is None:
        return Key("any", nullable=True)
    if name in _PLAIN:
        kind, bounds = _PLAIN[name]
        return Key(kind, bounds=dict(bounds))
    if name in module.enums:
        kind, values = module.enums[name]
        return Key(kind, choices=values)
    if _is_model(module, name):
        return Key("model", model=name)
    if name in module.aliases:
        return _key_of(module, module.aliases[name], depth + 1)
    return Key("any")


def _of_union(module: _Module, members: list[ast.expr], depth: int) -> Key:
    nullable = any(isinstance(m, ast.Constant) and m.value is None for m in members)
    keys = [
        _key_of(module, m, depth + 1)
        for m in members
        if not (isinstance(m, ast.Constant) and m.value is None)
    ]
    if len(keys) == 1:
        key = keys[0]
        key.nullable = key.nullable or nullable
        return key
    if keys and all(k.kind == keys[0].kind for k in keys):
        return Key(keys[0].kind, nullable=nullable)
    if {k.kind for k in keys} == {"int", "float"}:
        return Key("float", nullable=nullable)
    return Key("any", nullable=nullable)


def _field_bounds(value: ast.expr | None) -> dict[str, float]:
    if not (isinstance(value, ast.Call) and _name(value.func) in {"Field", "pydantic.Field"}):
        return {}
    bounds: dict[str, float] = {}
    for keyword in value.keywords:
        if keyword.arg in _BOUNDS:
            try:
                number = ast.literal_eval(keyword.value)
            except ValueError:
                continue
            if isinstance(number, int | float) and not isinstance(number, bool):
                bounds[keyword.arg] = number
    return bounds


def _fields(module: _Module, name: str, seen: frozenset[str] = frozenset()) -> dict[str, Key]:
    """A model's fields, its bases' first (pydantic: a subclass's annotation wins)."""
    cls = module.classes[name]
    out: dict[str, Key] = {}
    for base in reversed(cls.bases):  # Python's MRO: the first base wins
        base_name = _name(base)
        if base_name in module.classes and base_name not in seen and _is_model(module, base_name):
            out.update(_fields(module, base_name, seen | {name}))
    for item in cls.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        field_name = item.target.id
        if field_name.startswith("_") or _name(item.annotation).endswith("ClassVar"):
            continue
        if isinstance(item.annotation, ast.Subscript) and _name(item.annotation.value).endswith("ClassVar"):
            continue
        key = _key_of(module, item.annotation)
        key.bounds = {**key.bounds, **_field_bounds(item.value)}
        out[field_name] = key
    return out


@dataclass
class KeyTable:
    """The keys of one version: flat ones and the sub-keys of nested models (``rl.<key>``)."""

    config_class: str
    keys: dict[str, Key]
    nested: dict[str, dict[str, Key]]


def key_table(source: Source) -> KeyTable:
    """Every key ``train_rl`` accepts at ``source``."""
    module = _parse(source.types_py)
    # maxtext-v0.2.4 train_rl.py: pyconfig.initialize(argv_list, config_class=types.RLConfig);
    # maxtext-v0.2.3: pyconfig.initialize(argv_list) (the default, types.MaxTextConfig).
    config_class = "RLConfig" if "RLConfig" in module.classes else "MaxTextConfig"
    top = _fields(module, config_class)
    nested = {name: _fields(module, key.model) for name, key in top.items() if key.model}
    keys = dict(top)
    # pyconfig._check_for_invalid_keys (when present) also accepts a nested model's fields as
    # flat keys (RLConfig.map_flat_fields_to_nested_models routes them).
    if "def _check_for_invalid_keys" in source.pyconfig_py:
        pending = [key.model for key in top.values() if key.model]
        done: set[str] = set()
        while pending:
            model = pending.pop()
            if model is None or model in done:
                continue
            done.add(model)
            for sub_name, sub in _fields(module, model).items():
                keys.setdefault(sub_name, sub)
                if sub.model:
                    pending.append(sub.model)
    return KeyTable(config_class, dict(sorted(keys.items())), dict(sorted(nested.items())))


def _ident(version: str) -> str:
    return version.replace(".", "_").replace("-", "_")


def _version_key(version: str) -> tuple[int | str, ...]:
    return tuple(int(part) if part.isdigit() else part for part in version.replace("-", ".").split("."))


def _table_lines(keys: Mapping[str, Key], indent: str) -> list[str]:
    return [f"{indent}{_lit(name)}: {key.render()}," for name, key in keys.items()]


def _diff_lines(base_name: str, base: Mapping[str, Key], target: Mapping[str, Key], indent: str) -> list[str]:
    """``_derive(base_name, added=..., changed=..., removed=...)``: ``target`` as ``base`` changed."""
    added = {name: key for name, key in target.items() if name not in base}
    changed = {
        name: key for name, key in target.items() if name in base and key.render() != base[name].render()
    }
    removed = [name for name in base if name not in target]
    inner = indent + "    "
    lines = ["_derive(", f"{inner}{base_name},"]
    lines.append(f"{inner}added={{")
    lines += _table_lines(added, inner + "    ")
    lines.append(f"{inner}}},")
    lines.append(f"{inner}changed={{")
    lines += _table_lines(changed, inner + "    ")
    lines.append(f"{inner}}},")
    lines.append(f"{inner}removed=(")
    lines += [f"{inner}    {_lit(name)}," for name in removed]
    lines.append(f"{inner}),")
    lines.append(f"{indent})")
    return lines


def _nested_diff_lines(
    base_ident: str, base: Mapping[str, Mapping[str, Key]], target: Mapping[str, Mapping[str, Key]]
) -> list[str]:
    """The nested models of an older version: whole models added or removed, sub-keys changed."""
    base_name = f"_NESTED_{base_ident}"
    lines = ["_derive(", f"    {base_name},", "    added={"]
    for model_field, sub_keys in target.items():
        if model_field not in base:
            lines.append(f"        {_lit(model_field)}: {{")
            lines += _table_lines(sub_keys, "            ")
            lines.append("        },")
    lines.append("    },")
    lines.append("    changed={")
    for model_field, sub_keys in target.items():
        if model_field in base and [(n, k.render()) for n, k in sub_keys.items()] != [
            (n, k.render()) for n, k in base[model_field].items()
        ]:
            diff = _diff_lines(f"{base_name}[{_lit(model_field)}]", base[model_field], sub_keys, "        ")
            lines.append(f"        {_lit(model_field)}: {diff[0]}")
            lines += [*diff[1:-1], diff[-1] + ","]
    lines.append("    },")
    lines.append("    removed=(")
    lines += [f"        {_lit(model_field)}," for model_field in base if model_field not in target]
    lines.append("    ),")
    lines.append(")")
    return lines


def render(sources: Sequence[Source]) -> str:
    """The text of ``config_keys.py``: the newest version in full, the others as differences."""
    sources = sorted(sources, key=lambda s: _version_key(s.version), reverse=True)
    lines = [
        '"""MaxText config keys of ``train_rl`` and the kind of value each takes, per pinned MaxText version.',
        "",
        "GENERATED by ``python tools/generate_config_keys.py`` from MaxText's src/maxtext/configs/types.py",
        "and pyconfig.py; do not edit (tests/maxtext/test_config_keys.py says when it is stale). The",
        "newest version's table is written in full, each older one as its difference from it.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from collections.abc import Mapping",
        "from types import MappingProxyType",
        "from typing import Any, Final, NamedTuple, TypeVar",
        "",
        "",
        "class ConfigKey(NamedTuple):",
        '    """What a key takes: ``kind`` is bool, int, float, str, list, dict, model or any."""',
        "",
        "    kind: str",
        "    nullable: bool = False",
        "    choices: tuple[Any, ...] = ()",
        "    ge: float | None = None",
        "    gt: float | None = None",
        "    le: float | None = None",
        "    lt: float | None = None",
        "",
        "",
        "class KeySource(NamedTuple):",
        '    """Where a version\'s table comes from: the ref, its commit and the sha256 of each input."""',
        "",
        "    repository: str",
        "    ref: str",
        "    commit: str",
        "    config_class: str",
        "    files: tuple[tuple[str, str], ...]",
        "",
        "",
        '_V = TypeVar("_V")',
        "",
        "",
        "def _derive(",
        "    base: Mapping[str, _V], *, added: Mapping[str, _V], changed: Mapping[str, _V], removed: tuple[str, ...]",
        ") -> dict[str, _V]:",
        '    """``base`` without ``removed``, with ``changed`` in place and ``added`` at the end."""',
        "    unknown = [name for name in (*changed, *removed) if name not in base]",
        "    present = [name for name in added if name in base]",
        "    if unknown or present:",
        '        raise ValueError(f"inconsistent key difference: unknown {unknown}, already present {present}")',
        "    derived = {name: changed.get(name, value) for name, value in base.items() if name not in removed}",
        "    derived.update(added)",
        "    return derived",
        "",
        "",
        "K = ConfigKey",
        "",
        "# fmt: off",
    ]
    tables = {s.version: key_table(s) for s in sources}
    lines.append("SOURCES: Final[MappingProxyType[str, KeySource]] = MappingProxyType(")
    lines.append("    {")
    for s in sources:
        files = ((TYPES_PATH, s.sha256(s.types_py)), (PYCONFIG_PATH, s.sha256(s.pyconfig_py)))
        lines.append(f"        {_lit(s.version)}: KeySource(")
        lines.append(f"            {_lit(REPOSITORY)},")
        lines.append(f"            {_lit(s.ref)},")
        lines.append(f"            {_lit(s.commit)},")
        lines.append(f"            {_lit(tables[s.version].config_class)},")
        lines.append("            (")
        lines += [f"                ({_lit(path)}, {_lit(digest)})," for path, digest in files]
        lines.append("            ),")
        lines.append("        ),")
    lines += ["    }", ")", ""]
    newest, *older = sources
    base = tables[newest.version]
    base_ident = _ident(newest.version)
    lines.append(f"# MaxText {newest.version}, in full.")
    lines.append(f"_KEYS_{base_ident}: Final[dict[str, ConfigKey]] = {{")
    lines += _table_lines(base.keys, "    ")
    lines.append("}")
    lines.append(f"_NESTED_{base_ident}: Final[dict[str, dict[str, ConfigKey]]] = {{")
    for model_field, sub_keys in base.nested.items():
        lines.append(f"    {_lit(model_field)}: {{")
        lines += _table_lines(sub_keys, "        ")
        lines.append("    },")
    lines.append("}")
    lines.append("")
    for s in older:
        table = tables[s.version]
        ident = _ident(s.version)
        lines.append(f"# MaxText {s.version}: what differs from {newest.version}.")
        diff = _diff_lines(f"_KEYS_{base_ident}", base.keys, table.keys, "")
        lines.append(f"_KEYS_{ident}: Final[dict[str, ConfigKey]] = {diff[0]}")
        lines += diff[1:]
        nested = _nested_diff_lines(base_ident, base.nested, table.nested)
        lines.append(f"_NESTED_{ident}: Final[dict[str, dict[str, ConfigKey]]] = {nested[0]}")
        lines += nested[1:]
        lines.append("")
    lines.append("# Flat keys (``key=value``) of each version.")
    lines.append("KEYS: Final[MappingProxyType[str, dict[str, ConfigKey]]] = MappingProxyType(")
    lines.append("    {" + ", ".join(f"{_lit(s.version)}: _KEYS_{_ident(s.version)}" for s in sources) + "}")
    lines.append(")")
    lines.append("# Sub-keys of the nested models (``rl.num_generations=4``) of each version.")
    lines.append("NESTED: Final[MappingProxyType[str, dict[str, dict[str, ConfigKey]]]] = MappingProxyType(")
    lines.append(
        "    {" + ", ".join(f"{_lit(s.version)}: _NESTED_{_ident(s.version)}" for s in sources) + "}"
    )
    lines.append(")")
    return "\n".join(lines) + "\n"


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", git_dir, *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=_GIT_TIMEOUT,
    ).stdout


def load_source(version: str, location: str, commit: str | None = None) -> Source:
    """``location`` is ``GIT_DIR@REF`` or a checkout folder (then ``commit`` names its commit)."""
    if "@" in location:
        git_dir, ref = location.rsplit("@", 1)
        sha = _git(git_dir, "rev-parse", f"{ref}^{{commit}}").strip()
        return Source(
            version,
            ref,
            sha,
            _git(git_dir, "show", f"{sha}:{TYPES_PATH}"),
            _git(git_dir, "show", f"{sha}:{PYCONFIG_PATH}"),
        )
    if not commit:
        raise SystemExit(f"--commit {version}=SHA is needed for the folder {location}")
    from pathlib import Path

    root = Path(location)
    return Source(
        version,
        f"maxtext-v{version}",
        commit,
        (root / TYPES_PATH).read_text(),
        (root / PYCONFIG_PATH).read_text(),
    )


def _pairs(values: Sequence[str], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise SystemExit(f"{option} takes VERSION=VALUE, got {value!r}")
        out[name] = rest
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", action="append", required=True, help="VERSION=GIT_DIR@REF or VERSION=DIR")
    parser.add_argument("--commit", action="append", default=[], help="VERSION=SHA for a DIR source")
    args = parser.parse_args(argv)
    commits: Mapping[str, str] = _pairs(args.commit, "--commit")
    sources = [load_source(v, loc, commits.get(v)) for v, loc in _pairs(args.source, "--source").items()]
    sys.stdout.write(render(sources))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
