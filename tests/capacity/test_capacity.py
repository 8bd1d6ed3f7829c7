"""The capacity arithmetic (capacity.py) and what explain does with it: predicted against logged KV
tokens (the lab's wide model), the longest length that fits, fp8, TP sizes and rope scaling."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, LAB
from vllm_doctor.capacity import arithmetic as cap
from vllm_doctor.capacity.shape import shape_from_config
from vllm_doctor.knowledge.checks import Options
from vllm_doctor.render.json import to_dict
from vllm_doctor.render.markdown import render as to_markdown

CONFIGS = FIXTURES / "configs"
WIDE = str(CONFIGS / "lab-wide-llama")


def shape(name):
    return shape_from_config(json.loads((CONFIGS / name / "config.json").read_text()))


def test_sizes_say_their_unit():
    assert cap.parse_size("80GB") == cap.Size(80e9, "GB")
    assert cap.parse_size("80GiB") == cap.Size(80 * 2**30, "GiB")
    assert cap.parse_size("512 mib").bytes == 512 * 2**20
    assert str(cap.parse_size("80GiB")) == "80.0 GiB"
    for bad in ("80", "80 gigs", "", "GB"):
        with pytest.raises(ValueError, match="with a unit"):
            cap.parse_size(bad)
    assert cap.fmt_size(58e9, "GB") == "58.0 GB"


def test_parameter_counts():
    assert cap.parse_count("7B") == 7_000_000_000
    assert cap.parse_count("1.5b") == 1_500_000_000
    assert cap.parse_count("500M") == 500_000_000
    assert cap.parse_count("7e9") == 7_000_000_000
    assert cap.parse_count("7,000,000,000") == 7_000_000_000
    for bad in ("seven", "-7B", "0"):
        with pytest.raises(ValueError):
            cap.parse_count(bad)


def test_the_seed_steps():
    """7B bf16 on an 80 GB card at 0.90: 14.0 GB of weights, 58.0 GB of cache, 131,072 B per
    token, about 442,000 tokens, about 54 sequences of 8,192 and 13 of 32,768."""
    s = shape_from_config(
        {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
    )
    bpt = cap.kv_bytes_per_token(s, cap.dtype_bytes("bfloat16"))
    budget = cap.Budget(
        total_bytes=80e9, utilization=0.90, weights_bytes=7e9 * 2, overhead_bytes=0, bytes_per_token=bpt
    )
    assert budget.weights_bytes == 14e9
    assert budget.cache_bytes == pytest.approx(58e9)
    assert bpt == 131_072
    assert budget.tokens == 442_504 and cap.about(budget.tokens) == "442,000"
    assert budget.sequences(8192) == 54
    assert budget.sequences(32768) == 13


def test_block_examples():
    assert cap.blocks_for(40, 16) == (3, 8)  # 3 blocks, 8 slots empty in the last
    assert cap.sampling_blocks(200, 10, 16) == (130, 13)  # unshared vs shared prompt blocks
    assert cap.blocks_for(32, 16) == (2, 0)


def test_v1_null_block_the_wide_model():
    """1 GiB / 131,072 B = 8,192 tokens = 64 blocks of 128, but one is the null block: 8,064."""
    blocks = cap.blocks_that_fit(2**30, 131_072, 128)
    assert blocks == 64
    assert cap.largest_max_model_len(blocks, 128) == 8064
    assert cap.largest_max_model_len(blocks, 128, null_block=False) == 8192


def test_tp_rules():
    assert cap.valid_tp_sizes(6, 4, 8) == [1, 2]  # heads divide by 3 and 6, KV heads by neither
    assert cap.valid_tp_sizes(64, 8, 16) == [1, 2, 4, 8, 16]  # 16 > 8 KV heads: each replicated twice
    assert cap.valid_tp_sizes(4, 2, 8) == [1, 2, 4]
    assert cap.valid_tp_sizes(28, 4, 8) == [1, 2, 4]
    assert not cap.tp_ok(6, 48, 4)  # 6 > 4 KV heads, 6 % 4 != 0


def test_smallest_tp_that_fits():
    """Llama-3-70B on 80 GB cards at 0.90, 32k context: TP 2 leaves ~1.4 GiB for the cache, TP 4 fits."""
    s = shape("llama-3-70b")
    weights = 70.55e9 * 2
    room = 80e9 * 0.9 - weights / 2  # at TP 2
    sizes = cap.valid_tp_sizes(64, 8, 8)
    assert cap.smallest_tp_that_fits(s, 2, 32768, 16, room, weights / 2, 2, sizes) == 4
    assert cap.smallest_tp_that_fits(s, 2, 10**7, 16, room, weights / 2, 2, sizes) is None


def test_smallest_tp_from_one_counts_the_nccl_memory_each_gpu_adds():
    """From TP 1, each GPU of a split also holds NCCL's 0.5 GiB (serving.py's default, as startask's
    re-ask counts it): a TP 2 that fits with 0.25 GiB to spare without it does not fit with it."""
    from vllm_doctor.capacity import kvcache

    s = shape("llama-3-70b")
    weights = 8 * cap.GIB  # per GPU at TP 1
    lay = kvcache.layout(s, 2, 2, 16)
    room = kvcache.needed_bytes(lay, 32768, 2048) + lay.page_bytes + 0.25 * cap.GIB - weights / 2
    sizes = cap.valid_tp_sizes(64, 8, 8)
    assert cap.smallest_tp_that_fits(s, 2, 32768, 16, room, weights, 1, sizes) == 2
    assert cap.smallest_tp_that_fits(s, 2, 32768, 16, room, weights, 1, sizes, nccl_bytes=0.5 * cap.GIB) == 4


def test_utilization_needed_rounds_up():
    assert cap.utilization_needed(0.90, 4 * 2**30, 2 * 2**30, 80 * 2**30) == 0.93
    assert cap.utilization_needed(0.90, 2 * 2**30, 2 * 2**30, 80 * 2**30) == 0.90


def test_split_card_stays_within_the_budget_and_above_each_need():
    needs = [30e9, 20e9]
    fractions = cap.split_card(needs, 80e9, 0.90)
    assert sum(fractions) <= 0.90
    assert all(f * 80e9 >= n for f, n in zip(fractions, needs, strict=False))
    assert cap.split_card([50e9, 40e9], 80e9, 0.90) is None


def test_fp8_kv_and_fp32_checkpoints():
    assert cap.kv_element_bytes("fp8", "bfloat16") == (1.0, "fp8")
    assert cap.serving_dtype("auto", "float32") == cap.serving_dtype(None, "torch.float32") == "bfloat16"
    assert cap.kv_element_bytes("auto", cap.serving_dtype("auto", "float32")) == (2.0, "bfloat16")  # fp32 in 16 bits
    assert cap.kv_element_bytes("auto", cap.serving_dtype("float32", "bfloat16")) == (4.0, "float32")  # as asked
    assert cap.weight_bytes_per_param(cap.serving_dtype("float32", "float32")) == (4.0, "float32")
    assert cap.weight_bytes_per_param(cap.serving_dtype("auto", "float32")) == (2.0, "bfloat16")
    assert cap.kv_element_bytes(None, None) == (2.0, "bfloat16")


# --- in explain ----------------------------------------------------------------------------------


def test_wide_model_predicted_against_logged(run):
    """The lab's cache-fits: 131,072 B per token, 1 GiB set by the operator, 8,192 tokens logged."""
    report = to_dict(run(LAB / "cache-fits.log", options=Options(model=WIDE)))
    model, capacity = report["facts"]["model_shape"], report["facts"]["capacity"]
    assert model["kv_bytes_per_token"] == 131_072 and model["layers"] == 32
    assert capacity["kv_memory_gib"] == 1.0
    assert (capacity["predicted_tokens"], capacity["logged_tokens"], capacity["difference_pct"]) == (8192, 8192, 0.0)
    assert capacity["explanation"].startswith("agrees within 10%")
    assert "8,064" in capacity["explanation"]  # the null block: the longest sequence, which cache-fits starts
    assert capacity["longest_sequence"] == 8064


