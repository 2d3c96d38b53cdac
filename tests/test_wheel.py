"""The provider wheel ships the product only: no fake, simulator, demo, benchmark or developer tool."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_PRODUCT = re.compile(r"sandbox|fake|bashsim|simulat|maxtext_sim|bench|demo|emulator", re.IGNORECASE)


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(build), "TMPDIR": str(build)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = out.glob("airflow_provider_tpu_rl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_wheel_holds_the_provider_package_only(wheel_files: list[str]) -> None:
    packages = {name.split("/")[0] for name in wheel_files if not name.split("/")[0].endswith(".dist-info")}
    assert packages == {"airflow_provider_tpu_rl"}
    assert "airflow_provider_tpu_rl/operators/gke_jobs.py" in wheel_files
    assert "airflow_provider_tpu_rl/ledger/sql/migrations/0001_schema_migrations.sql" in wheel_files


def test_no_test_double_is_in_the_wheel(wheel_files: list[str]) -> None:
    assert [name for name in wheel_files if NOT_PRODUCT.search(name)] == []


def test_no_developer_tool_is_in_the_wheel(wheel_files: list[str]) -> None:
    """tools/ (the config-key generator, ...) stays in the repository."""
    tools = sorted(path.stem for path in (ROOT / "tools").glob("*.py") if path.stem != "__init__")
    assert "generate_config_keys" in tools
    assert [name for name in wheel_files for tool in tools if Path(name).stem == tool] == []
    assert not any(name.startswith("tools/") for name in wheel_files)


def test_no_product_module_knows_the_sandbox() -> None:
    mentions = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "airflow_provider_tpu_rl").rglob("*.py")
        if re.search(r"tpu_rl_sandbox|TPU_RL_SANDBOX", path.read_text())
    ]
    assert mentions == []
