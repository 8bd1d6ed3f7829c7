"""config.json -> ModelShape the way vLLM reads it: heads, KV heads, head size, MLA, multimodal
text configs, sliding windows, the derived maximum length, quantization bits."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES
from vllm_doctor.capacity import arithmetic as cap
from vllm_doctor.capacity.shape import derive_max_model_len, quantization_bits, shape_from_config

CONFIGS = FIXTURES / "configs"


def shape(name: str, **kw):
    return shape_from_config(json.loads((CONFIGS / name / "config.json").read_text()), name=name, **kw)


# name: (layers, attention heads, KV heads, head size, KV bytes per token at bf16 and TP 1)
EXPECTED = {
    "llama-2-7b": (32, 32, 32, 128, 524_288),  # MHA
    "llama-3-8b": (32, 32, 8, 128, 131_072),  # GQA
    "llama-3-70b": (80, 64, 8, 128, 327_680),
    "llama-3.1-8b": (32, 32, 8, 128, 131_072),
    "mistral-7b-v0.1": (32, 32, 8, 128, 131_072),
    "qwen2.5-7b": (28, 28, 4, 128, 57_344),
    "gemma-7b": (28, 16, 16, 256, 458_752),  # explicit head_dim 256, not 3072 / 16 = 192
    "mixtral-8x7b": (32, 32, 8, 128, 131_072),
    "deepseek-v3": (61, 128, 128, 576, 70_272),  # MLA: (512 + 64) x 61 x 2
    "deepseek-v2-lite": (27, 16, 16, 576, 31_104),
    "llava-1.5-7b": (32, 32, 32, 128, 524_288),  # text_config, Llama defaults
    # text_config; 10 full-attention layers grow per token, the 52 sliding ones hold their window
    "gemma-3-27b": (62, 32, 16, 128, 81_920),
    "gpt-oss-120b": (36, 64, 8, 64, 36_864),  # 18 full-attention layers; 18 on a 128-token window
    "lab-wide-llama": (32, 8, 8, 128, 131_072),
    "lab-tiny-llama": (2, 4, 2, 64, 1_024),
    "lab-tiny-llama-hd16": (2, 4, 2, 16, 256),
    "lab-tiny-llama-h6kv4": (2, 6, 4, 64, 2_048),
    "lab-tiny-llama-h6kv6": (2, 6, 6, 64, 3_072),
}


def test_every_config_fixture_is_covered():
    assert {p.name for p in CONFIGS.iterdir() if p.is_dir()} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shape_and_kv_bytes_per_token(name):
    s = shape(name)
    layers, heads, kv, head_dim, bpt = EXPECTED[name]
    assert (s.layers, s.attention_heads, s.kv_heads, s.head_dim) == (layers, heads, kv, head_dim)
    assert cap.kv_bytes_per_token(s, 2) == bpt


def test_lab_configs_are_the_labs_own(shared):
    models = shared / "vllm-lab" / "models"
    dirs = sorted(d for d in models.iterdir() if (d / "config.json").is_file())
    assert dirs, f"no lab models under {models}"
    for d in dirs:
        assert (CONFIGS / f"lab-{d.name}" / "config.json").read_text() == (d / "config.json").read_text()


def test_mla_is_one_latent_vector_per_token_per_layer_and_not_split_by_tp():
    s = shape("deepseek-v3")
    assert s.use_mla and (s.kv_lora_rank, s.qk_rope_head_dim) == (512, 64)
    assert cap.kv_heads_per_rank(s, 8) == 1
    assert cap.kv_bytes_per_token(s, 2, tp=8) == cap.kv_bytes_per_token(s, 2) == (512 + 64) * 61 * 2
    assert cap.kv_bytes_per_token(s, 1) == 35_136  # fp8 KV cache


def test_gqa_kv_heads_split_over_tp_and_replicate_past_them():
    s = shape("llama-3-70b")
    assert cap.kv_bytes_per_token(s, 2, tp=4) == 2 * 80 * 2 * 128 * 2
    assert cap.kv_heads_per_rank(s, 16) == 1  # 8 KV heads over 16 GPUs: each head on two GPUs


def test_multimodal_text_config_and_its_defaults_are_noted():
    llava = shape("llava-1.5-7b")
    assert llava.max_position_embeddings == 4096 and llava.dtype == "float16"
    assert any("text_config" in n for n in llava.notes)
    assert any("num_hidden_layers" in n and "llama defaults" in n for n in llava.notes)
    gemma3 = shape("gemma-3-27b")
    assert (gemma3.sliding_window, gemma3.sliding_layers, gemma3.full_layers) == (1024, 52, 10)
    assert gemma3.derived_max_model_len == 131072  # vLLM does not multiply Gemma 3's linear rope factor


def test_sliding_window_per_architecture():
    mistral = shape("mistral-7b-v0.1")
    assert (mistral.sliding_window, mistral.sliding_layers) == (4096, 32)
    qwen = shape("qwen2.5-7b")
    assert qwen.sliding_window is None and qwen.sliding_layers == 0
    assert any("use_sliding_window is false" in n for n in qwen.notes)
    typed = shape_from_config({"num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 256, "sliding_window": 512,
                               "layer_types": ["sliding_attention", "full_attention"] * 2})  # fmt: skip
    assert typed.sliding_layers == 2


def test_dtype_quantization_and_experts():
    assert shape("llama-2-7b").dtype == "float16"
    assert shape("lab-wide-llama").dtype == "bfloat16"  # transformers 5 writes "dtype"
    v3 = shape("deepseek-v3")
    assert (v3.quant_method, v3.quant_bits, v3.num_experts) == ("fp8", 8.0, 256)
    assert shape("mixtral-8x7b").num_experts == 8
    q = quantization_bits
    assert q({"quant_method": "awq", "bits": 4, "group_size": 128}) == ("awq", 4.0)
    assert q({"quant_method": "gptq", "bits": 8}) == ("gptq", 8.0)
    assert q({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {"num_bits": 4}}}}) == (
        "compressed-tensors",
        4.0,
    )
    assert q({"load_in_4bit": True}) == ("bitsandbytes", 4.0)
    assert q(None) == (None, None)


@pytest.mark.parametrize(
    "cfg, version, derived, key",
    [
        ({"max_position_embeddings": 8192, "n_positions": 4096}, None, 4096, "n_positions"),  # the smallest key wins
        ({"max_position_embeddings": 8192, "model_max_length": 16384}, None, 16384, "model_max_length"),
        ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}, None, 8192, "max_position_embeddings"),
        ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "dynamic", "factor": 4}}, None, 16384, "max_position_embeddings"),
        ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, None, 131072, "max_position_embeddings"),
        # yarn: original x factor up to 0.29; from 0.30 max_position_embeddings is taken as already scaled
        ({"max_position_embeddings": 32768, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, "0.10.2", 131072, "max_position_embeddings"),
        ({"max_position_embeddings": 32768, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, "0.30.0", 32768, "max_position_embeddings"),
        ({"max_position_embeddings": 2048, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}, None, 2048, "max_position_embeddings"),
        ({"hidden_size": 64}, None, None, None),
    ],
)  # fmt: skip
def test_derived_max_model_len(cfg, version, derived, key):
    assert derive_max_model_len(cfg, "llama", version) == (derived, key)


def test_kv_head_fallbacks_per_architecture():
    base = {"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512}
    assert shape_from_config(base).kv_heads == 8  # plain MHA
    assert shape_from_config({**base, "num_key_value_heads": None}).kv_heads == 8
    assert shape_from_config({**base, "model_type": "falcon", "multi_query": True}).kv_heads == 1
    falcon40 = {
        **base,
        "model_type": "falcon",
        "multi_query": True,
        "new_decoder_architecture": True,
        "num_kv_heads": 2,
    }
    assert shape_from_config(falcon40).kv_heads == 2
    assert shape_from_config({**base, "model_type": "mpt", "attn_config": {"kv_n_heads": 2}}).kv_heads == 2
    assert shape_from_config({**base, "multi_query_group_num": 2}).kv_heads == 2  # ChatGLM
    gpt2 = {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "model_type": "gpt2"}
    s = shape_from_config(gpt2)
    assert (s.layers, s.attention_heads, s.kv_heads, s.head_dim, s.derived_max_model_len) == (12, 12, 12, 64, 1024)
