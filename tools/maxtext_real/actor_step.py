"""Write a training-style Orbax step the way MaxText's RL trainer does, on CPU, without training.

MaxText's ``train_rl`` (maxtext-v0.2.4 ``trainers/post_train/rl/train_rl.py`` l.443-446) builds
``ocp.CheckpointManagerOptions(save_interval_steps=checkpoint_period,
max_to_keep=max_num_checkpoints_to_keep)`` and hands it to tunix's RL cluster, which saves the
actor under ``<checkpoint_dir>/actor`` (google-tunix 0.1.7 ``rl/rl_cluster.py`` l.567-570) with
``tunix.sft.checkpoint_manager.CheckpointManager`` (items ``model_params`` = ``nnx.state(model)``
and ``optimizer_state`` = ``nnx.state(optimizer, nnx.optimizer.OptState)``, ``save`` l.91-143).

This script runs that same CheckpointManager with those options. The "model" is an ``nnx.Module``
whose ``base`` holds the converted checkpoint's parameters as ``nnx.Param`` (the tree MaxText's
RL actor has: ``to_huggingface`` reads ``{'base': {'decoder': ..., 'token_embedder': ...}}`` as
an NNX-RL checkpoint, maxtext-v0.2.4 ``checkpoint_conversion/utils/utils.py`` l.1059-1090), and
the optimizer is ``optax.adafactor`` (what the GKE pipeline patches ``utils_rl.py`` to; its
factored state is small). Nothing is trained: the step holds the converted weights.

``checkpoint_manager.py`` is loaded from its file: ``tunix/__init__`` and ``tunix/sft/__init__``
import trainers (metrax, …) that the manager does not need.

Usage: ``python actor_step.py ITEMS_DIR ACTOR_DIR STEP [--period N] [--keep N] [--pathways]
[--gcs-atomicity]`` (``--pathways``: the handlers tunix picks when ``JAX_PLATFORMS`` contains
``proxy``, as on the GKE pipeline's Pathways head: no OCDBT, no zarr3, l.53-63;
``--gcs-atomicity``: Orbax's commit-file finalization, as on ``gs://``, see run_converter.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path
from typing import Any


def load_tunix_checkpoint_manager() -> Any:
    spec = importlib.util.find_spec("tunix")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("actor_step.py: google-tunix is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "sft" / "checkpoint_manager.py"
    module_spec = importlib.util.spec_from_file_location("tunix_sft_checkpoint_manager", path)
    assert module_spec is not None
    assert module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("items_dir", help="a converted checkpoint's <step>/items folder")
    parser.add_argument("actor_dir", help="<base_output_directory>/<run_name>/checkpoints/actor")
    parser.add_argument("step", type=int)
    parser.add_argument("--period", type=int, default=10, help="checkpoint_period")
    parser.add_argument("--keep", type=int, default=None, help="max_num_checkpoints_to_keep")
    parser.add_argument("--pathways", action="store_true")
    parser.add_argument("--gcs-atomicity", action="store_true")
    args = parser.parse_args()
    from write_audit import install  # this script's folder is sys.path[0]

    install()  # MAXTEXT_WRITE_LOG: what Orbax writes, in order
    if args.gcs_atomicity:
        from run_converter import use_commit_file_atomicity

        use_commit_file_atomicity()

    import jax
    import optax
    import orbax.checkpoint as ocp
    from flax import nnx

    jax.config.update("jax_platforms", "cpu")
    jax.devices()  # start the CPU backend before JAX_PLATFORMS is touched
    if args.pathways:
        os.environ["JAX_PLATFORMS"] = "proxy,cpu"  # tunix reads it when the manager is built

    start = time.monotonic()
    import numpy as np

    checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
    items_dir = Path(args.items_dir).resolve()
    tree = checkpointer.metadata(items_dir).item_metadata.tree
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    params = checkpointer.restore(items_dir, restore_args=as_numpy)["params"]["params"]

    class Node(nnx.Module):
        def __init__(self, tree: dict) -> None:
            for key, value in tree.items():
                setattr(
                    self, key, Node(value) if isinstance(value, dict) else nnx.Param(jax.numpy.asarray(value))
                )

    class Actor(nnx.Module):
        def __init__(self, base: dict) -> None:
            self.base = Node(base)

    actor = Actor(params)
    optimizer = nnx.Optimizer(actor, optax.adafactor(1e-5), wrt=nnx.Param)
    tunix_cm = load_tunix_checkpoint_manager()
    options = ocp.CheckpointManagerOptions(save_interval_steps=args.period, max_to_keep=args.keep)
    manager = tunix_cm.CheckpointManager(root_directory=args.actor_dir, options=options)
    saved = manager.save(args.step, actor, optimizer)
    manager.close()
    print(f"saved={saved} step={args.step} in {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    main()
