"""The JSON contract (schema vllm-doctor/report/1) that automation relies on."""

from __future__ import annotations

import json

import pytest

from conftest import LAB
from vllm_doctor.render.json import render as to_json
from vllm_doctor.render.json import to_dict

FACT_KEYS = {"vllm_version", "model", "max_model_len", "tensor_parallel_size", "gpu_memory_utilization",
             "num_attention_heads", "weights_gib", "kv_cache", "stats"}  # fmt: skip
KV_KEYS = {"gpu_blocks", "cpu_blocks", "block_size", "tokens", "max_concurrency", "concurrency_tokens",
           "available_gib", "estimated_max_model_len"}  # fmt: skip
STATS_KEYS = {"samples", "running_max", "waiting_max", "kv_usage_max_pct", "preemptions"}


@pytest.mark.parametrize(
    "name", ["cache-oom.log", "healthy.log", "queue-saturation.log", "request-too-long.http-1.json"]
)
def test_contract_keys_and_types(run, name):
    data = json.loads(to_json(run(LAB / name)))
    assert data["schema"] == "vllm-doctor/report/1"
    assert data["input"]["paths"] == [str(LAB / name)] and isinstance(data["input"]["lines"], int)
    assert data["status"] in {"failed", "degraded", "healthy", "unknown"}
    assert set(data["facts"]) >= FACT_KEYS
    assert set(data["facts"]["kv_cache"]) >= KV_KEYS
    assert set(data["facts"]["stats"]) >= STATS_KEYS
    for d in data["diagnoses"]:
        assert {"rule", "category", "severity", "confidence", "summary", "evidence", "numbers", "fixes"} <= set(d)
        assert d["severity"] in {"blocker", "warning", "info"}
        assert d["confidence"] in {"high", "medium", "low"}
        for e in d["evidence"]:
            assert isinstance(e["line"], int) and isinstance(e["text"], str)
        assert [f["rank"] for f in d["fixes"]] == list(range(1, len(d["fixes"]) + 1))
        for f in d["fixes"]:
            assert {"rank", "action", "flag", "value", "why"} <= set(f)


def test_most_important_first(run):
    data = to_dict(run(LAB / "queue-saturation.log"))
    order = {"blocker": 0, "warning": 1, "info": 2}
    ranks = [order[d["severity"]] for d in data["diagnoses"]]
    assert ranks == sorted(ranks)


def test_unknown_facts_are_null_not_guessed(run, tmp_path):
    log = tmp_path / "x.log"
    log.write_text("ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).\n")
    data = to_dict(run(log))
    assert data["facts"]["vllm_version"] is None
    assert data["facts"]["kv_cache"]["tokens"] is None
    assert data["facts"]["num_attention_heads"] == 40


def test_evidence_line_numbers_point_at_the_original_lines(run):
    data = to_dict(run(LAB / "cache-oom.log"))
    lines = (LAB / "cache-oom.log").read_bytes().decode().split("\n")  # numbered as grep -n does
    for e in data["diagnoses"][0]["evidence"]:
        assert e["text"][:60] in lines[e["line"] - 1]
