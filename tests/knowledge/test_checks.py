"""Each named check: one input -> output, and the declared contract held over every fixture."""

from __future__ import annotations

import pytest

from conftest import FIXTURES, LAB
from vllm_doctor.data import Evidence, Match, Rule
from vllm_doctor.facts import PHASES, Facts, fact_names
from vllm_doctor.knowledge import contract
from vllm_doctor.knowledge.checks import CHECKS, CheckInput, Options


def run(name: str, values: dict | None = None, facts: Facts | None = None, match: Match | None = None, **options):
    return CHECKS[name](CheckInput(dict(values or {}), facts or Facts(), match, Options(**options)))


def at(line: int) -> Match:
    return Match(Rule("r", "diagnosis", "t", "e", "r.toml"), [Evidence(line, "x")], {}, 1, line)


def test_kv_fit_from_the_blocks_vllm_printed():
    r = run("kv_fit", {"gpu_blocks": 505, "block_size": 16, "engine": "V1", "gpu_memory_utilization": 0.8,
                       "needed_gib": 16.0, "available_gib": 9.87, "memory.total_gib": 80.0})  # fmt: skip
    assert r.values["fit_max_model_len"] == 504 * 16
    assert r.values["missing_gib"] == 6.13 and r.values["fp8_kv_fits"] is True
    assert r.values["utilization_needed"] == 0.88 and r.values["can_raise_utilization"] is True


def test_kv_fit_utilization_needed_is_not_rounded_up_by_float_noise():
    """4% of the card missing at 0.8: 0.8 + 0.04 is 0.8400000000000001 in floats, and 0.84 is enough."""
    r = run("kv_fit", {"gpu_blocks": 505, "block_size": 16, "engine": "V1", "gpu_memory_utilization": 0.8,
                       "needed_gib": 14.0, "available_gib": 10.0, "memory.total_gib": 100.0})  # fmt: skip
    assert r.values["utilization_needed"] == 0.84 and r.values["utilization_needed_unsafe"] is False


def test_tp_sizes_lists_the_divisors():
    r = run("tp_sizes", {"heads": 40, "tp": 3})
    assert r.values == {"valid_tp_sizes": [1, 2, 4, 5, 8], "tp_below": 2, "tp_above": 4}


def test_context_limit_suggests_the_derived_maximum():
    r = run("context_limit", {"derived_max_model_len": 32768.0, "requested_max_model_len": 65536})
    assert r.values == {"suggested_max_model_len": 32768, "over_by": 32768}


def test_request_limit():
    assert run("request_limit", {"limit": 4096, "prompt_tokens": 4000, "total_tokens": 4200}).values == {
        "over_by": 104,
        "max_tokens_allowed": 96,
    }


def test_queue_kind_finds_a_full_cache_and_brings_the_stats_lines_as_evidence():
    facts = Facts()
    for i, (waiting, kv) in enumerate([(5, 95.0), (8, 99.0)], 1):
        facts.stats.add({"running": 30, "waiting": waiting, "kv_usage_pct": kv}, i, 0, f"stats {i}")
    r = run("queue_kind", facts=facts)
    assert r.values["queue_kind"] == "cache-full" and r.values["waiting_max"] == 8
    assert [e.text for e in r.evidence] == ["stats 1", "stats 2"] and r.confidence is None


def test_queue_kind_lowers_the_confidence_of_a_guess():
    facts = Facts()
    for i, running in enumerate([30, 41], 1):
        facts.stats.add({"running": running, "waiting": 6, "kv_usage_pct": 40.0}, i, 0, "s")
    r = run("queue_kind", facts=facts)
    assert r.values["queue_kind"] == "batch-limit" and r.confidence == "medium"


def test_oom_phase_reads_the_latest_phase_before_the_error():
    facts = Facts()
    facts.phases.extend([(3, 0, "weights_loading", None), (9, 0, "profiling", None)])
    assert run("oom_phase", facts=facts, match=at(5)).values == {
        "oom_phase": "weights",
        "oom_phase_name": "weights_loading",
    }
    assert run("oom_phase", facts=facts, match=at(12)).values["oom_phase"] == "cache"
    unknown = run("oom_phase", facts=Facts(), match=at(12))
    assert unknown.values == {"oom_phase": "unknown"} and unknown.confidence == "low"


