"""The checks that read the startup phases (Facts.phases): where in startup an out-of-memory
error came (the weights, before the cache was sized, beside the sized cache), and whether a line
came during a shutdown."""

from __future__ import annotations

from vllm_doctor.facts import CACHE_PHASES, LIFE_PHASES, WEIGHT_PHASES
from vllm_doctor.knowledge.contract import CheckInput, CheckResult, check

_OOM_WORDS = {"graph_capture": "while capturing CUDA graphs", "kv_cache_sized": "after the KV cache was sized"}


@check(reads=set(), returns={"oom_phase", "oom_phase_name", "oom_when"})  # reads the startup phases (facts.phases)
def oom_phase(inp: CheckInput) -> CheckResult:
    """Whether an out-of-memory error came while loading weights or after (profiling, cache, graphs)."""
    match = inp.match
    if match is None:
        return CheckResult()
    phase = None
    sized = False  # the cache's size was printed before it: what failed came beside the cache
    where = match.evidence[0].source if match.evidence else 0
    for line, source, name, _process in inp.facts.phases:
        if source == where and line <= match.first_line and name not in LIFE_PHASES:
            phase = name  # the latest phase that began before the error
            sized = sized or name == "kv_cache_sized"
    if sized and phase != "graph_capture":
        phase = "kv_cache_sized"  # a warm-up's profiling frames (a sampler run) come after the size line
    if phase in WEIGHT_PHASES:
        return CheckResult({"oom_phase": "weights", "oom_phase_name": phase})
    if phase in CACHE_PHASES:
        out = {"oom_phase": "cache", "oom_phase_name": phase}
        return CheckResult(out | ({"oom_when": _OOM_WORDS[phase]} if phase in _OOM_WORDS else {}))
    return CheckResult({"oom_phase": "unknown"}, confidence="low")


@check(reads=set(), returns={"during_shutdown", "shutdown_completed"})  # reads the phases (facts.phases)
def shutdown(inp: CheckInput) -> CheckResult:
    """Whether the matched line came during a shutdown, and whether the shutdown finished."""
    at = inp.match.first_line if inp.match else 0
    started = any(name == "shutdown_started" and line < at for line, _s, name, _p in inp.facts.phases)
    done = any(name == "shutdown_complete" and line > at for line, _s, name, _p in inp.facts.phases)
    return CheckResult({"during_shutdown": started, "shutdown_completed": done})