def test_capacity_work_is_shown_as_a_table(run):
    report = run(LAB / "cache-fits.log", options=Options(model=WIDE))
    md = to_markdown(report)
    assert "| step | work | value |" in md
    assert "| KV bytes per token | 2 x 32 layers x 8 KV heads x 128 head dim x 2 B (bfloat16) | 131,072 B |" in md
    assert "| predicted tokens |" in md and "Predicted vs logged: agrees" in md


def test_a_difference_gets_a_reason(run):
    """The same log read against the wrong model (8 times fewer bytes per token): flagged, with a reason."""
    report = to_dict(run(LAB / "cache-fits.log", options=Options(model=str(CONFIGS / "lab-tiny-llama"))))
    capacity = report["facts"]["capacity"]
    assert capacity["predicted_tokens"] == 2**30 // 1024
    assert capacity["difference_pct"] < -90
    assert capacity["explanation"].startswith("differs by") and "the model the log served" in capacity["explanation"]


def test_without_a_model_the_keys_are_there_and_null(run):
    facts = to_dict(run(LAB / "cache-fits.log"))["facts"]
    assert {"name", "layers", "attention_heads", "kv_heads", "head_dim", "kv_bytes_per_token",
            "max_position_embeddings", "params", "params_source"} <= set(facts["model_shape"])  # fmt: skip
    assert (
        facts["model_shape"]["layers"] is None
        and facts["model_shape"]["name"]
        and facts["model"] == facts["model_shape"]["name"]
    )
    assert {"predicted_tokens", "logged_tokens", "difference_pct", "explanation"} <= set(facts["capacity"])
    assert facts["capacity"]["predicted_tokens"] is None and facts["capacity"]["logged_tokens"] == 8192
    assert {"available", "reason", "devices"} <= set(facts["gpu"]) and facts["gpu"]["available"] is False


