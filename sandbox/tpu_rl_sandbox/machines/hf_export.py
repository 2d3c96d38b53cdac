"""What MaxText's ``to_huggingface`` writes, for the sandbox's simulation: the files, their order,
the model's ``config.json`` and how many weight shards it takes.

Written from ``save_model_files`` (maxtext-v0.2.3 ``checkpoint_conversion/utils/utils.py``
l.594-669, v0.2.4 l.623-700) and checked against a real export by ``make test-maxtext``
(``tests/fixtures/maxtext/real_layouts.json``):

* ``tokenizer.save_pretrained`` first: ``chat_template.jinja``, ``tokenizer_config.json``,
  ``tokenizer.json`` (transformers 5 writes no ``special_tokens_map.json``; on ``gs://`` the three
  are saved to a temporary folder and uploaded in ``os.listdir`` order);
* ``config.json`` (``save_config_file``, l.372-382: ``HF_MODEL_CONFIGS[model_name]`` serialized by
  transformers, its ``architectures`` set from ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``);
* the weights: ``shard_checkpoint`` (l.411-467) packs the tensors, in name order, into shards of at
  most ``DEFAULT_MAX_SHARD_SIZE`` = 3 GiB; one shard is written as ``model.safetensors`` with no
  index, more as ``model-0000i-of-0000N.safetensors`` and then ``model.safetensors.index.json``
  (``{"metadata": {"total_size"}, "weight_map"}``), last.

The simulated weights are tiny; each model's shard count and ``total_size`` are the real export's:
its bf16 tensors packed the way ``shard_checkpoint`` packs them (computed once with transformers on
the ``meta`` device from ``HF_MODEL_CONFIGS``, the MoE experts split per expert as MaxText's
``param_mapping.py`` names them for Qwen3-MoE, kept fused for Gemma 4; Gemma 4 without its vision
tower, which ``use_multimodal=False`` leaves out).
"""

from __future__ import annotations

import json
import random
import struct
from dataclasses import dataclass
from typing import Any

MAX_SHARD_SIZE = 1024**3 * 3  # DEFAULT_MAX_SHARD_SIZE
INDEX_FILE = "model.safetensors.index.json"
# What each MaxText release's TPU VM install resolves (``--resolution=lowest``) and writes into
# config.json's ``transformers_version``.
TRANSFORMERS_VERSIONS = {"0.2.3": "5.11.0", "0.2.4": "5.12.1"}

# HF_MODEL_CONFIGS[model_name] as transformers 5.11/5.12 serializes it (the releases differ only in
# transformers_version).
HF_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "dtype": "bfloat16",
        "eos_token_id": None,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "layer_types": ["full_attention"] * 28,
        "max_position_embeddings": 40960,
        "max_window_layers": 28,
        "model_type": "qwen3",
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "pad_token_id": None,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "sliding_window": None,
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "decoder_sparse_step": 1,
        "dtype": "bfloat16",
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 6144,
        "max_position_embeddings": 262144,
        "max_window_layers": 48,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "num_attention_heads": 32,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "num_local_experts": 128,
        "output_router_logits": False,
        "pad_token_id": None,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"},
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "llama3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pad_token_id": None,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_parameters": {
            "factor": 8.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_theta": 500000.0,
            "rope_type": "llama3",
        },
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": 128256,
    },
    "gemma4-26b": {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "audio_config": None,
        "audio_token_id": 258881,
        "boa_token_id": 256000,
        "boi_token_id": 255999,
        "dtype": "bfloat16",
        "eoa_token_id": 258883,
        "eoa_token_index": 258883,
        "eoi_token_id": 258882,
        "eos_token_id": [1, 106],
        "image_token_id": 258880,
        "initializer_range": 0.02,
        "model_type": "gemma4",
        "text_config": {
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attention_k_eq_v": True,
            "bos_token_id": 2,
            "dtype": "bfloat16",
            "enable_moe_block": True,
            "eos_token_id": 1,
            "final_logit_softcapping": 30.0,
            "global_head_dim": 512,
            "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 2816,
            "hidden_size_per_layer_input": 0,
            "initializer_range": 0.02,
            "intermediate_size": 2112,
            "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5,
            "max_position_embeddings": 262144,
            "model_type": "gemma4_text",
            "moe_intermediate_size": 704,
            "num_attention_heads": 16,
            "num_experts": 128,
            "num_global_key_value_heads": 2,
            "num_hidden_layers": 30,
            "num_key_value_heads": 8,
            "num_kv_shared_layers": 0,
            "pad_token_id": 0,
            "rms_norm_eps": 1e-06,
            "rope_parameters": {
                "full_attention": {
                    "partial_rotary_factor": 0.25,
                    "rope_theta": 1000000.0,
                    "rope_type": "proportional",
                },
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
            },
            "sliding_window": 1024,
            "tie_word_embeddings": True,
            "top_k_experts": 8,
            "use_bidirectional_attention": "vision",
            "use_cache": True,
            "use_double_wide_mlp": False,
            "vocab_size": 262144,
            "vocab_size_per_layer_input": 262144,
        },
        "tie_word_embeddings": True,
        "video_token_id": 258884,
        "vision_config": {
            "_name_or_path": "",
            "architectures": None,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "chunk_size_feed_forward": 0,
            "default_output_length": 280,
            "dtype": "bfloat16",
            "global_head_dim": 72,
            "head_dim": 72,
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 1152,
            "id2label": {"0": "LABEL_0", "1": "LABEL_1"},
            "initializer_range": 0.02,
            "intermediate_size": 4304,
            "is_encoder_decoder": False,
            "label2id": {"LABEL_0": 0, "LABEL_1": 1},
            "max_position_embeddings": 131072,
            "model_type": "gemma4_vision",
            "num_attention_heads": 16,
            "num_hidden_layers": 27,
            "num_key_value_heads": 16,
            "output_attentions": False,
            "output_hidden_states": False,
            "patch_size": 16,
            "pooling_kernel_size": 3,
            "position_embedding_size": 10240,
            "problem_type": None,
            "return_dict": True,
            "rms_norm_eps": 1e-06,
            "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"},
            "standardize": True,
            "use_clipped_linears": False,
        },
        "vision_soft_tokens_per_image": 280,
    },
}

CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}\n"
)


@dataclass(frozen=True)
class ExportedModel:
    """A model ``to_huggingface`` can export, as the sandbox writes it."""

    config: str  # key of HF_CONFIGS
    tokenizer_class: str
    total_size: int  # bytes of its exported bf16 tensors
    shards: int  # weight files shard_checkpoint makes of them


# Sizes: the exported tensors' parameters x 2 bytes (qwen3-0.6b 596,049,920; qwen3-30b-a3b
# 30,532,122,624; Llama-3.1-8B 8,030,261,248; gemma4-26b's text model 25,233,141,790).
MODELS: dict[str, ExportedModel] = {
    "qwen3-0.6b": ExportedModel("qwen3-0.6b", "Qwen2Tokenizer", 1_192_099_840, 1),
    "qwen3-30b-a3b": ExportedModel("qwen3-30b-a3b", "Qwen2Tokenizer", 61_064_245_248, 19),
    "llama3.1-8b": ExportedModel("llama3.1-8b", "TokenizersBackend", 16_060_522_496, 6),
    "llama3.1-8b-Instruct": ExportedModel("llama3.1-8b", "TokenizersBackend", 16_060_522_496, 6),
    "gemma4-26b": ExportedModel("gemma4-26b", "GemmaTokenizer", 50_466_283_580, 18),
}


def config_json(model: ExportedModel, maxtext_version: str) -> dict[str, Any]:
    """The export's config.json."""
    config = json.loads(json.dumps(HF_CONFIGS[model.config]))
    config["transformers_version"] = TRANSFORMERS_VERSIONS[maxtext_version]
    return dict(sorted(config.items()))


def tokenizer_config_json(model: ExportedModel) -> dict[str, Any]:
    """The keys transformers 5's ``save_pretrained`` writes (Qwen's tokenizer, in a real export)."""
    return {
        "add_prefix_space": False,
        "backend": "tokenizers",
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "extra_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": model.tokenizer_class,
        "unk_token": None,
    }


def safetensors_bytes(names: list[str], rng: random.Random) -> bytes:
    """A valid safetensors file holding tiny BF16 tensors."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    payload = b""
    for name in names:
        size = 2 * 2 * 2  # 2x2 bf16
        header[name] = {"dtype": "BF16", "shape": [2, 2], "data_offsets": [offset, offset + size]}
        payload += rng.randbytes(size)
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * ((8 - len(encoded) % 8) % 8)
    return struct.pack("<Q", len(encoded)) + encoded + payload


def export_files(model_name: str, maxtext_version: str, rng: random.Random) -> list[tuple[str, bytes]]:
    """``(file name, content)`` in the order ``to_huggingface`` writes them.

    Raises KeyError for a model MaxText has no Hugging Face config of (``HF_MODEL_CONFIGS``).
    """
    model = MODELS[model_name]
    files: list[tuple[str, bytes]] = [
        ("chat_template.jinja", CHAT_TEMPLATE.encode()),
        ("tokenizer_config.json", json.dumps(tokenizer_config_json(model), indent=2).encode()),
        ("tokenizer.json", json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode()),
        ("config.json", json.dumps(config_json(model, maxtext_version), indent=2).encode()),
    ]
    if model.shards == 1:
        tensors = ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight"]
        return [*files, ("model.safetensors", safetensors_bytes(tensors, rng))]
    weight_map: dict[str, str] = {}
    for index in range(1, model.shards + 1):
        name = f"model-{index:05d}-of-{model.shards:05d}.safetensors"
        tensors = [
            f"model.layers.{index - 1}.mlp.up_proj.weight",
            f"model.layers.{index - 1}.self_attn.q_proj.weight",
        ]
        if index == 1:
            tensors.insert(0, "model.embed_tokens.weight")
        files.append((name, safetensors_bytes(tensors, rng)))
        weight_map.update(dict.fromkeys(tensors, name))
    index_doc = {"metadata": {"total_size": model.total_size}, "weight_map": dict(sorted(weight_map.items()))}
    return [*files, (INDEX_FILE, json.dumps(index_doc, indent=2).encode())]
