"""What the Airflow 2.11 and lowest-provider legs leave out really behaves the same there.

``make test`` runs the folders of the Makefile's ``AIRFLOW_FREE_TESTS`` on Airflow 3.3 only: another
Airflow line or provider version runs the same code there. For the pure core's folders that holds
because neither the tests nor the modules they test import Airflow: importing every test module of
them in a fresh interpreter must leave ``airflow`` out of ``sys.modules``. (``tests/sandbox`` tests
the sandbox's fakes, and ``tests/docker`` the Docker files against the provider's pinned values.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PURE_CORE_TESTS = ("tests/spec", "tests/render", "tests/golden", "tests/maxtext", "tests/sql")

PROBE = """
import importlib, json, pathlib, sys
sys.path.insert(0, ".")
first = None
for folder in json.loads(sys.argv[1]):
    for path in sorted(pathlib.Path(folder).rglob("*.py")):
        importlib.import_module(".".join(path.with_suffix("").parts))
        if first is None and "airflow" in sys.modules:
            first = str(path)
print(json.dumps(first))
"""


def airflow_free_folders() -> list[str]:
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(r"^AIRFLOW_FREE_TESTS := (.*)$", makefile, re.MULTILINE)
    assert match is not None, "the Makefile names no AIRFLOW_FREE_TESTS"
    return match.group(1).split()


def test_the_makefile_leaves_out_only_the_known_folders() -> None:
    folders = airflow_free_folders()
    assert set(PURE_CORE_TESTS) <= set(folders)
    assert set(folders) <= {*PURE_CORE_TESTS, "tests/sandbox", "tests/docker"}
    assert all((ROOT / folder).is_dir() for folder in folders)


def test_the_pure_core_tests_import_no_airflow() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(PURE_CORE_TESTS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) is None, (
        f"{done.stdout.strip()} imports Airflow: move it out of the Makefile's AIRFLOW_FREE_TESTS "
        "or its import of Airflow out of the pure core"
    )


# ------------------------------------------------------------------------ the lowest providers' leg
PROVIDER_IMPORT = re.compile(r"\bairflow\.providers\.(?!common\.compat\b)\w+")


def makefile_tests(variable: str) -> list[Path]:
    """The test files a Makefile variable names (its folders expanded)."""
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(rf"^{variable} := (.*)$", makefile, re.MULTILINE)
    assert match is not None, f"the Makefile names no {variable}"
    files: list[Path] = []
    for name in match.group(1).split():
        path = ROOT / name
        assert path.exists(), f"{variable} names {name}, which does not exist"
        files += sorted(path.rglob("test_*.py")) if path.is_dir() else [path]
    return files


def lowest_leg_tests() -> list[Path]:
    """The test files ``make test-lowest`` runs."""
    return makefile_tests("LOWEST_TESTS")


def test_the_lowest_leg_tests_every_module_that_calls_a_provider_itself() -> None:
    """A product module that imports a provider (other than common.compat) is imported by a test of
    the lowest leg: the other operator tests reach the providers only through those modules."""
    package = ROOT / "airflow_provider_tpu_rl"
    calling = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in package.rglob("*.py")
        if PROVIDER_IMPORT.search(path.read_text())
    }
    assert "airflow_provider_tpu_rl.triggers.jobset" in calling
    imported = " ".join(path.read_text() for path in lowest_leg_tests())
    untested = sorted(module for module in calling if not re.search(rf"\b{re.escape(module)}\b", imported))
    assert untested == [], f"add a test of {untested} to the Makefile's LOWEST_TESTS"


# --------------------------------------------------------------------------- the Airflow 2.11 leg
VERSION_BRANCH = re.compile(r"\bAIRFLOW_V_\d|\bairflow_version\b|\bFORM_OPEN_SECTION\b|\bFORM_NULL_CHOICE\b")


def airflow_211_leg_tests() -> list[Path]:
    """The test files ``make test-airflow-2.11`` runs: all but the Airflow-free and same-everywhere ones."""
    left_out = {*makefile_tests("SAME_ON_EVERY_AIRFLOW")}
    for folder in airflow_free_folders():
        left_out |= set((ROOT / folder).rglob("test_*.py"))
    return [path for path in sorted((ROOT / "tests").rglob("test_*.py")) if path not in left_out]


def test_no_test_left_out_of_the_2_11_leg_branches_on_the_airflow_version() -> None:
    same = makefile_tests("SAME_ON_EVERY_AIRFLOW")
    assert same, "SAME_ON_EVERY_AIRFLOW is empty"
    branching = [str(path.relative_to(ROOT)) for path in same if VERSION_BRANCH.search(path.read_text())]
    assert branching == [], f"{branching} check something per Airflow version: run them on 2.11"


def test_the_2_11_leg_tests_every_module_that_branches_on_the_airflow_version() -> None:
    """A product module with an Airflow-version branch (or a provider import) is imported by a
    test that runs on Airflow 2.11, besides the end-to-end runs."""
    package = ROOT / "airflow_provider_tpu_rl"
    branching = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in package.rglob("*.py")
        if VERSION_BRANCH.search(path.read_text()) or PROVIDER_IMPORT.search(path.read_text())
    }
    assert {"airflow_provider_tpu_rl.compat", "airflow_provider_tpu_rl.records.janitor_sources"} <= branching
    imported = " ".join(
        path.read_text() for path in airflow_211_leg_tests() if "tests/e2e/" not in path.as_posix()
    )
    untested = sorted(module for module in branching if not re.search(rf"\b{re.escape(module)}\b", imported))
    assert untested == [], (
        f"{untested} are tested on Airflow 3.3 only: take their tests out of SAME_ON_EVERY_AIRFLOW"
    )
