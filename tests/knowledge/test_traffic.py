"""prompt_budget: V0's prompt limit is the per-step token budget or --max-model-len, by the numbers."""

from __future__ import annotations

from vllm_doctor.data import Evidence, Match, Rule
from vllm_doctor.knowledge.checks import CHECKS, CheckInput, Options
from vllm_doctor.knowledge.facts import Facts

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
