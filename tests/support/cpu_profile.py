"""Where a leg's CPU goes: the CPU-seconds of each test file, printed at the end of the session.

Each test's setup, call and teardown are timed with ``getrusage``: the process's own CPU and that of
every child it waited for (an ``airflow dags test``, a services stack's processes, a real gcloud),
the same measure as the Makefile's leg totals. A file's share is the sum over its tests; a fixture
shared by a folder (the services stack) counts where it starts and stops. Under pytest-xdist each
worker sends its files' figures and its own total to the controller, which prints the costliest
files, and what the workers spent outside any test (start-up, collection).
"""

from __future__ import annotations

import resource
from collections import defaultdict
from collections.abc import Generator
from typing import Any

import pytest

SHOWN = 10  # the costliest files printed
_WORKER_KEY = "tpu_rl_cpu_by_file"
_by_file: dict[str, float] = defaultdict(float)
_outside: list[float] = []


def cpu_seconds() -> float:
    """User + system CPU of this process and of every child it has waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


# Where the session-scoped fixtures' teardown goes (it runs in the teardown of a worker's last test:
# the sandbox, the GCS emulator, the Airflow CLI server the end-to-end runs share).
SESSION_TEARDOWN = "(session fixtures' teardown)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, None]:
    start = cpu_seconds()
    yield
    _by_file[item.nodeid.split("::", 1)[0]] += cpu_seconds() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, None]:
    """A worker's last teardown ends the session's fixtures: that share is set apart from the file."""
    start = cpu_seconds()
    yield
    if nextitem is None:
        spent = cpu_seconds() - start
        _by_file[item.nodeid.split("::", 1)[0]] -= spent
        _by_file[SESSION_TEARDOWN] += spent


def pytest_sessionfinish(session: pytest.Session) -> None:
    total = cpu_seconds()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller prints
        workeroutput[_WORKER_KEY] = {"files": dict(_by_file), "total": total}
    elif _by_file and not _outside:  # no xdist (the controller has each worker's figures already)
        _outside.append(total - sum(_by_file.values()))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """The controller keeps each worker's figures (pytest-xdist's hook)."""
    output = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
    if output is None:
        return
    for path, seconds in output["files"].items():
        _by_file[path] += seconds
    _outside.append(output["total"] - sum(output["files"].values()))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _by_file:
        return
    costliest = sorted(_by_file.items(), key=lambda pair: pair[1], reverse=True)[:SHOWN]
    tests_total = sum(_by_file.values())
    terminalreporter.section(
        f"costliest {len(costliest)} test files (CPU-s, with the processes they waited for)"
    )
    for path, seconds in costliest:
        terminalreporter.write_line(f"{seconds:8.1f}  {path}")
    terminalreporter.write_line(
        f"{tests_total:8.1f}  all {len(set(_by_file) - {SESSION_TEARDOWN})} files; {sum(_outside):.1f} more outside any test "
        f"({len(_outside)} process{'es' if len(_outside) != 1 else ''}: start-up, collection)"
    )
