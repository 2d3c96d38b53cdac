#!/usr/bin/env bash
# A CPU venv in which MaxText's own checkpoint converters run (the `make test-maxtext` leg):
#   python -m maxtext.checkpoint_conversion.to_maxtext / to_huggingface
#
# usage: tools/maxtext_real/setup.sh VERSION VENV   (VERSION: a MaxText release on PyPI)
#
# What it installs, and why:
# * maxtext==VERSION with --no-deps: the wheel declares no base dependencies, only extras
#   (maxtext's pyproject.toml: dependencies = [], extras tpu / tpu-post-train / cuda12 / ...).
# * The converters' import closure (found by importing both modules until nothing was missing),
#   pinned to the versions the TPU VM gets: it runs
#   `uv pip install 'maxtext[tpu-post-train]==VERSION' --resolution=lowest` (render/tpu_vm.py),
#   and MaxText's own images install their requirements with --resolution=lowest too
#   (maxtext-v0.2.4 src/dependencies/scripts/setup.sh l.218). The extra lists its whole closure
#   with >= lower bounds; constraints_from_metadata.py turns each into ==.
# * torch from PyPI (a CUDA build; the extra's +cpu build is on PyTorch's own index). It runs on
#   the CPU and is needed by to_maxtext's eager path (--lazy_load_tensors=False, the TPU VM's).
#   triton (640 MB) is left out: torch imports it only to compile kernels.
# * google-tunix (--no-deps), for actor_step.py (its sft/checkpoint_manager.py needs only flax,
#   jax and orbax).
# No libtpu, tensorflow or vllm: the converters do not import them.
#
# Python: MaxText needs >= 3.12; the newest 3.12 under pyenv (PYENV_ROOT, default ~/.pyenv) or
# PYTHON312. uv: UV, else the one on PATH. A re-run with the same VERSION and unchanged scripts is
# a no-op (a stamp file); uv's cache makes a rebuild take about a minute.
set -euo pipefail

version=${1:?usage: setup.sh VERSION VENV}
venv=${2:?usage: setup.sh VERSION VENV}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

uv=${UV:-$(command -v uv || true)}
[ -n "$uv" ] || { echo "setup.sh: uv not found (set UV=/path/to/uv)" >&2; exit 1; }
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
python312=${PYTHON312:-$(ls -d "$pyenv_root"/versions/3.12*/bin/python3.12 2>/dev/null | sort -V | tail -1)}
[ -n "$python312" ] && [ -x "$python312" ] || {
  echo "setup.sh: no Python 3.12 under $pyenv_root/versions (MaxText needs >= 3.12: pyenv install 3.12, or set PYTHON312)" >&2
  exit 1
}

stamp="$venv/.tpu-rl-maxtext-$version"
fingerprint=$( (cat "$0" "$here/constraints_from_metadata.py"; "$python312" -V) | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$fingerprint" ]; then
  echo "setup.sh: $venv already has maxtext $version"
  exit 0
fi

packages=(
  jax jaxlib flax orbax-checkpoint optax tensorstore etils ml-dtypes numpy jaxtyping
  transformers tokenizers safetensors huggingface-hub jinja2 sentencepiece tiktoken
  omegaconf pydantic absl-py psutil tqdm packaging pillow sympy
  aqtp qwix grain pathwaysutils tokamax
  torch
)
case "$version" in
  0.2.3) ;;
  *) packages+=(drjax) ;;  # imported by maxtext 0.2.4's model code
esac

rm -rf "$venv"
"$uv" venv -q -p "$python312" "$venv"
"$uv" pip install -q --python "$venv/bin/python" --no-deps "maxtext==$version"
"$venv/bin/python" "$here/constraints_from_metadata.py" >"$venv/constraints.txt"
echo triton >"$venv/excludes.txt"
"$uv" pip install -q --python "$venv/bin/python" -c "$venv/constraints.txt" \
  --excludes "$venv/excludes.txt" "${packages[@]}"
"$uv" pip install -q --python "$venv/bin/python" -c "$venv/constraints.txt" --no-deps google-tunix
"$venv/bin/python" -c "import maxtext.checkpoint_conversion.to_maxtext, maxtext.checkpoint_conversion.to_huggingface" \
  2>"$venv/import-check.log" || { tail -20 "$venv/import-check.log" >&2; exit 1; }
echo "$fingerprint" >"$stamp"
echo "setup.sh: maxtext $version ready in $venv ($(du -sh "$venv" | cut -f1))"
