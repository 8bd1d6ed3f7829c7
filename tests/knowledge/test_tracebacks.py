"""The traceback checks: the failure a server did not survive, and where it was raised."""

from __future__ import annotations

from vllm_doctor.data import Diagnosis, Evidence, Line
from vllm_doctor.facts import Facts
from vllm_doctor.knowledge.checks import CHECKS, CheckInput, Options
from vllm_doctor.knowledge.diagnose import rank
from vllm_doctor.knowledge.tracebacks import module_of, search_text

KV = "/usr/local/lib/python3.12/dist-packages/vllm/v1/core/kv_cache_utils.py"


def record(facts: Facts, no: int, level: str | None = "ERROR", **fields) -> None:
    facts.add_sample("traceback", fields, Line(no, "", "", level=level, process="EngineCore_DP0"), f"line {no}")


def site(facts: Facts):
    return CHECKS["failure_site"](CheckInput({}, facts, None, Options()))


def test_module_of_site_packages_checkout_and_other_packages():
    assert module_of(KV) == "vllm.v1.core.kv_cache_utils"
    assert module_of("/home/me/src/vllm/vllm/engine/llm_engine.py") == "vllm.engine.llm_engine"
    assert module_of("/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py") == "torch.nn.modules.module"


def test_a_bare_assertion_is_named_with_its_assert_and_raising_frame():
    facts = Facts()
    record(facts, 3, fatal="Traceback (most recent call last)")
    record(facts, 4, file="/x/vllm/v1/engine/core.py", lineno=158, function="_initialize_kv_caches", code="x = f()")
    record(facts, 6, file=KV, lineno=1082, function="get_kv_cache_config", code="assert a == b")
    record(facts, 8, exc_type="AssertionError")
    v = site(facts).values
    assert v["failure_found"] is True and v["exc_type"] == "AssertionError" and v["exc_message"] == "assert a == b"
    assert v["raised_at"] == "vllm.v1.core.kv_cache_utils.get_kv_cache_config" and v["exc_lineno"] == 1082
    assert v["search_url"].startswith("https://github.com/vllm-project/vllm/issues?q=AssertionError")


def test_the_innermost_vllm_frame_raised_not_torch():
    facts = Facts()
    record(facts, 1, file=KV, lineno=10, function="check", code="y = torch.empty(n)")
    record(facts, 3, file="/x/site-packages/torch/cuda/memory.py", lineno=5, function="empty", code="z")
    record(facts, 5, exc_type="RuntimeError", exc_message="boom 123")
    v = site(facts).values
    assert v["exc_function"] == "check" and v["exc_message"] == "boom 123"
    assert "123" not in v["search_text"]


def test_errors_it_survived_or_logged_below_error_or_during_shutdown_are_no_failure():
    facts = Facts()
    record(facts, 2, exc_type="ValueError", exc_message="optional file")
    facts.phases.append((5, 0, "ready", None))
    record(facts, 6, level="WARNING", exc_type="ImportError", exc_message="optional module")
    facts.phases.append((8, 0, "shutdown_started", None))
    record(facts, 9, exc_type="RuntimeError", exc_message="cannot schedule new futures after shutdown")
    assert site(facts).values == {"failure_found": False}


def test_an_error_it_served_through_is_no_failure():
    facts = Facts()
    facts.phases.append((1, 0, "ready", None))
    record(facts, 5, exc_type="TypeError", exc_message="bad request")
    facts.stats.add({"running": 1, "waiting": 0}, 9, 0, "stats")
    assert site(facts).values["failure_found"] is False


def test_search_text_drops_numbers_and_paths():
    assert search_text("ValueError", "size 3584 of /x/y.bin is wrong", "f", "m") == "ValueError f size of is wrong"


def _d(rule: str, severity: str, line: int, *, wrapper=False, fallback=False) -> Diagnosis:
    return Diagnosis(rule, rule, severity, "low", "t", "s", "e", [Evidence(line, "x")], {}, [],
                     wrapper=wrapper, fallback=fallback, priority=-10 if fallback else 50)  # fmt: skip


def test_the_fallback_yields_to_a_cause_or_a_rule_on_its_line_not_to_a_wrapper():
    fb = _d("unrecognised-failure", "blocker", 8, wrapper=True, fallback=True)
    assert [d.rule for d in rank([fb, _d("cause", "blocker", 2)])] == ["cause"]
    assert [d.rule for d in rank([fb, _d("request", "warning", 8)])] == ["request"]
    assert [d.rule for d in rank([fb, _d("other", "warning", 3)])] == ["unrecognised-failure", "other"]
    engine = _d("engine-dead", "blocker", 9, wrapper=True)
    engine.priority = 0
    assert [d.rule for d in rank([fb, engine])] == ["engine-dead", "unrecognised-failure"]


def hub(**groups):
    return CHECKS["hub_target"](CheckInput(groups, Facts(), None, Options())).values


def test_hub_target_says_repo_revision_or_file():
    assert hub(kind="Entry Not Found", repo="o/r", revision="main", file="config.json")["missing"] == "file"
    assert hub(kind="Revision Not Found", repo="o/r", revision="v2.0")["hub_missing"] == "revision v2.0 in o/r"
    assert hub(kind="Repository Not Found", repo="o/r.", revision="main")["hub_missing"] == "repo o/r"
    plain = "404 Client Error: Not Found"
    assert hub(kind=plain, repo="o/r", revision="v0.4", file="config.json")["missing"] == "revision"
    assert hub(kind=plain, repo="o/r", revision="main", file="config.json")["missing"] == "repo"
    assert hub(kind=plain, repo="o/r", revision="main", file="tokenizer.json")["missing"] == "file"


def test_a_traceback_raised_in_a_signal_handler_or_ignored_by_python_is_teardown_not_failure():
    facts = Facts()
    facts.phases.append((1, 0, "ready", None))
    record(facts, 3, fatal="Traceback (most recent call last)")
    record(facts, 4, file="/x/vllm/scripts.py", lineno=41, function="serve", code="uvloop.run(run_server(args))")
    record(facts, 6, file="/x/vllm/entrypoints/openai/api_server.py", lineno=623, function="signal_handler",
           code='raise KeyboardInterrupt("terminated")')  # fmt: skip
    record(facts, 10, level=None, teardown="Exception ignored in")
    record(facts, 11, level=None, fatal="Traceback (most recent call last)")
    record(facts, 12, level=None, file="/x/vllm/custom_all_reduce.py", lineno=321, function="__del__", code="close()")
    record(facts, 14, level=None, exc_type="TypeError", exc_message="'NoneType' object is not callable")
    assert site(facts).values == {"failure_found": False}
    record(facts, 30, exc_type="RuntimeError", exc_message="CUDA error: an illegal memory access was encountered")
    assert site(facts).values["exc_type"] == "RuntimeError"  # a failure after the teardown's traceback still is one
