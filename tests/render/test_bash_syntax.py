"""Every shell script the renderer can produce parses with the real ``bash -n``.

The scripts are taken from ``tpu-rl plan`` (``cli.build_plan``) for every preset on each pipeline
that accepts it: the ``--command=`` of each ``gcluster job submit`` and, for the TPU VM stages,
the ssh ``--command`` and the script sent on its stdin.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from airflow_provider_tpu_rl.cli import build_plan
from airflow_provider_tpu_rl.spec import SpecError
from airflow_provider_tpu_rl.spec.pipeline import GKE_DAG_ID, TPU_VM_DAG_ID
from airflow_provider_tpu_rl.spec.presets import PRESETS

CONF_VARIANTS: tuple[dict[str, Any], ...] = (
    {},
    {"hf_model_path": "Org/Model-Name_v2", "run_name": "run.2", "num_batches": 3},
    # the TPU VM's other runtime (the default is container); GKE refuses the key and skips it
    {"runtime": "install"},
)


def _scripts(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """``(where, script)`` of every shell string in a plan."""
    found: list[tuple[str, str]] = []
    for step in plan["steps"]:
        argv: list[str] = step["argv"]
        where = f"{plan['dag_id']}:{step['task_id']}"
        if argv[:3] == ["gcluster", "job", "submit"] or argv[:3] == ["gcloud", "compute", "ssh"]:
            commands = [a.split("=", 1)[1] for a in argv if a.startswith("--command=")]
            assert len(commands) == 1, f"{where}: expected one --command=, got {argv}"
            found.append((f"{where} --command", commands[0]))
        if argv[:3] == ["gcloud", "compute", "ssh"]:
            found.append((f"{where} stdin", step["stdin"]))
    return found


def _all_scripts() -> list[tuple[str, str]]:
    scripts: list[tuple[str, str]] = []
    for dag_id in (GKE_DAG_ID, TPU_VM_DAG_ID):
        for model in PRESETS:
            for index, variant in enumerate(CONF_VARIANTS):
                try:
                    plan = build_plan(dag_id, {"model": model, **variant})
                except SpecError:
                    continue  # the preset runs on the other pipeline (or the variant does not apply)
                scripts += [(f"{model}#{index} {where}", text) for where, text in _scripts(plan)]
    return scripts


SCRIPTS = _all_scripts()


def bash_n(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-n"], input=script, capture_output=True, text=True, timeout=30, check=False
    )


def test_every_preset_and_stage_is_covered() -> None:
    where = {w.split(" ", 1)[1] for w, _ in SCRIPTS}
    for task in ("convert_to_maxtext", "train", "export_to_huggingface"):
        assert f"{GKE_DAG_ID}:{task} --command" in where
    for task in ("install_maxtext", "convert_to_maxtext", "train", "export_to_huggingface"):
        assert f"{TPU_VM_DAG_ID}:{task} stdin" in where
    models = {w.split("#", 1)[0] for w, _ in SCRIPTS}
    assert models == set(PRESETS)


def test_bash_n_rejects_a_broken_script() -> None:
    assert bash_n("echo 'unterminated").returncode == 2
    assert bash_n("if true; then echo x").returncode == 2


@pytest.mark.parametrize(("where", "script"), SCRIPTS, ids=[w for w, _ in SCRIPTS])
def test_rendered_script_passes_bash_n(where: str, script: str) -> None:
    result = bash_n(script)
    assert result.returncode == 0, f"{where}: bash -n says:\n{result.stderr}\n--- script ---\n{script}"
