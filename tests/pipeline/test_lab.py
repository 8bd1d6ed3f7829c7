"""Every real vLLM recording from the lab (fixtures/lab, from ../shared/vllm-lab) is diagnosed
right, with the facts its cases.jsonl states."""

from __future__ import annotations

import json

import pytest

from conftest import LAB
from vllm_doctor.render.json import to_dict

MAIN = {"cache-oom", "tp-divisibility", "context-exceeds-max", "queue-saturation"}
FACT_PATHS = {
    "kv_cache_tokens": ("kv_cache", "tokens"),
    "max_concurrency": ("kv_cache", "max_concurrency"),
    "max_concurrency_at_len": ("kv_cache", "concurrency_tokens"),
    "max_model_len": ("max_model_len",),
    "tensor_parallel_size": ("tensor_parallel_size",),
    "num_attention_heads": ("num_attention_heads",),
    "waiting_max": ("stats", "waiting_max"),
    "kv_usage_max_pct": ("stats", "kv_usage_max_pct"),
}
CASES = [json.loads(line) for line in (LAB / "cases.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_lab_case(case, run):
    report = to_dict(run(LAB / case["file"]))
    top = next((d for d in report["diagnoses"] if d["severity"] in ("blocker", "warning")), None)
    got = top["category"] if top else "healthy"
    want = case["category"]
    if want.startswith("other:"):
        assert got not in MAIN | {"healthy"}, got
        assert got == want.split(":", 1)[1], "the lab's slug"
    else:
        assert got == want
    for key, value in case["facts"].items():
        node = report["facts"]
        for part in FACT_PATHS[key]:
            node = node[part]
        assert node == pytest.approx(value, rel=0.011), key


def test_cache_oom_gives_the_length_that_starts(run):
    """The wide model: 8192 fails (cache-oom-boundary), 8064 starts (cache-fits)."""
    for name in ("cache-oom.log", "cache-oom-boundary.log"):
        top = run(LAB / name).diagnoses[0]
        assert top.category == "cache-oom"
        assert top.numbers["fit_max_model_len"] == 8064
        assert (top.fixes[0].flag, top.fixes[0].value) == ("--max-model-len", "8064")


def test_wrapper_error_is_context_not_cause(run):
    top = run(LAB / "cache-oom.log").diagnoses[0]
    assert top.rule == "kv-cache-too-small-for-max-len"
    assert any("Engine core initialization failed" in e.text for e in top.context)


def test_a_full_cache_on_the_cpu_backend_is_fixed_by_its_kv_space_first(run):
    """The lab's CPU server queues on a 1 GiB VLLM_CPU_KVCACHE_SPACE: that space is its cache, so
    the first fix is to raise it (a GPU server's first is fp8 KV: see the fixture expectations)."""
    (top, *_) = to_dict(run(LAB / "queue-saturation.log"))["diagnoses"]
    assert top["rule"] == "queue-cache-full"
    assert top["fixes"][0]["action"] == "Give the cache more memory: raise VLLM_CPU_KVCACHE_SPACE above 1 GiB"
