"""A random-weight Qwen3-0.6B in Hugging Face layout, made locally (no hub download).

``build(out)`` writes what the hub repo ``Qwen/Qwen3-0.6B`` holds that the converters read:
``config.json``, ``generation_config.json``, one ``model.safetensors`` (bf16, tied embeddings, so
no ``lm_head.weight``) and the Qwen3 tokenizer the MaxText wheel ships
(``maxtext/assets/tokenizers/qwen3-tokenizer/{tokenizer.json,tokenizer_config.json}``: Qwen's
BPE and chat template). The shapes are the public ``Qwen/Qwen3-0.6B`` config, the values MaxText
hard-codes in ``checkpoint_conversion/utils/hf_model_configs.py`` (``qwen3_0_6b_config``) and
``configs/models/qwen3-0.6b.yml``: the converters read their shapes from there, not from
``config.json``, so the full 28 layers are kept (a smaller model would need keys the provider
does not render).

``install_in_hub_cache(src, hf_home)`` lays the files out as huggingface_hub's cache
(``hub/models--Qwen--Qwen3-0.6B/{refs/main,snapshots/<rev>/}``) so that, with ``HF_HUB_OFFLINE=1``
and ``HF_HOME=hf_home``, ``snapshot_download`` and ``AutoTokenizer.from_pretrained`` of the repo id
resolve to it without a network.

Runs in a MaxText venv (numpy, ml_dtypes, safetensors): ``python tiny_model.py OUT --hf-home DIR``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from importlib.util import find_spec
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

REPO_ID = "Qwen/Qwen3-0.6B"
REVISION = "0" * 40  # made up: 40 hex digits, as the cache's refs/main holds

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
GENERATION_CONFIG = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643}


def weight_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of a dense Qwen3 causal LM with tied embeddings."""
    hidden, inter, head = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * head, config["num_key_value_heads"] * head
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config["vocab_size"], hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, hidden),
            p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden),
            p + "self_attn.o_proj.weight": (hidden, q),
            p + "self_attn.q_norm.weight": (head,),
            p + "self_attn.k_norm.weight": (head,),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    shapes["model.norm.weight"] = (hidden,)
    return shapes


def random_weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """bf16 tensors: N(0, 0.02) matrices (one random block tiled from random offsets, for speed),
    ones for the norms."""
    rng = np.random.default_rng(seed)
    block = (rng.standard_normal(1 << 20, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)
    weights = {}
    for name, shape in weight_shapes(config).items():
        if len(shape) == 1:
            weights[name] = np.ones(shape, dtype=ml_dtypes.bfloat16)
            continue
        size = int(np.prod(shape))
        start = int(rng.integers(0, block.size))
        reps = -(-(size + start) // block.size)
        weights[name] = np.tile(block, reps)[start : start + size].reshape(shape)
    return weights


def shipped_qwen3_tokenizer() -> Path:
    """The Qwen3 tokenizer folder inside the installed maxtext package (found without importing it)."""
    spec = find_spec("maxtext")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("tiny_model.py: maxtext is not installed in this Python")
    folder = Path(next(iter(spec.submodule_search_locations))) / "assets" / "tokenizers" / "qwen3-tokenizer"
    if not (folder / "tokenizer.json").is_file():
        raise SystemExit(f"tiny_model.py: no Qwen3 tokenizer in {folder}")
    return folder


def build(out: Path, seed: int = 0) -> Path:
    """Write the model folder ``out`` (created) and return it."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2))
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2))
    save_file(random_weights(CONFIG, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer = shipped_qwen3_tokenizer()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer / name, out / name)
    return out


def install_in_hub_cache(src: Path, hf_home: Path, repo_id: str = REPO_ID, revision: str = REVISION) -> Path:
    """Link ``src``'s files into huggingface_hub's cache layout under ``hf_home``; return the snapshot."""
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    for file in src.iterdir():
        target = snapshot / file.name
        target.unlink(missing_ok=True)
        try:
            target.hardlink_to(file)
        except OSError:
            shutil.copy2(file, target)
    return snapshot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--hf-home", type=Path, required=True, help="install into this HF_HOME's hub cache")
    args = parser.parse_args()
    start = time.monotonic()
    build(args.out)
    print(install_in_hub_cache(args.out, args.hf_home))
    print(f"built {args.out} in {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    main()
