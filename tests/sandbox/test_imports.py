"""The sandbox's modules import each other without circles (function-level imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

import tpu_rl_sandbox

PACKAGE = Path(tpu_rl_sandbox.__file__).parent


def _graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name in modules:
        deps: set[str] = set()
        for node in ast.walk(ast.parse((PACKAGE / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tpu_rl_sandbox"):
                if node.module == "tpu_rl_sandbox":
                    deps |= {alias.name for alias in node.names if alias.name in modules}
                else:
                    deps.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[1] for a in node.names if a.name.startswith("tpu_rl_sandbox.")}
        graph[name] = deps - {name}
    return graph


def test_no_import_cycles() -> None:
    graph = _graph()
    assert {"cloud", "fake_gcloud", "hosts"} <= set(graph)
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        for dep in sorted(graph.get(node, ())):
            if dep in path:
                cycles.append([*path[path.index(dep) :], dep])
            elif len(path) < len(graph):
                visit(dep, [*path, dep])

    for start in sorted(graph):
        visit(start, [start])
    assert cycles == []
    assert "hosts" not in graph["cloud"]
    assert "fake_gcloud" not in graph["hosts"]
