"""The fix check (knowledge/fixcheck.py): no fix that contradicts the log's numbers is shown."""

from __future__ import annotations

import tomllib

import pytest

from conftest import FIXTURES, LAB
from vllm_doctor.capacity.modelcfg import load as load_model
from vllm_doctor.knowledge.contract import Options
from vllm_doctor.knowledge.fixcheck import refuse

LOGS = sorted(p for p in (FIXTURES / "logs").rglob("*") if p.is_file() and not p.name.endswith(".expect.toml"))
ALL = LOGS + sorted(LAB.glob("*.log"))


def _options(log) -> Options | None:
    expect = log.parent / (log.name.split(".log")[0] + ".expect.toml")
    if expect.is_file():
        want = tomllib.loads(expect.read_text())
        if "config" in want:
            return Options(config=str(FIXTURES / "configs" / want["config"] / "config.json"))
    return None


def _num(x):
    try:
        return float(str(x).replace(",", ""))
    except (TypeError, ValueError):
        return None


def _violations(report) -> list[str]:
    """Each emitted fix against the report's own facts, written out apart from fixcheck."""
    facts = report.facts
    out = []
    for d in report.diagnoses:
        for f in d.fixes:
            if not f.flag:
                continue
            name = f.flag.lstrip("-").replace("-", "_")
            now = d.numbers.get("tp") if f.flag == "--tensor-parallel-size" else None
            now = now if now is not None else d.numbers.get(name, facts.get(name))
            new, old = _num(f.value), _num(now)
            where = f"{d.rule}: {f.action!r} (current {now})"
            if new is not None and old is not None:
                if f.direction == "lower" and not new < old or f.direction == "raise" and not new > old:
                    out.append(where)
                if new == old:
                    out.append(where + " changes nothing")
            if f.flag == "--gpu-memory-utilization" and (new is not None and new > 0.95):
                out.append(where + " past 0.95")
            if f.flag == "--gpu-memory-utilization" and (
                facts.get("kv_cache_memory_bytes") or facts.get("cpu_kvcache_space")
            ):
                out.append(where + " beside an explicit KV space")
            if d.category == "queue-saturation" and f.flag == "--max-model-len" and f.direction == "lower":
                out.append(where + " for a full paged cache")
    return out


@pytest.mark.parametrize("log", ALL, ids=[f"{p.parent.name}/{p.name}" for p in ALL])
def test_no_emitted_fix_contradicts_the_numbers(log, run):
    report = run(log, options=_options(log))
    assert not _violations(report)


def test_the_1m_model_is_not_told_to_lower_its_length_to_itself_or_above(run):
    """Found by hand: "Lower --max-model-len to 1022912" for a server at 1,010,000. vLLM's figures
    round to the same 53.94 GiB: the ratio "fits" 1,010,000, with the config 1,009,984 from a rounded
    budget; neither is stated as the longest length nor offered as a value to lower to."""
    log = FIXTURES / "logs" / "cache-oom" / "0.8.3_v1-1m-needed-rounds-to-available.log"
    config = Options(config=str(FIXTURES / "configs" / "qwen2.5-7b" / "config.json"))
    for options in (None, config):
        top = run(log, options=options).diagnoses[0]
        assert top.numbers["max_model_len"] == 1_010_000 and "fit_max_model_len" not in top.numbers
        assert top.numbers["arithmetic_max_len"] >= 1_009_984  # the arithmetic's figure, kept apart
        lowers = [f for f in top.fixes if f.flag == "--max-model-len"]
        assert [f.value for f in lowers] == [None]  # the valueless variant
        assert top.severity == "blocker" and top.confidence == "medium"


def test_every_flag_fix_of_the_built_in_rules_says_what_it_does(rules):
    missing = [(r.id, f.action) for r in rules for f in r.fixes if f.flag and not f.direction]
    assert not missing


