"""Run a MaxText module as ``python -m`` would, optionally with Orbax's GCS atomicity on a local disk.

Usage: ``python run_converter.py [--gcs-atomicity] [--max-shard-bytes N] MODULE ARG...``

Orbax picks how a step becomes final from the path alone: ``gs://`` paths get
``CommitFileTemporaryPath`` (write in place, then ``commit_success.txt``), anything else
``AtomicRenameTemporaryPath`` (write ``<name>.orbax-checkpoint-tmp``, then rename)
(orbax-checkpoint 0.12.0 ``_src/path/atomicity_defaults.py`` l.28-45, chosen by
``gcs_utils.is_gcs_path`` = ``path.as_posix().startswith('gs://')``). With ``--gcs-atomicity``
the two selectors return ``CommitFileTemporaryPath`` for every path, so a local run lays out a step
the way a run on GCS does; Orbax's own tests switch the mode the same way (they patch
``gcs_utils.is_gcs_path``, ``_src/checkpointers/checkpointer_test_utils.py`` l.264). Nothing
else in MaxText or Orbax is changed.

``--max-shard-bytes N`` lowers ``to_huggingface``'s shard size (``shard_checkpoint``'s default
``max_shard_size=DEFAULT_MAX_SHARD_SIZE``, 3 GiB, ``checkpoint_conversion/utils/utils.py``
maxtext-v0.2.3 l.63 and l.404-407) so that a small model takes the sharded path (numbered shards
written, then ``model.safetensors.index.json``) that only models above 3 GiB take otherwise.

With ``MAXTEXT_WRITE_LOG`` and ``MAXTEXT_WRITE_ROOT`` set, write_audit.py records what the program
writes there, in order.
"""

from __future__ import annotations

import runpy
import sys


def use_commit_file_atomicity() -> None:
    from orbax.checkpoint._src.path import atomicity, atomicity_defaults

    def commit_file(path):
        return atomicity.CommitFileTemporaryPath

    atomicity_defaults.get_default_temporary_path_class = commit_file
    atomicity_defaults.get_item_default_temporary_path_class = commit_file


def use_max_shard_bytes(size: int) -> None:
    from maxtext.checkpoint_conversion.utils import utils

    defaults = list(utils.shard_checkpoint.__defaults__ or ())
    defaults[0] = size  # (max_shard_size, weights_name)
    utils.shard_checkpoint.__defaults__ = tuple(defaults)


def main(argv: list[str]) -> None:
    from write_audit import install  # this script's folder is sys.path[0]

    install()
    while argv and argv[0].startswith("--") and argv[0] in ("--gcs-atomicity", "--max-shard-bytes"):
        if argv[0] == "--gcs-atomicity":
            use_commit_file_atomicity()
            argv = argv[1:]
        else:
            use_max_shard_bytes(int(argv[1]))
            argv = argv[2:]
    if not argv:
        raise SystemExit(__doc__)
    module, args = argv[0], argv[1:]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
