"""capacity/kvcache.py from vLLM's source formulas, for what the recordings cannot show: tensor
parallelism (the CPU lab runs one rank), the eras before 0.21, padding layers, cross-attention, and
the config keys of the hybrid families (../shared/vllm-reference/kv-cache-arithmetic.md and
kv-cache-v1-groups.md; vllm 0.32 v1/core/kv_cache_utils.py and v1/kv_cache_interface.py)."""

from __future__ import annotations

import json

from conftest import FIXTURES
from vllm_doctor.capacity import kvcache
from vllm_doctor.capacity.layers import StateDims
from vllm_doctor.capacity.shape import shape_from_config

CONFIGS = FIXTURES / "configs"
GIB = 2**30


def shape(name):
    return shape_from_config(json.loads((CONFIGS / name / "config.json").read_text()))


def test_kv_heads_split_then_replicated_under_tp():
    """Llama-3-8B's 8 KV heads: 4 per rank at TP 2, 1 at TP 8, and still 1 (replicated) at TP 16."""
    s = shape("llama-3-8b")
    pages = {tp: kvcache.layout(s, 2.0, tp).layer_page for tp in (1, 2, 8, 16)}
    assert pages == {1: 16 * 2 * 8 * 128 * 2, 2: 16 * 2 * 4 * 128 * 2, 8: 16 * 2 * 128 * 2, 16: 16 * 2 * 128 * 2}


