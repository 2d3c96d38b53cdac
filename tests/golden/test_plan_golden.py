"""``tpu-rl plan`` of both pipelines for a set of confs, byte for byte against the files in
``tests/golden/plans/``: a refactor that changes no behaviour changes no plan.

A change that means to change a plan regenerates them: ``TPU_RL_UPDATE_GOLDEN=1 pytest
tests/golden/test_plan_golden.py``, and the diff of the JSON files shows what changed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.cli import build_plan
from airflow_provider_tpu_rl.render import plan as plan_module
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, TPU_VM_DAG_ID

PLANS = Path(__file__).parent / "plans"
NOW = 1_800_000_000.0  # the TPU VM's expiry label counts from the plan's clock
CONFS: dict[str, tuple[str, dict[str, Any]]] = {
    "gke-default": (GKE_DAG_ID, {}),
    "gke-spot": (GKE_DAG_ID, {"capacity": "spot"}),
    "gke-flex-start": (GKE_DAG_ID, {"capacity": "flex-start"}),
    "gke-reservation": (GKE_DAG_ID, {"capacity": "reservation", "reservation": "v6e-32-res"}),
    "gke-gemma-overrides": (
        GKE_DAG_ID,
        {
            "model": "gemma4-26b",
            "run_name": "gemma-r1",
            "num_batches": 20,
            "train_overrides": {"learning_rate": 1e-6, "num_test_batches": 0},
            "keep_cluster": True,
        },
    ),
    "tpu_vm-default": (TPU_VM_DAG_ID, {}),
    "tpu_vm-spot": (TPU_VM_DAG_ID, {"capacity": "spot"}),
    "tpu_vm-flex-start": (TPU_VM_DAG_ID, {"capacity": "flex-start", "max_vm_hours": 6}),
    "tpu_vm-reservation": (TPU_VM_DAG_ID, {"capacity": "reservation", "reservation": "v6e-8-res"}),
    "tpu_vm-install-overrides": (
        TPU_VM_DAG_ID,
        {
            "runtime": "install",
            "run_name": "llama-r1",
            "num_batches": 30,
            "train_overrides": {"learning_rate": 3e-6, "rl.num_generations": 2},
            "service_account": "tpu-vm@my-proj.iam.gserviceaccount.com",
        },
    ),
}


@pytest.fixture(autouse=True)
def _fixed_clock_and_no_form_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module.time, "time", lambda: NOW)
    for name in [n for n in os.environ if n.startswith("AIRFLOW__TPU_RL__")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize("name", sorted(CONFS))
def test_the_plan_is_the_golden_one(name: str) -> None:
    dag_id, conf = CONFS[name]
    text = json.dumps(build_plan(dag_id, conf, run_id="manual__golden"), indent=1, sort_keys=True) + "\n"
    golden = PLANS / f"{name}.json"
    if os.environ.get("TPU_RL_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"no golden plan {golden}: run with TPU_RL_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), f"the plan of {name} changed: diff it against {golden}"
