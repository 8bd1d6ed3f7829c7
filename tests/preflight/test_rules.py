"""The preflight's rule files (rules/preflight/, kind "preflight"): each is triggered by a lab start
replayed in fixtures/preflight/ (its `rules`) or asserted by a test here, and each check's finding is
one of them."""

from __future__ import annotations

import tomllib
from pathlib import Path

from conftest import FIXTURES
from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.matching.loader import builtin_dir
from vllm_doctor.preflight import tables
from vllm_doctor.preflight.finding import found, rules

HERE = Path(__file__).parent


def _case_rules() -> set[str]:
    return {r for p in (FIXTURES / "preflight").glob("*.toml") for r in tomllib.loads(p.read_text())["rules"]}


def test_every_preflight_rule_is_triggered_by_a_case_or_a_test():
    """A rule without a trigger is not finished: a replayed start lists it, or a test asserts `rule == id`."""
    tests = "".join(p.read_text() for p in HERE.glob("test_*.py") if p.name != Path(__file__).name)
    missing = [r for r in sorted(rules()) if r not in _case_rules() and f'"{r}"' not in tests]
    assert missing == [], f"preflight rules no case or test triggers: {missing}"


def test_cases_name_only_preflight_rules():
    assert _case_rules() - set(rules()) == set()


def test_preflight_rules_live_in_rules_preflight_and_say_their_stage():
    assert len(rules()) >= 40
    for r in rules().values():
        assert Path(r.path).parent == builtin_dir() / "preflight" and r.id.startswith("check-"), r.path
        assert "priority" in tomllib.loads(Path(r.path).read_text()), r.path


def test_a_finding_is_rendered_from_its_rule():
    f = found("check-cache-oom-cpu", {"kv_cache_gib": 1, "kv_bytes_per_token": 131072.0, "block_size": 128,
              "blocks": 64, "max_model_len": 32768, "fit_max_model_len": 0, "needed_gib": 4.0},
              kv_formula="f", length_from="--max-model-len", needed_size="4.0 GiB", kvcache_space_needed=4.01,
              with_null_size="4.0 GiB")  # fmt: skip
    assert (f.category, f.severity, f.priority) == ("cache-oom", "blocker", 50)
    assert "131,072 B/token" in f.summary and "below --max-model-len 32,768" in f.summary
    # fit_max_model_len 0: the lower fix's `when` drops it, the other stays
    assert [(x.action, x.value) for x in f.fixes] == [("Set VLLM_CPU_KVCACHE_SPACE=4.01", "4.01")]


def test_the_tables_are_data():
    assert tables.min_capability("awq_marlin") == 80 and tables.min_capability("no-such") is None
    methods, version = tables.fallback_methods()
    assert version == "0.32.0" and "awq" in methods and len(methods) == 30
    assert set(tables.quantization()["online"]) <= set(methods) | {"bitsandbytes", "ptpc_fp8"}


def test_rules_check_holds_a_preflight_rule_to_its_names(tmp_path):
    from vllm_doctor.matching.loader import check_file

    path = tmp_path / "check-x.toml"
    path.write_text('id = "check-x"\nkind = "preflight"\ncategory = "shm"\nseverity = "info"\ntitle = "t"\n'
                    'explanation = "e"\nnames = ["a"]\nsummary = ["{a} and {b}"]\nanchors = ["abcd"]\n')  # fmt: skip
    _, problems = check_file(path, checks=CHECKS)
    said = sorted((p.key, p.message.split(":")[0]) for p in problems)
    assert ("anchors", "is for diagnosis and fact rules") in said and ("priority", "is missing") in said
    assert any(k == "summary" and "{b}" in m for k, m in ((p.key, p.message) for p in problems)), said
