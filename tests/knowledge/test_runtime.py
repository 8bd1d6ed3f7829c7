"""The --long-prefill-token-threshold value of the prefill-stalls-decode fix: from the window's
prompt lengths only where it caps something, and held by fixcheck like every fix."""

from __future__ import annotations

from vllm_doctor.knowledge.fixcheck import refuse
from vllm_doctor.knowledge.runtime import _long_prefill_threshold

LENGTHS = {"count": 40, "median_le": 1000, "over_median": 12}
FLAG = "--long-prefill-token-threshold"


def test_the_median_bucket_caps_the_longer_prompts():
    got = _long_prefill_threshold(LENGTHS, None, None)
    assert got == {"long_prefill_to_try": 1000, "prompt_count": 40, "prompts_over_threshold": 12}
    assert _long_prefill_threshold(LENGTHS, 2048, 0)["long_prefill_to_try"] == 1000  # 0 is vLLM's "no cap"
    assert _long_prefill_threshold(LENGTHS, 2048, 1500)["long_prefill_to_try"] == 1000


def test_no_value_where_it_would_cap_nothing():
    assert _long_prefill_threshold(None, None, None) == {}  # no prompt finished in the window
    assert _long_prefill_threshold({**LENGTHS, "over_median": 0}, None, None) == {}  # no prompt longer
    assert _long_prefill_threshold(LENGTHS, 1000, None) == {}  # the step budget caps at it already
    assert _long_prefill_threshold(LENGTHS, None, 800) == {}  # a lower threshold is set already
    assert _long_prefill_threshold({**LENGTHS, "median_le": 200}, None, None) == {}  # pieces too small


def test_fixcheck_refuses_the_threshold_already_set():
    assert refuse(FLAG, "set", "1000", {"long_prefill_token_threshold": 1000}) is not None
    assert refuse(FLAG, "set", "1000", {"long_prefill_token_threshold": 0}) is None
