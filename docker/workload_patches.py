"""Apply the tutorials' two start-up patches to a ``tpu_post_training:0.2.4`` image at build time.

Run by ``docker/workload.Dockerfile`` (python3 of the image, standard library only). Each patch must
match exactly once in the file it edits and must change it; otherwise this exits 1 and the image
build fails, so an image whose files moved on is never labelled as patched. The edits are the ones
the train command makes at start-up on the stock image (``TUNIX_RESHARD_PATCH`` and
``ADAFACTOR_PATCH`` in ``airflow_provider_tpu_rl/render/gke.py``); ``tests/docker`` runs both on
the pinned sources' lines and checks they give the same bytes.

    python3 workload_patches.py [--tunix-file PATH] [--utils-rl-file PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path

# google/tunix tunix/generate/vllm_sampler.py: the VllmConfig default and the reshard call.
TUNIX_REPLACEMENTS: tuple[tuple[str, str], ...] = (
    ("reshard_chunk_size: Optional[int] = None", "reshard_chunk_size: Optional[int] = 4"),
    ("reshard_chunk_size=self.config.reshard_chunk_size", "reshard_chunk_size=4"),
)
# MaxText src/maxtext/trainers/post_train/rl/utils_rl.py: AdamW -> Adafactor in make_optimizer.
UTILS_RL_FILE = "/deps/src/maxtext/trainers/post_train/rl/utils_rl.py"
ADAMW_PATTERN = "optax[.]adamw[(][^)]+[)]"
ADAFACTOR_CALL = "optax.adafactor(learning_rate=learning_rate)"


class PatchError(RuntimeError):
    """A patch does not apply (pattern missing, found more than once, or no change)."""


def tunix_file() -> Path:
    """``tunix/generate/vllm_sampler.py`` of the installed google-tunix, found without importing it."""
    spec = importlib.util.find_spec("tunix")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("google-tunix is not installed in this image (no `tunix` package)")
    return Path(next(iter(spec.submodule_search_locations))) / "generate" / "vllm_sampler.py"


def patch_tunix(text: str) -> str:
    """The reshard chunk size fixed to 4; each literal must occur exactly once."""
    for old, new in TUNIX_REPLACEMENTS:
        count = text.count(old)
        if count != 1:
            raise PatchError(f"tunix reshard patch: {old!r} found {count} times, expected exactly once")
        text = text.replace(old, new)
    return text


def patch_utils_rl(text: str) -> str:
    """``optax.adamw(...)`` replaced by ``optax.adafactor(...)``; the call must occur exactly once."""
    count = len(re.findall(ADAMW_PATTERN, text))
    if count != 1:
        raise PatchError(f"adafactor patch: {ADAMW_PATTERN!r} matched {count} times, expected exactly once")
    return re.sub(ADAMW_PATTERN, ADAFACTOR_CALL, text)


def apply(path: Path, patch: str) -> None:
    """Rewrite ``path`` with one patch (``tunix`` or ``adafactor``); raises :class:`PatchError`."""
    try:
        before = path.read_text()
    except OSError as err:
        raise PatchError(f"{patch} patch: cannot read {path}: {err.strerror}") from err
    after = patch_tunix(before) if patch == "tunix" else patch_utils_rl(before)
    if after == before:
        raise PatchError(f"{patch} patch changed nothing in {path}")
    try:
        compile(after, str(path), "exec")
    except SyntaxError as err:
        raise PatchError(f"{patch} patch leaves {path} invalid Python: {err}") from err
    path.write_text(after)
    print(f"patched {path} ({patch})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tunix-file", type=Path, help="default: the installed tunix/generate/vllm_sampler.py"
    )
    parser.add_argument("--utils-rl-file", type=Path, default=Path(UTILS_RL_FILE))
    args = parser.parse_args(argv)
    try:
        apply(args.tunix_file or tunix_file(), "tunix")
        apply(args.utils_rl_file, "adafactor")
    except PatchError as err:
        print(f"workload_patches: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
