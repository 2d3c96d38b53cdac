"""The sandbox's modules import each other without circles (function-level imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

import tpu_rl_sandbox

PACKAGE = Path(tpu_rl_sandbox.__file__).parent


def _module_name(path: Path) -> str:
    """``clis/gcloud/app.py`` -> ``clis.gcloud.app``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    files = [p for p in PACKAGE.rglob("*.py") if "bundle" not in p.relative_to(PACKAGE).parts]
    modules = {_module_name(p) for p in files} - {""}
    graph: dict[str, set[str]] = {}
    for path in files:
        name = _module_name(path)
        if not name:
            continue
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tpu_rl_sandbox"):
                base = node.module.removeprefix("tpu_rl_sandbox").lstrip(".")
                for alias in node.names:
                    # ``from tpu_rl_sandbox.world import iam``: a module; else a name of ``base``
                    inner = f"{base}.{alias.name}" if base else alias.name
                    deps.add(inner if inner in modules else base)
            elif isinstance(node, ast.Import):
                deps |= {
                    a.name.removeprefix("tpu_rl_sandbox.")
                    for a in node.names
                    if a.name.startswith("tpu_rl_sandbox.")
                }
        graph[name] = deps - {name, ""}
    return graph


def test_no_import_cycles() -> None:
    graph = _graph()
    assert {"world.iam", "clis.gcloud.app", "machines.hosts"} <= set(graph)
    assert "world.store" in graph["world.faults"]  # the graph sees the imports
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
    # the fake cloud's state knows no machine, and the machines know no gcloud command but the
    # in-machine subset
    assert not any(
        dep.startswith("machines.") for name in graph if name.startswith("world.") for dep in graph[name]
    )
    gcloud_app = {name for name in graph if name.startswith("clis.gcloud.")} - {
        "clis.gcloud.in_machine",
        "clis.gcloud.commands",
        "clis.gcloud.parser",
        "clis.gcloud.output",
        "clis.gcloud.storage_ops",
    }
    assert not graph["machines.hosts"] & gcloud_app


def test_a_fake_tool_starts_without_the_modules_only_some_commands_use() -> None:
    """Each fake ``gcloud``/``gcluster`` call is a new interpreter: the suite makes thousands."""
    import subprocess
    import sys

    probe = (
        "import sys, tpu_rl_sandbox.clis.gcloud.app, tpu_rl_sandbox.clis.gcluster.app; "
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
        "tpu_rl_sandbox.machines.hosts",  # the simulated VM and pods
        "tpu_rl_sandbox.machines.maxtext_sim",
        "tpu_rl_sandbox.apis.kube_server",
    }
    assert sorted(heavy & loaded) == []
