"""No test, fixture README or docs page names a file, folder or module of this repository that is
not there.

What is checked (everything else is prose, or another project's path):

- a path whose first folder is a top-level folder of this repository (``tests/support/harness.py``,
  ``docker/compose.yaml``, ``sql/``) must exist from the repository root;
- a ``folder/name`` path with exactly one folder that is a sub-package of the provider or the
  sandbox, or a folder of ``tests/`` (``triggers/jobset.py``, ``toolchain/tools.py``,
  ``support/harness.py``), must exist in one of them. Deeper paths under such a name are another
  project's tree (MaxText's ``maxtext/trainers/post_train/rl/utils_rl.py``), as is any path whose
  first folder is not one of ours (Cluster Toolkit's ``cmd/job/prereq.go``, MaxText's
  ``checkpoint_conversion/to_maxtext.py``);
- a dotted ``airflow_provider_tpu_rl.…`` / ``tpu_rl_sandbox.…`` name must be a module, or a name
  that module's source mentions;
- "xfail in PATH" must name a file that still holds an xfail;
- in Markdown, a relative link must point at a file that exists, and its ``#anchor`` at one of
  that page's headings.

A line that checks a module is absent (``find_spec(...)``, or marked ``refs: absent``) is not
checked. A component written as a placeholder (``NAME``, ``RUN_NAME``, ``vX.Y.Z``) is not a path, and a
dunder (``tpu_rl_sandbox.__file__``) is every module's. Scanned: ``tests/**/*.py`` (but the copied
sources in ``tests/fixtures/`` and this file, whose samples are broken on purpose),
``tests/**/README.md``, ``docs/**/*.md``, ``docs/**/*.py`` and ``README.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "airflow_provider_tpu_rl"
SANDBOX = REPO / "sandbox" / "tpu_rl_sandbox"
TESTS = REPO / "tests"
NOT_OURS = {".venv", ".git", "__pycache__", "node_modules"}

# A path: folder/…/name, optionally ending in "/" (a folder); not inside a URL or another word.
PATH = re.compile(r"(?<![\w./:@~$-])((?:[A-Za-z_][\w.-]*/)+(?:[\w-][\w.-]*)?)(?![\w/*{<$-])")
DOTTED = re.compile(r"(?<![\w.])((?:airflow_provider_tpu_rl|tpu_rl_sandbox)(?:\.\w+)+)")
XFAIL_IN = re.compile(r"xfail in `?((?:[\w.-]+/)+[\w.-]+\.py)")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_-]*$|[A-Z]\.[A-Z]")
ABSENT = re.compile(r"find_spec\(|refs: absent")
MD_LINK = re.compile(r"\]\((?!https?:|mailto:)([^)\s#]*)(?:#([^)\s]*))?\)")


def _folders(root: Path) -> set[str]:
    return {
        p.name
        for p in root.iterdir()
        if p.is_dir() and p.name not in NOT_OURS and not p.name.endswith(".egg-info")
    }


TOP_LEVEL = _folders(REPO)
# one-folder paths are looked up in these, e.g. triggers/jobset.py, support/harness.py
NESTED_BASES = (PACKAGE, SANDBOX, TESTS)
NESTED = set().union(*(_folders(base) for base in NESTED_BASES)) - {"__pycache__"}


def scanned_files() -> list[Path]:
    files = [REPO / "README.md"]
    files += [p for p in TESTS.rglob("*.py") if "fixtures" not in p.relative_to(TESTS).parts]
    files += TESTS.rglob("README.md")
    files += (REPO / "docs").rglob("*.md")
    files += (REPO / "docs").rglob("*.py")
    return sorted(set(files) - {Path(__file__).resolve()})


def _resolves(reference: str) -> bool | None:
    """True/False whether a path of ours exists; None when it is not a path of this repository."""
    parts = reference.rstrip("/").split("/")
    if any(PLACEHOLDER.search(part) for part in parts):
        return None
    if parts[0] in TOP_LEVEL:
        return (REPO / reference).exists()
    if len(parts) == 2 and parts[0] in NESTED:
        return any((base / reference).exists() for base in NESTED_BASES)
    return None


@cache
def _module_source(dotted: str) -> str | None:
    """Source of the module (or package ``__init__``) a dotted name is, or None."""
    top, *rest = dotted.split(".")
    root = PACKAGE if top == "airflow_provider_tpu_rl" else SANDBOX
    path = root.joinpath(*rest)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if rest and candidate.is_file():
            return candidate.read_text()
    if not rest:
        return (root / "__init__.py").read_text()
    return None


def _dotted_resolves(dotted: str) -> bool:
    """A module, or a module and names its source mentions (a class, a function, an attribute)."""
    parts = dotted.split(".")
    while parts[-1].startswith("__") and parts[-1].endswith("__"):
        parts.pop()
    for cut in range(len(parts), 0, -1):
        source = _module_source(".".join(parts[:cut]))
        if source is not None:
            return cut == len(parts) or re.search(rf"\b{re.escape(parts[cut])}\b", source) is not None
    return False


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", page.read_text(), re.MULTILINE)
    return {github_anchor(h) for h in headings}


def broken_references(path: Path) -> Iterator[str]:
    """``"line N: what"`` for each reference of ``path`` that does not resolve."""
    text = path.read_text()
    for number, line in enumerate(text.splitlines(), 1):
        if ABSENT.search(line):
            continue
        for match in PATH.finditer(line):
            reference = match.group(1).rstrip(".")
            if _resolves(reference) is False:
                yield f"line {number}: {reference} does not exist"
        for match in DOTTED.finditer(line):
            if not _dotted_resolves(match.group(1)):
                yield f"line {number}: {match.group(1)} is no module (or name of one) of this repository"
        for match in XFAIL_IN.finditer(line):
            target = match.group(1)
            found = [base / target for base in (REPO, *NESTED_BASES) if (base / target).is_file()]
            if not any("xfail" in f.read_text() for f in found):
                yield f"line {number}: {target} holds no xfail"
        if path.suffix == ".md":
            for match in MD_LINK.finditer(line):
                target, anchor = match.group(1), match.group(2)
                page = (path.parent / target).resolve() if target else path
                if not page.exists():
                    yield f"line {number}: link {target} does not exist"
                elif anchor and page.suffix == ".md" and anchor not in _anchors(page):
                    yield f"line {number}: link {target}#{anchor}: no such heading"


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_reference_resolves(path: Path) -> None:
    assert list(broken_references(path)) == []


# ------------------------------------------------------------------------------ the rule itself
def _broken(tmp_path: Path, text: str, suffix: str = ".py") -> list[str]:
    sample = tmp_path / f"sample{suffix}"
    sample.write_text(text)
    return list(broken_references(sample))


def test_a_deleted_module_or_test_is_flagged(tmp_path: Path) -> None:
    text = (
        "a known limit of triggers/gcluster_job.py, pinned in tests/triggers/test_gcluster_job.py\n"
        "see airflow_provider_tpu_rl.triggers.gcluster_job and airflow_provider_tpu_rl.timeouts.no_such_name\n"
    )
    assert _broken(tmp_path, text) == [
        "line 1: triggers/gcluster_job.py does not exist",
        "line 1: tests/triggers/test_gcluster_job.py does not exist",
        "line 2: airflow_provider_tpu_rl.triggers.gcluster_job is no module (or name of one) of this repository",
        "line 2: airflow_provider_tpu_rl.timeouts.no_such_name is no module (or name of one) of this repository",
    ]


def test_an_xfail_that_is_gone_is_flagged(tmp_path: Path) -> None:
    holder = TESTS / "docs" / "conftest.py"  # holds no xfail
    text = f"pinned by a strict xfail in {holder.relative_to(REPO)}; not what this is about\n"
    assert _broken(tmp_path, text) == [f"line 1: {holder.relative_to(REPO)} holds no xfail"]


def test_existing_and_external_paths_pass(tmp_path: Path) -> None:
    text = (
        "tests/support/harness.py, triggers/jobset.py, toolchain/tools.py, support/harness.py, docker/, sql/\n"
        "airflow_provider_tpu_rl.exceptions, airflow_provider_tpu_rl.timeouts.job_timeout, tpu_rl_sandbox.commands.lifecycle\n"
        "Cluster Toolkit's cmd/job/prereq.go, MaxText's checkpoint_conversion/to_maxtext.py and\n"
        "maxtext/trainers/post_train/rl/utils_rl.py, gs://BUCKET/tpu-rl/leases/CLUSTER.json\n"
    )
    assert _broken(tmp_path, text) == []


def test_a_check_that_a_module_is_gone_is_not_flagged(tmp_path: Path) -> None:
    text = 'assert importlib.util.find_spec("tpu_rl_sandbox.maxtext_keys") is None\n'
    assert _broken(tmp_path, text) == []


def test_markdown_links_and_anchors_are_checked(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Timeouts: every wait is bounded\n")
    text = (
        "[ok](other.md#timeouts-every-wait-is-bounded) [web](https://example.com/x.md)\n"
        "[gone](missing.md) [bad anchor](other.md#timeouts)\n"
    )
    assert _broken(tmp_path, text, ".md") == [
        "line 2: link missing.md does not exist",
        "line 2: link other.md#timeouts: no such heading",
    ]