@pytest.mark.parametrize(
    ("flag", "direction", "value", "values", "why"),
    [
        ("--max-model-len", "lower", "1022912", {"max_model_len": 1010000}, "not below"),
        ("--max-model-len", "lower", "8064", {"max_model_len": 8064}, "already"),
        ("--max-num-batched-tokens", "raise", "4096", {"max_num_batched_tokens": 8192}, "not above"),
        ("--gpu-memory-utilization", "raise", "0.97", {"gpu_memory_utilization": 0.9}, "past 0.95"),
        ("--gpu-memory-utilization", "raise", None, {"gpu_memory_utilization": 0.95}, "ceiling"),
        ("--gpu-memory-utilization", "raise", "0.9", {"gpu_memory_utilization": 0.5, "kv_cache_memory_bytes": 1 << 30},
         "set explicitly"),
        ("--gpu-memory-utilization", "lower", "0.4", {"cpu_kvcache_space": 4}, "set explicitly"),
        ("--gpu-memory-utilization", "lower", "0.4", {"gpu_memory_utilization": 0.9, "device": "cpu"}, "CPU backend"),
        ("--gpu-memory-utilization", "set", "1.2", {"gpu_memory_utilization": 1.5, "device": "cpu"}, "past 0.95"),
        ("--tensor-parallel-size", "set", "2", {"tp": 2}, "already"),
        ("--tensor-parallel-size", "raise", "3", {"tp": 2, "num_attention_heads": 32, "num_kv_heads": 8}, "divide"),
        ("--tensor-parallel-size", "raise", "16", {"tp": 8, "num_attention_heads": 32, "num_kv_heads": 12}, "divide"),
        ("--kv-cache-dtype", "set", "fp8", {"kv_cache_dtype": "fp8"}, "already"),
        ("--enforce-eager", "enable", None, {"enforce_eager": True}, "on already"),
    ],
)  # fmt: skip
def test_refused(flag, direction, value, values, why):
    assert why in (refuse(flag, direction, value, values) or "")


@pytest.mark.parametrize(
    ("flag", "direction", "value", "values"),
    [
        ("--max-model-len", "lower", "8064", {"max_model_len": 8192}),
        ("--max-model-len", "lower", None, {"max_model_len": 8192}),  # no number to hold it to
        ("--max-model-len", "lower", "4096", {}),  # the current value is unknown: nothing contradicts it
        ("--gpu-memory-utilization", "raise", "0.9", {"gpu_memory_utilization": 0.8}),
        ("--tensor-parallel-size", "raise", "4", {"tp": 2, "num_attention_heads": 32, "num_kv_heads": 2}),  # KV heads replicated
        ("--kv-cache-dtype", "set", "fp8", {"kv_cache_dtype": "auto"}),
        # vLLM refuses a utilization outside (0, 1] on the CPU backend too: a fraction is its fix
        ("--gpu-memory-utilization", "set", "0.9", {"gpu_memory_utilization": 1.5, "device": "cpu"}),
        (None, None, None, {}),
    ],
)  # fmt: skip
def test_accepted(flag, direction, value, values):
    assert refuse(flag, direction, value, values) is None


def test_queue_fixes_never_shorten_the_maximum_length():
    why = refuse("--max-model-len", "lower", None, {"max_model_len": 32768}, category="queue-saturation")
    assert why and "reserves nothing" in why


def test_target_fixes_never_go_below_target_len():
    assert "below --target-len 8192" in (refuse("--max-model-len", "lower", "4992", {"max_model_len": 16384},
                                                target_len=8192) or "")  # fmt: skip
    assert refuse("--max-model-len", "lower", "8192", {"max_model_len": 16384}, target_len=8192) is None


def test_tp_divides_the_model_heads_from_its_config():
    shape, _note = load_model(None, str(FIXTURES / "configs" / "llama-3-8b" / "config.json"), offline=True)
    assert "divide" in (refuse("--tensor-parallel-size", "raise", "3", {"tp": 1}, shape=shape) or "")
    assert refuse("--tensor-parallel-size", "raise", "2", {"tp": 1}, shape=shape) is None


def test_kv_capacity_target_gives_more_cache_not_a_shorter_length(run):
    log = LAB / "queue-saturation.log"
    report = run(log, options=Options(target_concurrency=64, target_len=4096))
    kv = next(d for d in report.diagnoses if d.rule == "kv-capacity")
    assert kv.numbers["can_hold_target"] is False
    assert [f.flag for f in kv.fixes] == ["--kv-cache-dtype"]


def test_an_explicit_kv_space_drops_the_utilization_fixes(run):
    """The lab's CPU recording sets VLLM_CPU_KVCACHE_SPACE=1 ("Explicitly set (1.0/10.59) GiB for KV
    cache"): the utilization does not size that cache, so no fix moves it."""
    top = run(LAB / "cache-oom.log").diagnoses[0]
    assert top.rule == "kv-cache-too-small-for-max-len"
    assert "--gpu-memory-utilization" not in [f.flag for f in top.fixes]
    assert any("set explicitly (kv_cache.explicit_gib)" in why for _a, why in top.dropped)


