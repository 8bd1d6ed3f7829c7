"""Issue 38: vLLM as its own oracle (preflight/oracle.py). Without vLLM here the check says it could
not run and the others answer alone; vLLM's refusal, as the real vLLM 0.32 CPU build printed it
(tests/e2e/test_check_asks_vllm.py asks it for real), is the start's first blocker, named as explain
names the same message; argparse's refusal names the argument."""

from __future__ import annotations

import sys

from vllm_doctor.preflight import oracle
from vllm_doctor.preflight.args import parse
from vllm_doctor.preflight.run import preflight

UTILIZATION = (  # vLLM 0.32.0 (CPU) on --gpu-memory-utilization 1.5, as its config construction raised it
    "1 validation error for CacheConfig\ngpu_memory_utilization\n  Input should be less than or equal to 1 "
    "[type=less_than_equal, input_value=1.5, input_type=float]\n    For further information visit "
    "https://errors.pydantic.dev/2.14/v/less_than_equal"
)
DTYPE = (
    "argument --dtype: invalid choice: 'int8' (choose from 'auto', 'bfloat16', 'float', 'float16', 'float32', 'half')"
)


def test_a_python_without_vllm_gives_no_answer_and_the_checks_go_on(tmp_path):
    answer = oracle.ask(["/m"], sys.executable, timeout=120)
    assert not answer.ok and answer.failed and "cannot import vLLM's CLI" in answer.failed
    assert oracle.findings(answer) == []
    fake = tmp_path / "vllm"  # a `vllm` whose interpreter is this one (which has no vllm)
    fake.write_text(f"#!{sys.executable}\nimport sys\n")
    assert oracle.python_of(str(fake)) == sys.executable
    report = preflight(parse(["/m", "--max-model-len", "2048"], env={}), only=["vllm_config", "port"], ask_vllm=True,
                       vllm_bin=str(fake), no_gpu=True)  # fmt: skip
    skipped = report.facts["preflight"]["skipped"]
    assert "no answer" in skipped["vllm_config"] and "cannot import" in skipped["vllm_config"]
    assert "port" in report.facts["preflight"]["ran"]


def test_vllms_refusal_is_the_first_blocker_named_as_explain_names_it():
    answer = oracle.Answer("/venv/bin/python", False, "0.32.0", "cpu", "ValidationError", UTILIZATION)
    [f] = oracle.findings(answer)
    assert f.severity == "blocker" and f.category == "config-validation" and f.rule == "check-vllm-refuses"
    assert f.summary.startswith("vLLM 0.32.0 refuses it (ValidationError): 1 validation error for CacheConfig")
    assert "outside (0, 1]" in f.title and f.fixes and "--gpu-memory-utilization" in f.fixes[0].action


def test_an_unnamed_refusal_keeps_vllms_words_and_argparse_names_the_argument():
    [f] = oracle.findings(oracle.Answer("p", False, "0.32.0", "cpu", "RuntimeError", "zq9 nothing any rule knows"))
    assert f.rule == "check-vllm-refuses" and "zq9 nothing any rule knows" in f.summary and f.fixes
    [g] = oracle.findings(oracle.Answer("p", False, "0.32.0", "cpu", "usage", DTYPE))
    assert g.rule == "check-vllm-refuses-arguments" and "invalid choice: 'int8'" in g.summary
    assert oracle.findings(oracle.Answer("p", True, "0.32.0", "cpu")) == []
    said = oracle.Answer("p", False, "0.32.0", "cpu", "usage", DTYPE).said
    assert said.startswith("asked vLLM 0.32.0 (cpu, p): refuses it: argument --dtype")
