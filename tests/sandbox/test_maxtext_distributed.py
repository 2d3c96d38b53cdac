"""The simulated MaxText starts JAX's distributed system as pyconfig does: on a machine without TPU
chips it refuses to start unless told to skip it (maxtext-v0.2.3/v0.2.4 max_utils.py
``maybe_initialize_jax_distributed_system``)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from tpu_rl_sandbox.machines import maxtext_sim
from tpu_rl_sandbox.machines.fsview import Router

PROGRAMS = (maxtext_sim.TO_MAXTEXT, maxtext_sim.TO_HUGGINGFACE, maxtext_sim.TRAIN_RL)
SKIP_LINE = "Skipping jax distributed system due to skip_jax_distributed_system=True flag."


class StopAfterStart(Exception):
    """Raised where the program would first touch storage: it got past its start."""


def _start(module: str, keys: list[str], *, tpu_chips: int | None, env: dict[str, str] | None = None) -> str:
    """Run ``module`` until it first reads or writes storage; returns its output. Raises
    :class:`StopAfterStart` when it got that far."""
    lines: list[str] = []

    class NoStorage:
        def __getattr__(self, name: str) -> Any:
            raise StopAfterStart

    ctx = maxtext_sim.SimContext(
        router=cast(Router, NoStorage()), write=lines.append, platform="vm", seed="s", tpu_chips=tpu_chips
    )
    argv = [
        "model_name=llama3.1-8b",
        "base_output_directory=gs://b/o/",
        "load_parameters_path=gs://b/p",
        *keys,
    ]
    runner = maxtext_sim.MaxTextRunner(ctx, module, argv, {"HF_TOKEN": "t", **(env or {})})
    code = runner.run()
    assert code == 1
    return "".join(lines)


@pytest.mark.parametrize("module", PROGRAMS)
def test_without_a_tpu_a_program_needs_skip_jax_distributed_system(module: str) -> None:
    out = _start(module, [], tpu_chips=0)
    assert "Attempting to initialize the jax distributed system for TPU backend..." in out
    assert out.rstrip().endswith("ValueError: coordinator_address should be defined.")


@pytest.mark.parametrize("module", [maxtext_sim.TO_MAXTEXT, maxtext_sim.TO_HUGGINGFACE])
@pytest.mark.parametrize(
    "keys", [["hardware=cpu", "skip_jax_distributed_system=true"], ["skip_jax_distributed_system=True"]]
)
def test_skipping_the_distributed_system_lets_a_converter_start_on_a_cpu(
    module: str, keys: list[str]
) -> None:
    with pytest.raises(StopAfterStart):
        _start(module, keys, tpu_chips=0)


def test_hardware_cpu_alone_runs_xpks_cpu_initialisation_and_fails_outside_xpk() -> None:
    out = _start(maxtext_sim.TO_HUGGINGFACE, ["hardware=cpu"], tpu_chips=0)
    assert "Attempting to initialize the jax distributed system for CPU backend..." in out
    assert out.rstrip().endswith(
        "TypeError: int() argument must be a string, a bytes-like object or a real number, not 'NoneType'"
    )


def test_with_checkpointing_off_the_tpu_branch_initialises_nothing() -> None:
    """max_utils calls jax.distributed.initialize() on the TPU branch only when checkpointing is on."""
    with pytest.raises(StopAfterStart):
        _start(maxtext_sim.TO_HUGGINGFACE, ["enable_checkpointing=false"], tpu_chips=0)


@pytest.mark.parametrize("chips", [8, None])
def test_on_a_tpu_host_or_a_pathways_head_jax_finds_its_cluster(chips: int | None) -> None:
    with pytest.raises(StopAfterStart):
        _start(maxtext_sim.TO_HUGGINGFACE, [], tpu_chips=chips)


def test_the_skip_is_logged_as_max_utils_logs_it() -> None:
    lines: list[str] = []
    ctx = maxtext_sim.SimContext(
        router=cast(Router, None), write=lines.append, platform="vm", seed="s", tpu_chips=0
    )
    runner = maxtext_sim.MaxTextRunner(ctx, maxtext_sim.TO_HUGGINGFACE, [], {})
    runner.initialize_jax_distributed_system(
        maxtext_sim.parse_args(maxtext_sim.TO_HUGGINGFACE, ["skip_jax_distributed_system=true"])
    )
    (line,) = lines
    assert line.rstrip().endswith(SKIP_LINE)
