"""prompt_budget: V0's prompt limit is the per-step token budget or --max-model-len, by the numbers."""

from __future__ import annotations

from vllm_doctor.data import Evidence, Match, Rule
from vllm_doctor.facts import Facts
from vllm_doctor.knowledge.checks import CHECKS, CheckInput, Options

V0 = "WARNING 06-11 09:12:44 scheduler.py:1091] Input prompt (5000 tokens) is too long and exceeds limit of 4096"


def budget(values: dict, text: str = V0):
    match = Match(Rule("r", "diagnosis", "t", "e", "r.toml"), [Evidence(1, text)])
    return CHECKS["prompt_budget"](CheckInput(dict(values), Facts(), match, Options())).values


def test_a_limit_below_max_model_len_is_the_token_budget():
    assert budget({"limit": 4096, "max_model_len": 32768}) == {
        "limit_is_budget": True, "limit_is_max_model_len": False, "budget_tokens": 4096}  # fmt: skip
    assert budget({"limit": 8192, "max_model_len": 8192})["limit_is_budget"] is False
    assert budget({"limit": 4096, "max_num_batched_tokens": 4096})["limit_is_budget"] is True
    assert budget({"limit": 4096})["limit_is_budget"] is False  # nothing says: the old reading


def test_other_wordings_always_name_max_model_len():
    text = "ValueError: The decoder prompt (length 40001) is longer than the maximum model length of 32768."
    assert budget({"limit": 32768, "max_model_len": 65536}, text) == {"limit_is_budget": False}


def queue(sample: dict, **values):
    facts = Facts()
    facts.stats.add(sample, 5, 0, "stats")
    return CHECKS["queue_kind"](CheckInput(dict(values), facts, None, Options()))


def test_one_sample_is_decided_at_low_confidence_when_it_is_all_there_is():
    waiting = {"running": 3, "waiting": 2, "kv_usage_pct": 3.1, "gen_tps": 40.0, "prompt_tps": 10.0}
    r = queue(waiting, enable_lora=True)
    assert r.values["queue_kind"] == "deferred" and r.confidence == "low"
    assert queue(waiting, max_num_seqs=64).values["queue_kind"] == "batch-limit"
    assert queue(waiting).values["queue_kind"] == "sequence-cap"
    assert queue(waiting, max_num_seqs=3).confidence is None  # at the stated cap: proven
    assert queue({**waiting, "running": 0}).values["queue_kind"] == "stall"
    assert "queue_kind" not in queue({**waiting, "waiting": 0}).values


def test_a_lone_waiting_sample_among_many_is_a_blip():
    facts = Facts()
    for i, waiting in enumerate((0, 2, 0, 0)):
        facts.stats.add({"running": 3, "waiting": waiting, "kv_usage_pct": 5.0, "gen_tps": 40.0}, i, 0, "s")
    assert "queue_kind" not in CHECKS["queue_kind"](CheckInput({}, facts, None, Options())).values
