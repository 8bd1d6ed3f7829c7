"""gpt-oss-120b and Gemma-3-27B, from their published config.json, sized as vLLM 0.32's V1 manager
sizes them on a GPU (the family formula is held to real vLLM in test_kv_families.py; here the
numbers are worked by hand from it, so a change in the code that moves them fails).

gpt-oss-120b: 36 layers alternating 128-token sliding and full attention, 8 KV heads, head dim
64, bf16 KV. One layer's 16-token page: 16 x 2 x 8 x 64 x 2 B = 32,768 B. 18 + 18 layers -> two
groups of 18, so P = 18 x 32,768 = 589,824 B per block. 16 GiB -> N = 17,179,869,184 // 589,824
= 29,127 blocks. At 131,072 tokens a request holds 8,192 full blocks plus, in the sliding group,
cdiv(127 + 16,384, 16) + 1 = 1,033 (window - 1 + two in-flight batches of 8,192, plus one block):
R = 9,225. Concurrency 29,127 / 9,225 = 3.16x; tokens int(3.15739... x 131,072) = 413,846; one
request needs 18 x 32,768 x 9,225 B = 5.07 GiB.

Gemma-3-27B: 62 layers, every 6th full (10 full, 52 sliding on 1,024), 16 KV heads, head dim 128.
Page 16 x 2 x 16 x 128 x 2 = 131,072 B; group size 10 (the smaller bucket): 6 sliding groups + 1
full, P = 1,310,720 B, and 16 GiB -> 13,107 blocks. At 131,072 tokens: 8,192 + 6 x (cdiv(1,023 +
16,384, 16) + 1 = 1,089) = 14,726 blocks per request -> 0.89x; the layers themselves need (10 x
8,192 + 52 x 1,089) x 131,072 B = 16.91 GiB > 16 GiB - P, and the longest that fits is 119,088.
"""

from __future__ import annotations

import json

from conftest import FIXTURES
from vllm_doctor.capacity import arithmetic as cap
from vllm_doctor.capacity import kvcache
from vllm_doctor.capacity.plan import PlanRequest, make_plan
from vllm_doctor.capacity.shape import shape_from_config

CONFIGS = FIXTURES / "configs"
GIB = 2**30
M = 2 * 8192  # vLLM 0.32 `vllm serve` on an 80 GB GPU: max_num_batched_tokens 8192, async scheduling


def shape(name):
    return shape_from_config(json.loads((CONFIGS / name / "config.json").read_text()))


def test_gpt_oss_120b_layers_and_bytes_per_token():
    s = shape("gpt-oss-120b")
    assert s.layer_plan is not None and (s.layer_plan.count("sliding"), s.layer_plan.count("full")) == (18, 18)
    assert cap.kv_bytes_per_token(s, 2) == 36_864  # the full-attention layers: 18 x 2 x 8 x 64 x 2
    assert "18 full-attention layers (of 36)" in cap.kv_formula(s, 2, "bfloat16")
    assert s.to_json(None)["layer_kinds"] == {"sliding": 18, "full": 18}
    assert shape("llama-3-8b").to_json(None)["layer_kinds"] is None


def test_gpt_oss_120b_as_v1_sizes_it():
    lay = kvcache.layout(shape("gpt-oss-120b"), 2.0)
    assert (len(lay.groups), lay.group_size, lay.page_bytes, lay.block_size) == (2, 18, 589_824, 16)
    got = kvcache.capacity(lay, 16 * GIB, 131_072, M)
    assert (got.num_blocks, got.blocks_per_request, f"{got.concurrency:.2f}") == (29_127, 9_225, "3.16")
    assert got.tokens == 413_846 and got.needed_gib == 5.07 and got.fits


def test_gemma_3_27b_as_v1_sizes_it():
    lay = kvcache.layout(shape("gemma-3-27b"), 2.0)
    assert (len(lay.groups), lay.group_size, lay.page_bytes) == (7, 10, 1_310_720)
    got = kvcache.capacity(lay, 16 * GIB, 131_072, M)
    assert (got.num_blocks, got.blocks_per_request, f"{got.concurrency:.2f}") == (13_107, 14_726, "0.89")
    assert (got.needed_gib, got.fits, got.estimated_max_len) == (16.91, False, 119_088)
    # the hybrid manager off (or V0): every layer keeps every token
    flat = kvcache.layout(shape("gemma-3-27b"), 2.0, hybrid_manager=False)
    assert kvcache.capacity(flat, 16 * GIB, 32_768, M).blocks_per_request == 2_048


def test_plan_headlines_are_v1s_numbers():
    """plan's tokens and sequences for both: the manager's, with no 'approximate' row."""
    for name, length in (("gpt-oss-120b", 131_072), ("gemma-3-27b", 32_768)):
        req = PlanRequest(models=[str(CONFIGS / name)], gpu_memory="80GiB", max_model_len=length, offline=True)
        m = make_plan(req).models[0]
        b = m.budget
        got = kvcache.capacity(kvcache.layout(m.shape, 2.0, b.tp), b.cache_bytes, length, M)  # at the serve line's TP
        assert (b.tokens, m.sequences) == (got.tokens, int(got.concurrency))
        steps = {s.name: s for s in m.steps}
        assert steps[f"6 blocks per request at {length:,}"].value == f"{got.blocks_per_request:,}"
        assert not any("approximate" in s.work for s in m.steps)
