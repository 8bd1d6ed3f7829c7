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
    assert queue({**waiting, "running": 0, "prompt_tps": 0.0}).values["queue_kind"] == "stall"
    assert queue({**waiting, "running": 0}).values["queue_kind"] == "batch-limit"  # prompts processed: no stall
    assert "queue_kind" not in queue({**waiting, "waiting": 0}).values


def test_a_lone_waiting_sample_among_many_is_a_blip():
    facts = Facts()
    for i, waiting in enumerate((0, 2, 0, 0)):
        facts.stats.add({"running": 3, "waiting": waiting, "kv_usage_pct": 5.0, "gen_tps": 40.0}, i, 0, "s")
    assert "queue_kind" not in CHECKS["queue_kind"](CheckInput({}, facts, None, Options())).values


def series(samples, **values):
    facts = Facts()
    for i, sample in enumerate(samples):
        facts.stats.add(sample, i, 0, "s")
    return CHECKS["queue_kind"](CheckInput(dict(values), facts, None, Options())).values


CHAT = {"running": 9, "waiting": 0, "kv_usage_pct": 12.0, "prompt_tps": 800.0, "gen_tps": 400.0}
EMBED = {"running": 0, "waiting": 0, "kv_usage_pct": 0.0, "prompt_tps": 9000.0, "gen_tps": 0.0}


def backlog(sample: dict, waiting: dict[int, int], n: int = 300) -> list[dict]:
    return [{**sample, "waiting": waiting.get(i, 0)} for i in range(n)]


def test_a_momentary_backlog_in_hundreds_of_samples_is_no_queue():
    """Issue 39 (5): 1-2 requests in 1-3 samples of hundreds, in a row or apart, generic or pooling."""
    for moment in ({150: 1, 151: 2, 152: 1}, {40: 2}, {10: 1, 200: 2}):
        assert "queue_kind" not in series(backlog(CHAT, moment))
        assert "queue_kind" not in series(backlog(CHAT, moment), max_num_seqs=256)
        assert "queue_kind" not in series(backlog(EMBED, moment), pooling_task="embed")
        assert "queue_kind" not in series(backlog(EMBED, moment))


def test_a_backlog_lasts_by_its_run_its_share_or_its_size():
    assert series(backlog(CHAT, dict.fromkeys(range(100, 104), 1)))["queue_kind"] == "sequence-cap"  # 4 in a row
    assert series(backlog(CHAT, dict.fromkeys(range(0, 300, 9), 1)))["queue_kind"] == "sequence-cap"  # 1 in 9
    assert series(backlog(CHAT, {150: 80}), max_num_seqs=256)["queue_kind"] == "sequence-cap"  # a third of the cap
    assert "queue_kind" not in series(backlog(CHAT, {150: 20}), max_num_seqs=256)  # a moment under the cap
    assert series(backlog(EMBED, dict.fromkeys(range(100, 140), 500)), pooling_task="embed")["queue_kind"] == "pooling"


def test_a_pooling_server_is_known_from_its_traffic():
    """Issue 39 (6): its start cut off, the route its clients call or no token generated names it."""
    waiting = backlog(EMBED, dict.fromkeys(range(20, 60), 300), 60)
    r = series(waiting, pooling_route="/v1/embeddings")
    assert r["queue_kind"] == "pooling" and "/v1/embeddings" in r["pooling_served"]
    assert r["pooling_prompts"] == "in every interval" and r["pooling_idle_stats"]
    r = series(waiting)
    assert r["queue_kind"] == "pooling" and "no token generated" in r["pooling_served"]
    generating = [*waiting[:-1], {**waiting[-1], "gen_tps": 3.0}]  # one interval generated: not pooling
    assert series(generating)["queue_kind"] == "batch-limit"  # prompts processed: never a stall
    assert series([{**s, "prompt_tps": 0.0} for s in generating])["queue_kind"] == "stall"


def test_the_pooling_summary_says_what_its_samples_show():
    quiet = {**EMBED, "prompt_tps": 0.0}
    samples = [*backlog(EMBED, dict.fromkeys(range(40), 300), 40), *backlog(quiet, {}, 10)]
    r = series(samples, pooling_task="embed")
    assert r["queue_kind"] == "pooling" and r["pooling_prompts"] == "in 40 of 50 intervals"
    busy = [{**s, "running": 2, "kv_usage_pct": 1.5} for s in samples]
    assert "pooling_idle_stats" not in series(busy, pooling_task="embed")
