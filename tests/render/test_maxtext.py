"""Every MaxText program the plans run on a machine without TPU chips is told so: ``hardware=cpu
skip_jax_distributed_system=true`` (without them pyconfig looks for a JAX cluster and stops:
"ValueError: coordinator_address should be defined."). Where each program runs is read from the
plan itself (the VM an SSH stage goes to and its machine type, a job's ``--compute-type``), not
from the renderer's own table."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from airflow_provider_tpu_rl.cli import build_plan
from airflow_provider_tpu_rl.render import maxtext
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, TPU_VM_DAG_ID

CONFS: list[tuple[str, dict[str, Any]]] = [
    (GKE_DAG_ID, {}),
    (GKE_DAG_ID, {"model": "gemma4-26b", "capacity": "spot", "reservation": None}),
    (GKE_DAG_ID, {"train_overrides": {"learning_rate": 1e-6}}),
    (TPU_VM_DAG_ID, {"runtime": "container"}),
    (TPU_VM_DAG_ID, {"runtime": "install"}),
    (TPU_VM_DAG_ID, {"capacity": "spot", "reservation": None}),
]
OPERATORS = {";", "&&", "||", "|", "}", ")"}


def _flag(argv: list[str], name: str) -> str | None:
    for token in argv:
        if token.startswith(f"{name}="):
            return token.split("=", 1)[1]
    return None


def _maxtext_calls(text: str) -> list[tuple[str, dict[str, str]]]:
    """``(module, {key: value})`` of every ``python3 -m maxtext.…`` in a shell text."""
    calls = []
    for line in text.splitlines():
        try:
            tokens = shlex.split(line)
        except ValueError:
            continue
        for at, token in enumerate(tokens[:-1]):
            if token == "-m" and tokens[at + 1].startswith("maxtext."):
                keys: dict[str, str] = {}
                for arg in tokens[at + 2 :]:
                    if arg in OPERATORS:
                        break
                    key, eq, value = arg.partition("=")
                    if eq and not key.startswith("-"):
                        keys[key] = value
                calls.append((tokens[at + 1], keys))
    return calls


def _placed_calls(dag_id: str, conf: dict[str, Any]) -> list[tuple[str, str, str, dict[str, str]]]:
    """``(task_id, machine, module, keys)``: machine ``cpu`` or ``tpu`` as the plan shows it."""
    steps = build_plan(dag_id, conf)["steps"]
    machine_types = {}
    for step in steps:
        argv = step["argv"]
        if "instances" in argv and "create" in argv:
            machine_types[argv[argv.index("create") + 1]] = _flag(argv, "--machine-type") or ""
    placed = []
    for step in steps:
        argv = step["argv"]
        if argv[:3] == ["gcluster", "job", "submit"]:
            compute_type = _flag(argv, "--compute-type") or ""
            text = _flag(argv, "--command") or ""
        elif argv[:3] == ["gcloud", "compute", "ssh"]:
            compute_type = machine_types[argv[3]]
            text = step.get("stdin") or ""
        else:
            continue
        machine = "tpu" if compute_type.startswith("ct") else "cpu"
        placed += [(step["task_id"], machine, module, keys) for module, keys in _maxtext_calls(text)]
    return placed


@pytest.mark.parametrize(("dag_id", "conf"), CONFS)
def test_every_maxtext_program_on_a_cpu_machine_skips_the_jax_cluster(
    dag_id: str, conf: dict[str, Any]
) -> None:
    placed = _placed_calls(dag_id, conf)
    on_cpu = [(task, module, keys) for task, machine, module, keys in placed if machine == "cpu"]
    assert {module for _, module, _ in on_cpu} == {maxtext.TO_MAXTEXT, maxtext.TO_HUGGINGFACE}
    for task, module, keys in on_cpu:
        missing = {k: v for k, v in maxtext.CPU_KEYS if keys.get(k) != v}
        assert not missing, f"{task}: {module} runs on a CPU machine without {missing}"
    on_tpu = [(task, module) for task, machine, module, _ in placed if machine == "tpu"]
    assert on_tpu == [("train", maxtext.TRAIN_RL)]


def test_the_tpu_vm_plan_shows_the_two_keys_on_the_export() -> None:
    (export,) = [s for s in build_plan(TPU_VM_DAG_ID, {})["steps"] if s["task_id"] == "export_to_huggingface"]
    ((module, keys),) = _maxtext_calls(export["stdin"])
    assert module == maxtext.TO_HUGGINGFACE
    assert keys["hardware"] == "cpu"
    assert keys["skip_jax_distributed_system"] == "true"


def test_a_program_on_a_cpu_machine_takes_the_cpu_keys_whatever_it_is() -> None:
    argv = maxtext.program_argv(maxtext.TRAIN_RL, [("run_name", "r")], machine=maxtext.CPU)
    assert argv[-2:] == ["hardware=cpu", "skip_jax_distributed_system=true"]
    assert maxtext.program_argv(maxtext.TRAIN_RL, [("run_name", "r")], machine=maxtext.TPU) == [
        "python3",
        "-m",
        maxtext.TRAIN_RL,
        "run_name=r",
    ]
    # a converter's JAX runs on the CPU even on a TPU machine
    assert "skip_jax_distributed_system=true" in maxtext.program_argv(
        maxtext.TO_MAXTEXT, [], machine=maxtext.TPU
    )


def test_a_config_that_contradicts_the_cpu_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="hardware must be cpu, not 'tpu'"):
        maxtext.program_argv(maxtext.TO_HUGGINGFACE, [("hardware", "tpu")], machine=maxtext.CPU)
    same = maxtext.program_argv(maxtext.TO_HUGGINGFACE, [("hardware", "cpu")], machine=maxtext.CPU)
    assert same.count("hardware=cpu") == 1
