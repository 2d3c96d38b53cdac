"""docker/workload_patches.py (run at image build time) makes the same edits as the train command's
start-up patches, on the lines of the pinned sources, and fails when a patch no longer applies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.render.gke import ADAFACTOR_PATCH, TUNIX_RESHARD_PATCH
from tests.docker.dockerfile import DOCKER
from tpu_rl_sandbox.machines import pod_image

SCRIPT = DOCKER / "workload_patches.py"


def _site(tmp_path: Path, name: str) -> tuple[Path, Path, Path]:
    """A site folder with the tunix stub package, and a MaxText utils_rl.py stub."""
    site = tmp_path / name
    sampler = site / "tunix" / "generate" / "vllm_sampler.py"
    sampler.parent.mkdir(parents=True)
    (site / "tunix" / "__init__.py").write_text("")
    (site / "tunix" / "generate" / "__init__.py").write_text("")
    sampler.write_text(pod_image.VLLM_SAMPLER)
    utils_rl = tmp_path / f"{name}-utils_rl.py"
    utils_rl.write_text(pod_image.UTILS_RL)
    return site, sampler, utils_rl


def _python(argv: list[str], pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def _build_time(site: Path, utils_rl: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return _python([str(SCRIPT), "--utils-rl-file", str(utils_rl), *extra], pythonpath=site)


def test_build_time_patches_equal_the_start_up_patches(tmp_path: Path) -> None:
    run_site, run_sampler, run_utils = _site(tmp_path, "runtime")
    # The train command's own code, run for real: tunix found by import, utils_rl.py at its path.
    tunix = _python(["-c", TUNIX_RESHARD_PATCH], pythonpath=run_site)
    assert tunix.returncode == 0, tunix.stderr
    assert pod_image.UTILS_RL_PATH in ADAFACTOR_PATCH
    adafactor = _python(["-c", ADAFACTOR_PATCH.replace(pod_image.UTILS_RL_PATH, str(run_utils))])
    assert adafactor.returncode == 0, adafactor.stderr

    build_site, build_sampler, build_utils = _site(tmp_path, "build")
    result = _build_time(build_site, build_utils)
    assert result.returncode == 0, result.stderr
    assert f"patched {build_sampler} (tunix)" in result.stdout

    assert build_sampler.read_text() == run_sampler.read_text() != pod_image.VLLM_SAMPLER
    assert build_utils.read_text() == run_utils.read_text() != pod_image.UTILS_RL
    assert "reshard_chunk_size=4," in build_sampler.read_text()
    assert "optax.adafactor(learning_rate=learning_rate)" in build_utils.read_text()


def test_a_second_run_fails_because_nothing_matches(tmp_path: Path) -> None:
    site, _, utils_rl = _site(tmp_path, "twice")
    assert _build_time(site, utils_rl).returncode == 0
    again = _build_time(site, utils_rl)
    assert again.returncode == 1
    assert "found 0 times, expected exactly once" in again.stderr


@pytest.mark.parametrize(
    ("stub", "edit", "message"),
    [
        ("tunix", lambda t: t + "\n# reshard_chunk_size: Optional[int] = None\n", "found 2 times"),
        (
            "tunix",
            lambda t: t.replace("reshard_chunk_size=self.config", "chunk=self.config"),
            "found 0 times",
        ),
        ("utils_rl", lambda t: t.replace("optax.adamw(", "optax.sgd("), "matched 0 times"),
        ("utils_rl", lambda t: t + "\nx = optax.adamw(lr)\n", "matched 2 times"),
    ],
)
def test_build_fails_when_a_pattern_is_not_found_exactly_once(
    tmp_path: Path, stub: str, edit: object, message: str
) -> None:
    site, sampler, utils_rl = _site(tmp_path, "moved")
    target = sampler if stub == "tunix" else utils_rl
    target.write_text(edit(target.read_text()))  # type: ignore[operator]
    before = target.read_text()
    result = _build_time(site, utils_rl)
    assert result.returncode == 1
    assert message in result.stderr
    assert target.read_text() == before


def test_build_fails_without_tunix(tmp_path: Path) -> None:
    utils_rl = tmp_path / "utils_rl.py"
    utils_rl.write_text(pod_image.UTILS_RL)
    result = _python(["-I", str(SCRIPT), "--utils-rl-file", str(utils_rl)])
    assert result.returncode == 1
    assert "google-tunix is not installed" in result.stderr