def test_a_config_that_is_not_the_served_model_gives_no_longest_length(run):
    """Mistral-7B's config for the Qwen 1M log: 123.29 GiB for one sequence where vLLM says 53.94,
    so the config's 433,088 tokens are not offered; vLLM's two figures are the ones named."""
    log = FIXTURES / "logs" / "cache-oom" / "0.8.3_v1-kv-cache-needed-gib.log"
    top = run(log, options=Options(config=str(FIXTURES / "configs" / "mistral-7b-v0.1" / "config.json"))).diagnoses[0]
    assert "fit_max_model_len" not in top.numbers and top.confidence == "medium" and top.severity == "blocker"
    assert "by vLLM's own figures it needs 53.94 GiB of KV cache and 52.87 GiB is available" in top.summary
    assert "gives 123.29 GiB for one sequence where vLLM says 53.94 GiB" in top.summary
    assert [f.value for f in top.fixes if f.flag == "--max-model-len"] == [None]
    assert "fit_tp_size" not in top.numbers  # nor a TP size from that config
    same = run(log, options=Options(config=str(FIXTURES / "configs" / "qwen2.5-7b" / "config.json"))).diagnoses[0]
    assert same.numbers["fit_max_model_len"] == 989_952 < 1_010_000 and same.confidence == "high"  # the right config


def test_a_report_never_raises_and_lowers_the_same_flag():
    """Two diagnoses, one raising --max-num-seqs and one lowering it: the higher-ranked keeps its
    direction, the other's fix is dropped with the reason and the ranks close up."""
    from vllm_doctor.data import Diagnosis, FixOut
    from vllm_doctor.knowledge.diagnose import reconcile

    def d(rule: str, *fixes: FixOut) -> Diagnosis:
        return Diagnosis(rule, "queue", "warning", "high", rule, "", "", [], {}, list(fixes))

    first = d("queue-sequence-cap", FixOut(1, "Raise --max-num-seqs above 2", "--max-num-seqs", "4", "", "raise"))
    second = d("decode-latency", FixOut(1, "Lower --max-num-seqs", "--max-num-seqs", None, "", "lower"),
               FixOut(2, "Lower --max-num-batched-tokens", "--max-num-batched-tokens", None, "", "lower"))  # fmt: skip
    out = reconcile([first, second])
    assert [f.action for f in out[0].fixes] == ["Raise --max-num-seqs above 2"]
    assert [(f.rank, f.flag) for f in out[1].fixes] == [(1, "--max-num-batched-tokens")]
    assert out[1].dropped == [
        ("Lower --max-num-seqs", "queue-sequence-cap ranks first and says raise --max-num-seqs: one direction is kept")
    ]


LLAMA31 = FIXTURES / "configs" / "llama-3.1-8b" / "config.json"


def test_a_gpu_tp_fix_is_asked_again_with_the_cache_the_split_leaves(run):
    """Llama-3.1-8B at 131,072 tokens, 9.87 GiB of cache left beside 14.99 GiB of weights: TP 2 frees
    half the weights per GPU, less 0.5 GiB of non-torch memory, and halves the KV heads per GPU;
    the re-ask with those numbers passes and the fix shows them."""
    log = FIXTURES / "logs" / "cache-oom" / "0.14.0_v1-kv-cache-format-gib.log"
    report = run(log, options=Options(config=str(LLAMA31)))
    [tp] = [f for f in report.diagnoses[0].fixes if f.flag == "--tensor-parallel-size"]
    assert tp.value == "2" and "Re-checked" in tp.why and "8.0 of 16.87 GiB" in tp.why, tp.why


def test_a_gpu_tp_fix_the_split_cache_cannot_hold_is_refused():
    """1 GiB of cache beside 0.5 GiB of weights per GPU: TP 2 frees 0.25 GiB and its NCCL buffers
    take 0.5, so one 131,072-token sequence (8 GiB at TP 2) still does not fit."""
    shape, _note = load_model(None, str(LLAMA31), offline=True)
    values = {"available_gib": 1.0, "weights_gib": 0.5, "max_model_len": 131072, "tensor_parallel_size": 1}
    why = refuse("--tensor-parallel-size", "raise", "2", values, shape=shape)
    assert why and "still does not start" in why and "0.76 GiB is available" in why, (
        why
    )  # 1.0 + 0.25 - 0.5, at the edge of its rounding


def test_a_tp_fix_that_cannot_be_asked_says_what_it_assumes(run):
    """No config.json: the TP fix is from the heads the log states; its text says what it takes on trust."""
    report = run(FIXTURES / "logs" / "tp-divisibility" / "0.10.1_attention-heads-pydantic-value-error.log")
    first = report.diagnoses[0].fixes[0]
    assert first.flag == "--tensor-parallel-size" and "Not re-checked for the cache: no model config" in first.why
    assert "it assumes 2 GPUs each with this one's memory" in first.why


def test_a_count_that_is_no_number_refuses_nothing():
    """A mangled line's 5000-digit "dimension" (no number: it stays text) is no reason to refuse
    a TP fix, nor a traceback (bench/fuzz.py found it)."""
    from vllm_doctor.knowledge.fixcheck import _tp

    assert _tp(2, {"dimension": "7" * 5000, "heads": "x"}, None) is None
    assert _tp(2, {"dimension": "33"}, None) == "--tensor-parallel-size 2 does not divide the dimension 33"
