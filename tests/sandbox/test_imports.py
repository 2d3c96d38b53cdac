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


def test_a_fake_tool_starts_without_the_modules_only_some_commands_use() -> None:
    """Each fake ``gcloud``/``gcluster`` call is a new interpreter: the suite makes thousands."""
    import subprocess
    import sys

    probe = (
        "import sys, tpu_rl_sandbox.fake_gcloud, tpu_rl_sandbox.fake_gcluster; "
        "print(' '.join(sorted(sys.modules)))"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    heavy = {
        "yaml",  # YAML output, blueprints, kubeconfig
        "urllib.request",  # the emulator's HTTP client: commands that touch a bucket
        "http.server",
        "cryptography",  # the API server's TLS and token signatures
        "tpu_rl_sandbox.hosts",  # the simulated VM and pods
        "tpu_rl_sandbox.maxtext_sim",
        "tpu_rl_sandbox.kube_server",
    }
    assert sorted(heavy & loaded) == []