def test_gpu_headroom():
    assert run("gpu_headroom", {"free_gib": 40.0, "total_gib": 80.0}).values == {
        "held_by_others_gib": 40.0,
        "suggested_utilization": 0.48,
    }


def test_shutdown():
    facts = Facts()
    facts.phases.append((4, 0, "shutdown_started", None))
    assert run("shutdown", facts=facts, match=at(6)).values == {"during_shutdown": True, "shutdown_completed": False}


def test_concurrency_budget_with_a_target():
    r = run("concurrency_budget", {"kv_cache.tokens": 100_000, "max_model_len": 8192}, target_concurrency=20)
    assert r.values["worst_case_sequences"] == 12 and r.values["can_hold_target"] is False
    assert r.values["missing_tokens"] == 20 * 8192 - 100_000 and r.values["target_max_model_len"] == 4992


def test_a_printed_concurrency_that_is_no_number_is_no_figure():
    """A mangled "Maximum concurrency ... 111...1x" (400 digits: float reads inf) leaves the budget
    to tokens / length, and raises nothing (bench/fuzz.py, seed 7, found the OverflowError)."""
    values = {"kv_cache.tokens": 100_000, "max_model_len": 8192}
    assert (
        run("concurrency_budget", {**values, "kv_cache.max_concurrency": float("1" * 400)}).values[
            "worst_case_sequences"
        ]
        == 12
    )
    assert run("concurrency_budget", {**values, "kv_cache.max_concurrency": 13.5}).values["worst_case_sequences"] == 13


def test_the_phases_the_checks_read_are_the_declared_ones():
    from vllm_doctor.facts import CACHE_PHASES, LIFE_PHASES, SHUTDOWN_PHASES, WEIGHT_PHASES

    assert CACHE_PHASES | WEIGHT_PHASES | SHUTDOWN_PHASES | LIFE_PHASES == PHASES and "sampler_warmup" not in PHASES


def test_oom_phase_skips_the_lifetime_phases():
    """A server_start or ready mark is where a lifetime stands, not a startup step an OOM can come in."""
    facts = Facts()
    facts.phases.extend([(2, 0, "weights_loading", None), (3, 0, "ready", None)])
    assert run("oom_phase", facts=facts, match=at(5)).values["oom_phase"] == "weights"


def _inputs():
    return sorted(p for p in (FIXTURES / "logs").rglob("*") if p.is_file() and ".expect." not in p.name) + sorted(
        LAB.glob("*.log")
    )


def _shared_gpu():
    """This machine's snapshot as NVML and /proc would give it with two vLLM servers on GPU 0."""
    from vllm_doctor.capacity.gpu import GpuDevice, GpuProcess, GpuSnapshot

    procs = [GpuProcess(11, "python3", 30000, 11, "a", 0.6), GpuProcess(12, "python3", 30000, 12, "b", 0.9)]
    return GpuSnapshot(True, None, [GpuDevice(0, "NVIDIA A100-SXM4-80GB", 81920, 60000, 21920, procs)])


SHARED = _shared_gpu()