def test_cache_oom_with_the_model(run):
    top = run(LAB / "cache-oom.log", options=Options(model=WIDE)).diagnoses[0]
    assert top.category == "cache-oom"
    n = top.numbers
    assert n["fit_max_model_len"] == 8064  # vLLM's own estimate still wins
    assert n["kv_bytes_per_token"] == 131_072
    assert n["fp8_kv_fits"] is False  # 4 GiB needed, fp8 makes it 2, 0.98 available
    assert n["fit_tp_size"] == 4  # 8 KV heads over 4 GPUs: 1 GiB per GPU for 32,768 tokens


def test_cache_oom_fit_from_the_config_when_vllm_gives_no_estimate(run, tmp_path):
    """An older V1 message without "the estimated maximum model length": the config's bytes per
    token and the available memory give (blocks - 1) x block size."""
    text = (LAB / "cache-oom-boundary.log").read_text()
    cut = text.replace("Based on the available memory, the estimated maximum model length is 8064.", "")
    log = tmp_path / "boundary.log"
    log.write_text(cut)
    without = run(log).diagnoses[0].numbers  # only proportional: 8,192 x 0.98 / 1.0 GiB, in blocks
    assert without["fit_from"] == "needed vs available memory"
    assert without["fit_max_model_len"] == int(8192 * 0.98 / 1.0) // 128 * 128
    n = run(log, options=Options(model=WIDE)).diagnoses[0].numbers
    assert n["fit_from"] == "model config" and n["block_size"] == 128
    assert n["fit_max_model_len"] == (int(0.98 * 2**30 // (131_072 * 128)) - 1) * 128


def test_tp_divisibility_lists_valid_sizes_from_the_config(run):
    """The bare AssertionError about KV heads says nothing of the model; its config does."""
    top = run(
        LAB / "tp-divisibility-kv-heads.log", options=Options(model=str(CONFIGS / "lab-tiny-llama-h6kv4"))
    ).diagnoses[0]
    assert top.category == "tp-divisibility"
    assert top.numbers["valid_tp_sizes"] == [1, 2]
    assert top.numbers["num_kv_heads"] == 4
    assert "KV heads (4)" in top.summary and "valid sizes: 1, 2." in top.summary


def test_context_exceeds_max_and_rope_scaling(run):
    top = run(LAB / "context-exceeds-max.log", options=Options(model=str(CONFIGS / "lab-tiny-llama"))).diagnoses[0]
    assert top.category == "context-exceeds-max"
    n = top.numbers
    assert n["suggested_max_model_len"] == 2048
    assert n["rope_override_reasonable"] is False  # no rope scaling: trained to 2,048 tokens
    assert n["rope_factor_needed"] == 2
    assert json.loads(n["rope_hf_overrides"])["rope_scaling"] == {
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 2048}  # fmt: skip


def test_rope_advice_per_scaling_kind():
    from vllm_doctor.knowledge.checks import rope_advice

    llama31 = shape("llama-3.1-8b")
    already = rope_advice(llama31, 262144, 131072)
    assert already["rope_override_reasonable"] is False and "already counted" in already["rope_note"]
    dynamic = shape_from_config({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
                                 "max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2.0}})  # fmt: skip
    assert rope_advice(dynamic, 16384, 8192)["rope_override_reasonable"] is True
    gpt2 = shape_from_config({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 64, "n_positions": 1024})
    assert "not rotary" in rope_advice(gpt2, 2048, 1024)["rope_note"]
    assert "rope_override_reasonable" not in rope_advice(llama31, 8192, 131072)  # not over: nothing to advise


def test_sliding_window_sequences_hold_only_the_window():
    mistral = shape("mistral-7b-v0.1")  # every layer keeps a 4,096-token window
    per_layer_token = 131_072 // 32
    assert cap.sequence_bytes(mistral, 2, 1, 32768, 16) == per_layer_token * 32 * (4096 // 16 + 1) * 16
    llama = shape("llama-3-8b")  # no window: the whole sequence
    assert cap.sequence_bytes(llama, 2, 1, 8192, 16) == 131_072 * 8192
    gemma3 = shape("gemma-3-27b")  # 52 window layers, 10 full
    per = 507_904 // 62
    assert cap.sequence_bytes(gemma3, 2, 1, 32768, 16) == per * (10 * 32768 + 52 * (1024 + 16))


def test_lists_of_sizes_say_none_when_empty():
    assert cap.fmt_list([1, 2, 4]) == "1, 2, 4"
    assert cap.fmt_list([]) == "none"