def test_dense_model_is_one_group_and_the_null_block_decides_the_fit():
    lay = kvcache.layout(shape("llama-3-8b"), 2.0)
    assert (len(lay.groups), lay.page_bytes) == (1, 32 * 16 * 131_072 // 32)
    got = kvcache.capacity(lay, 2 * GIB, 1024 * 16)  # exactly 1,024 blocks: the null block makes it miss
    assert got.num_blocks == 1024 and not got.fits and got.estimated_max_len == 1023 * 16


def test_token_count_by_era():
    """0.21+: int(concurrency x L); 0.9.1-0.20: blocks // groups x block size; older: blocks x size."""
    lay = kvcache.layout(shape("gemma-3-27b"), 2.0)
    new = kvcache.capacity(lay, 16 * GIB, 32_768, 16_384, "0.32.0")
    mid = kvcache.capacity(lay, 16 * GIB, 32_768, 16_384, "0.10.2")
    old = kvcache.capacity(lay, 16 * GIB, 32_768, 16_384, "0.8.5")
    assert new.tokens == int(13_107 / 8_582 * 32_768)
    assert mid.tokens == 13_107 // 7 * 16 and mid.concurrency == new.concurrency
    assert old.tokens == 13_107 * 16 and old.concurrency == 13_107 * 16 / 32_768
    assert not kvcache.hybrid_supported("0.9.0") and kvcache.hybrid_supported("0.9.1")
    assert not kvcache.hybrid_supported("0.10.2", engine="V0")


def test_padding_layers_cost_blocks_but_not_the_check():
    """Gemma-3-27B's 52 sliding layers in 6 groups of 10: 8 padding slots. A request claims a block
    in every group (R counts 6 sliding groups), the startup check counts only the 52 real layers."""
    lay = kvcache.layout(shape("gemma-3-27b"), 2.0)
    assert [g.layers for g in lay.groups if g.kind == "sliding"] == [9, 9, 9, 9, 8, 8]  # layers[i::6]
    per_group = 1_089  # cdiv(1,023 + 16,384, 16) + 1
    assert kvcache.request_blocks(lay, 131_072, 16_384) == 6 * per_group + 8_192
    assert kvcache.needed_bytes(lay, 131_072, 16_384) == (52 * per_group + 10 * 8_192) * lay.layer_page


def test_chunked_local_attention_has_no_extra_block():
    """Llama-4 style: 3 of 4 layers on 8,192-token chunks (no_rope_layers default interval 4)."""
    cfg = {"model_type": "llama4_text", "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
           "head_dim": 128, "hidden_size": 5120, "attention_chunk_size": 8192, "max_position_embeddings": 10485760}  # fmt: skip
    s = shape_from_config(cfg)
    assert s.layer_plan is not None and (s.layer_plan.count("chunked"), s.layer_plan.count("full")) == (36, 12)
    lay = kvcache.layout(s, 2.0)
    assert (len(lay.groups), lay.group_size) == (4, 12)
    chunked = next(g for g in lay.groups if g.kind == "chunked")
    assert chunked.blocks_per_request(131_072, 16, 8_192) == (8192 + 8192) // 16  # cdiv(C + M, bs), no + 1
    assert chunked.blocks_per_request(4_000, 16, 8_192) == 250  # never more than the request itself


def test_hybrid_manager_off_sizes_windows_as_full():
    lay = kvcache.layout(shape("gpt-oss-120b"), 2.0, hybrid_manager=False)
    assert len(lay.groups) == 1 and lay.groups[0].kind == "full" and lay.groups[0].layers == 36
    assert "hybrid KV cache manager off" in lay.notes[0]


def test_mamba_state_raises_the_block_size_and_is_padded():
    """Granite-4.0-H style Mamba2 (d_state 128, 128 heads of 64, 1 group, conv 4) beside GQA 8 x 128:
    state = (3 x (8,192 + 2 x 128)) + 128 x 64 x 128 elements x 2 B; the attention block grows to
    16 x cdiv(state, 16 x 4,096 B) tokens and the Mamba page is padded to that page."""
    cfg = {"model_type": "granitemoehybrid", "num_hidden_layers": 4, "num_attention_heads": 32,
           "num_key_value_heads": 8, "hidden_size": 4096, "layer_types": ["mamba", "mamba", "mamba", "attention"],
           "mamba_n_heads": 128, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4,
           "mamba_expand": 2, "max_position_embeddings": 131072}  # fmt: skip
    s = shape_from_config(cfg)
    state = (3 * (8192 + 2 * 128) + 128 * 64 * 128) * 2
    lay = kvcache.layout(s, 2.0)
    assert lay.mamba_state_bytes == state
    assert lay.block_size == 16 * -(-state // (16 * 4096)) and lay.layer_page == lay.block_size * 4096
    assert (len(lay.groups), lay.group_size) == (4, 1)
    assert next(g for g in lay.groups if g.kind == "mamba").state_blocks == 3  # Mamba2 with prefix caching
    off = kvcache.layout(s, 2.0, prefix_caching=False)
    assert kvcache.request_blocks(off, 4096, 2048) == 3 * 1 + -(-4096 // off.block_size)


def test_mamba_state_under_tp_and_the_extra_groups():
    d = StateDims("mamba2", 8192, 4, heads=128, head_dim=64, state=128, n_groups=1)
    assert d.elements(1) == (3 * (8192 + 256), 128 * 64 * 128)
    assert d.elements(4) == (3 * (8192 + 2 * 4 * 128) // 4, 32 * 64 * 128)  # 1 group becomes 4 shards
    gdn = StateDims("gdn", 128 * 16 * 2 + 128 * 32, 4, heads=32, head_dim=128, state=128)
    assert gdn.elements(2) == (3 * (4096 + 4096) // 2, 16 * 128 * 128)


def test_hybrid_family_layer_patterns():
    nemotron = shape_from_config({"model_type": "nemotron_h", "num_hidden_layers": 6, "num_attention_heads": 8,
                                  "num_key_value_heads": 2, "hidden_size": 512, "hybrid_override_pattern": "M-M*-E",
                                  "mamba_num_heads": 8, "mamba_head_dim": 64, "ssm_state_size": 128})  # fmt: skip
    assert nemotron.layer_plan is not None and nemotron.layer_plan.kinds == [
        "mamba",
        "none",
        "mamba",
        "full",
        "none",
        "none",
    ]
    jamba = shape_from_config({"model_type": "jamba", "num_hidden_layers": 8, "num_attention_heads": 8,
                               "num_key_value_heads": 2, "hidden_size": 512, "attn_layer_period": 8,
                               "attn_layer_offset": 4})  # fmt: skip
    assert jamba.layer_plan is not None and jamba.layer_plan.kinds.count("full") == 1
    assert jamba.layer_plan.state is not None and jamba.layer_plan.state.kind == "mamba1"
    falcon = shape_from_config({"model_type": "falcon_h1", "num_hidden_layers": 4, "num_attention_heads": 8,
                                "num_key_value_heads": 2, "hidden_size": 512, "mamba_n_heads": 8, "mamba_d_head": 64})  # fmt: skip
    assert falcon.layer_plan is not None and (falcon.layer_plan.count("full"), falcon.layer_plan.count("mamba")) == (
        4,
        4,
    )
    qwen = shape_from_config({"model_type": "qwen3_next", "num_hidden_layers": 48, "num_attention_heads": 16,
                              "num_key_value_heads": 2, "head_dim": 256, "hidden_size": 2048,
                              "full_attention_interval": 4, "linear_num_key_heads": 16,
                              "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                              "linear_value_head_dim": 128})  # fmt: skip
    assert qwen.layer_plan is not None and (qwen.layer_plan.count("full"), qwen.layer_plan.count("mamba")) == (12, 36)
    lay = kvcache.layout(qwen, 2.0)
    assert next(g for g in lay.groups if g.kind == "mamba").state_blocks == 2  # GDN with prefix caching


def test_cross_attention_holds_the_encoder_budget():
    """Whisper-style decoder: self-attention grows per token; cross-attention holds the encoder
    budget, max_num_encoder_input_tokens = max_num_batched_tokens (0.32 config/scheduler.py), so
    cdiv(2,048, 16) blocks at the CPU serve default (recorded: fixtures/kv-families/whisper-448)."""
    s = shape_from_config({"model_type": "whisper", "is_encoder_decoder": True, "num_hidden_layers": 4,
                           "decoder_layers": 4, "num_attention_heads": 6, "hidden_size": 384, "max_source_positions": 1500,
                           "max_target_positions": 448})  # fmt: skip
    lay = kvcache.layout(s, 2.0)
    assert [g.kind for g in lay.groups] == ["full", "cross"] and lay.group_size == 4
    assert kvcache.request_blocks(lay, 448, 2048) == 28 + 128


def test_mla_block_size_by_backend():
    """MLA: FlashMLA's 64 on a GPU unless --block-size says otherwise (or the log's "Setting kv
    cache block size to N"); the CPU backend forces 16 even over --block-size 128 (recorded)."""
    s = shape("deepseek-v3")
    assert kvcache.layout(s, 2.0).block_size == 64
    assert kvcache.layout(s, 2.0, block_size=16).block_size == 16
    assert kvcache.layout(s, 2.0, block_size=128, device="cpu").block_size == 16
    assert kvcache.layout(s, 2.0).layer_page == 64 * 576 * 2  # one latent of 512 + 64, no factor 2