def _lab_window() -> Facts:
    """The facts of the lab's saturated scrape series (fixtures/lab/queue-saturation.metrics-*.txt)."""
    from vllm_doctor.cli.fleet import replica_numbers
    from vllm_doctor.read import metrics

    paths = sorted(LAB.glob("queue-saturation.metrics-*.txt"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    busy = [metrics.parse(p.read_text(), str(p), at=10.0 * i) for i, p in enumerate(paths)]
    idle = [metrics.parse((LAB / "healthy.metrics-1.txt").read_text(), "idle", at=10.0 * i) for i in range(2)]
    facts = metrics.to_facts(busy)
    facts.window["fleet"] = [
        replica_numbers(n, s, metrics.to_facts(s).stats) for n, s in (("busy", busy), ("idle", idle))
    ]
    return facts


def test_every_check_keeps_to_its_declaration_on_every_fixture(rules, monkeypatch):
    """Every check over every fixture's facts, with each diagnosis match's groups: under STRICT a
    name read or returned that the check does not declare raises."""
    from vllm_doctor.matching.engine import Engine
    from vllm_doctor.pipeline import _derive
    from vllm_doctor.read import logread

    monkeypatch.setattr(contract, "STRICT", True)
    engine = Engine(rules)
    seen: dict[str, set[str]] = {name: set() for name in CHECKS}
    runs: list[tuple[Facts, dict]] = []
    for path in _inputs():
        facts = Facts()
        try:
            matches = engine.run(logread.read([str(path)], engine.prefilter, logread.ReadStats()), facts)
        except logread.ReadError:
            continue
        _derive(facts)
        runs.append((facts, matches))
    runs.append((_lab_window(), {}))  # the runtime checks read a scrape series' window
    for facts, matches in runs:
        for match in [None, *matches.values()]:
            values = {**facts.flat(), **(match.groups if match else {})}
            for name, check in CHECKS.items():
                try:
                    result = check(
                        CheckInput(dict(values), facts, match, Options(target_concurrency=8, gpu_snapshot=SHARED))
                    )
                except (ArithmeticError, ValueError, TypeError) as e:
                    if isinstance(e, contract.CheckContractError):
                        raise
                    continue
                seen[name] |= result.values.keys()
    for name, got in seen.items():
        assert got, f"{name} returned nothing on any fixture"
        assert got <= CHECKS[name].returns


def test_declared_names_do_not_shadow_facts_they_do_not_mean():
    """A check may return a fact's name only to fill it in (tp_sizes' num_attention_heads from the
    model's config), never as something else: those overlaps are listed here on purpose."""
    overlaps = {n: sorted(c.returns & fact_names()) for n, c in CHECKS.items() if c.returns & fact_names()}
    assert overlaps == {
        "tp_sizes": ["num_attention_heads", "num_kv_heads"],
        "context_limit": ["derived_max_model_len", "max_len_key"],
        "concurrency_budget": ["max_model_len"],
    }


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_every_check_is_documented(name):
    assert CHECKS[name].doc and CHECKS[name].returns


def test_kv_fit_names_vllms_figures_when_they_contradict_its_own_check():
    """vLLM raises only when needed > available (bytes, both printed at 0.01 GiB): a message with
    needed below available was edited; no longest length is derived from it."""
    r = run("kv_fit", {"needed_gib": 53.94, "available_gib": 54.63, "max_model_len": 1010000, "engine": "V1"})
    assert "fit_max_model_len" not in r.values and "missing_gib" not in r.values
    assert "53.94 GiB needed and 54.63 GiB available" in r.values["fit_disagreement"]
    assert r.values["arithmetic_max_len"] >= 1010000 and r.confidence == "medium"


def test_kv_fit_below_the_length_states_it_and_trusts_it():
    r = run("kv_fit", {"needed_gib": 53.94, "available_gib": 52.87, "max_model_len": 1010000, "engine": "V1"})
    assert r.values["fit_max_model_len"] == 1010000 * 52.87 / 53.94 // 16 * 16 and r.confidence is None
    assert "fit_disagreement" not in r.values and r.values["missing_gib"] == 1.07


def test_log_names_tells_a_repo_from_a_directory_and_a_release_from_a_build():
    def names(model=None, version=None):
        return run("log_names", {"model": model, "vllm_version": version}).values

    assert names("meta-llama/Llama-3.1-8B-Instruct") == {"model_repo": "meta-llama/Llama-3.1-8B-Instruct"}
    assert names("/models/qwen2-7b/") == {"model_dir": "/models/qwen2-7b"}
    assert names("./llama") == {"model_dir": "./llama"}
    assert names("org/model.gguf") == {}  # a file, not a repo: nothing to download by that name
    assert names("a/b/c") == names("gpt2") == names() == {}  # neither said plainly: left to the fallback
    assert names(version="0.6.3.post1") == {"vllm_release": "0.6.3.post1"}
    assert names(version="0.8.0rc1") == {"vllm_release": "0.8.0rc1"}
    assert names(version="0.7.1.dev12+g1234abc") == names(version="0.9.2+cpu") == {}
