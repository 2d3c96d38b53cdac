"""docs/module-map.md's rule for ``tests/``: every product module has a test file named after it
(``airflow_provider_tpu_rl/<package>/<module>.py`` → ``tests/<package>/test_<module>.py``, a
top-level module → ``tests/test_<module>.py``), or the map's ``tests/`` section names the module
(``<package>/<module>.py``) with the reason it has none."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "airflow_provider_tpu_rl"


def expected_test_file(module: Path) -> Path:
    """The test file a product module's tests are found in."""
    relative = module.relative_to(PACKAGE)
    return REPO / "tests" / relative.parent / f"test_{relative.name}"


def modules_without_test_file() -> list[str]:
    return sorted(
        str(module.relative_to(PACKAGE))
        for module in PACKAGE.rglob("*.py")
        if module.name != "__init__.py" and not expected_test_file(module).is_file()
    )


def map_tests_section() -> str:
    text = (REPO / "docs" / "module-map.md").read_text()
    start = text.index("## `tests/`")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_the_rule_names_each_modules_test_file() -> None:
    assert expected_test_file(PACKAGE / "records" / "run_dirs.py") == REPO / "tests/records/test_run_dirs.py"
    assert expected_test_file(PACKAGE / "cli.py") == REPO / "tests/test_cli.py"


def test_every_product_module_has_a_test_file_named_after_it_or_the_map_says_why_not() -> None:
    section = map_tests_section()
    unexplained = [module for module in modules_without_test_file() if f"`{module}`" not in section]
    assert unexplained == [], (
        f"{unexplained} have no tests/<package>/test_<module>.py: add one, or name the module in "
        "docs/module-map.md's tests/ section with the reason"
    )
