"""The corrected command (knowledge/command.py): the log's serve line with the top fix applied."""

from __future__ import annotations

import json
import shlex

from conftest import FIXTURES, LAB
from vllm_doctor.data import FixOut
from vllm_doctor.facts import Facts
from vllm_doctor.knowledge.command import apply, arguments
from vllm_doctor.render import render

V1_ERROR = (
    "ERROR 04-06 12:01:05 [core.py:386] ValueError: To serve at least one request with the models's max seq len "
    "(131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (9.87 GiB). "
    "Based on the available memory, the estimated maximum model length is 80864. Try increasing "
    "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.\n"
)
SECRET = "sk-live-0123456789abcdef"


def test_lab_recording_gets_its_own_command_with_the_length_that_starts(run):
    """cache-fits.log started at 8064: the fix rebuilt onto cache-oom.log's own arguments."""
    report = run(LAB / "cache-oom.log")
    c = report.corrected
    assert c is not None and (c.rule, c.fix, c.change) == ("kv-cache-too-small-for-max-len", 1, "--max-model-len 8064")
    # the KV space the log shows (Explicitly set 1.0 GiB) goes in front: the line runs as pasted
    assert (
        c.line
        == "VLLM_CPU_KVCACHE_SPACE=1 vllm serve /models/wide-llama --host 127.0.0.1 --port 8111 --max-model-len 8064"
    )
    assert shlex.split(c.line)[1:4] == ["vllm", "serve", "/models/wide-llama"]


def test_pasted_command_over_several_lines_with_its_secret_as_a_variable(run, tmp_path):
    log = tmp_path / "pasted.log"
    log.write_text(
        f"$ vllm serve meta-llama/Llama-3.1-8B-Instruct --api-key {SECRET} \\\n"
        "    --max-model-len 131072 --enforce-eager \\\n"
        "    --gpu-memory-utilization 0.7\n" + V1_ERROR
    )
    report = run(log)
    assert report.corrected is not None
    words = shlex.split(report.corrected.line)
    assert words[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert words[words.index("--max-model-len") + 1] == "80864" and words.count("--max-model-len") == 1
    assert "--enforce-eager" in words and words[words.index("--gpu-memory-utilization") + 1] == "0.7"
    text, md = render(report, "text"), render(report, "markdown")
    data = json.loads(render(report, "json"))
    assert "Corrected command (fix 1" in text and "--max-model-len 80864" in text
    assert "```sh\nvllm serve meta-llama/Llama-3.1-8B-Instruct" in md
    assert data["corrected_command"]["change"] == "--max-model-len 80864"
    # the line runs as pasted: the key is the variable vLLM reads, never the value nor a mask
    assert words[words.index("--api-key") + 1] == "$VLLM_API_KEY"
    for out in (text, md, data["corrected_command"]["line"]):
        assert SECRET not in out and '--api-key "$VLLM_API_KEY"' in out
    assert "[REDACTED]" not in data["corrected_command"]["line"]


def test_no_command_in_the_log_no_corrected_command(run):
    log = FIXTURES / "logs" / "cache-oom" / "0.9.2_kv-check-frame-message-cut.log"
    report = run(log)
    assert report.diagnoses and report.corrected is None
    assert json.loads(render(report, "json"))["corrected_command"] is None
    assert "Corrected command" not in render(report, "text") + render(report, "markdown")


def test_non_default_args_dict_becomes_flags():
    facts = Facts()
    facts.set_args("{'model_tag': 'Qwen/Qwen3-8B', 'model': 'Qwen/Qwen3-8B', 'max_model_len': 32768, "
                   "'enable_prefix_caching': False, 'trust_remote_code': True, 'served_model_name': ['a b'], "
                   "'hf_overrides': {'rope_scaling': {'factor': 4.0}}, 'quantization': None}", 2)  # fmt: skip
    model, items = arguments(facts)
    assert model == "Qwen/Qwen3-8B"
    assert items == [
        ("--max-model-len", "32768"),
        ("--no-enable-prefix-caching", None),
        ("--trust-remote-code", None),
        ("--served-model-name", "'a b'"),
        ("--hf-overrides", '\'{"rope_scaling": {"factor": 4.0}}\''),
    ]
    on = apply(items, FixOut(1, "Enable it", "--enable-prefix-caching", None, "w", "enable"))
    assert ("--no-enable-prefix-caching", None) not in on and on[-1] == ("--enable-prefix-caching", None)


def test_namespace_dump_rebuilds_nothing():
    """A Namespace lists every argument with its default: no command is made from it."""
    facts = Facts()
    facts.set_args("Namespace(host=None, port=8000, model='m', max_model_len=None)", 1)
    assert arguments(facts) is None


def test_the_model_line_names_heads_and_kv_heads_apart(run):
    from vllm_doctor.knowledge.contract import Options

    log = FIXTURES / "logs" / "cache-oom" / "0.8.3_v1-1m-needed-rounds-to-available.log"
    text = render(
        run(log, options=Options(config=str(FIXTURES / "configs" / "qwen2.5-7b" / "config.json"))), "text", verbosity=1
    )
    text = " ".join(text.split())  # as one paragraph: the terminal wraps it
    assert "28 layers, 28 attention heads, 4 KV heads, head dim 128" in text and "KV heads of" not in text


def test_short_and_underscored_flags_are_replaced_not_doubled():
    facts = Facts()
    facts.set_args("--model m -tp 2 --max_model_len=4096 --enforce-eager", 1)
    model, items = arguments(facts)
    assert model == "m" and items == [
        ("--tensor-parallel-size", "2"),
        ("--max-model-len", "4096"),
        ("--enforce-eager", None),
    ]
    fixed = apply(items, FixOut(1, "Use 4", "--tensor-parallel-size", "4", "w", "raise"))
    assert fixed[0] == ("--tensor-parallel-size", "4") and len(fixed) == 3


def test_the_cpu_backends_tp_fix_carries_the_binding_the_log_ran_with(run):
    """The lab's tp-divisibility-vocab start (CPU backend) ran with VLLM_CPU_OMP_THREADS_BIND=nobind
    (its OpenMP block says so): the corrected TP 2 carries it, and the text rendering keeps the word
    an assignment (its name unquoted)."""
    report = run(LAB / "tp-divisibility-vocab.log")
    words = shlex.split(report.corrected.line)
    assert words[words.index("--tensor-parallel-size") + 1] == "2"
    assert words[:3] == ["VLLM_CPU_OMP_THREADS_BIND=nobind", "vllm", "serve"]
    text = render(report, "text")
    assert "    VLLM_CPU_OMP_THREADS_BIND=" in text and "'VLLM_CPU_OMP_THREADS_BIND=" not in text


def test_the_tp_fix_of_a_log_that_prints_no_cpus_binds_nothing_and_says_why(run):
    """tp-divisibility fails before any worker prints its CPUs: no bind string can be cut from the
    log's host (this machine's CPUs are not its), so the command turns the binding off and says so."""
    report = run(LAB / "tp-divisibility.log")
    words = shlex.split(report.corrected.line)
    assert words[:3] == ["VLLM_CPU_OMP_THREADS_BIND=nobind", "vllm", "serve"], words
    assert "the log prints no CPUs of its host" in report.corrected.change


def _getter(values):
    return lambda *names: next((values[n] for n in names if values.get(n) is not None), None)


def test_the_bind_string_is_cut_from_the_logs_host_not_this_machine(monkeypatch):
    """The log's "Reducing Torch threads from 8" (or its OpenMP core ids) sizes the bind string; this
    machine's CPU count (faked to 64) does not."""
    import os

    from vllm_doctor.knowledge import startask

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(64)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    eight = _getter({"device": "cpu", "cpu.torch_threads": 8, "allowed": "0"})
    assert startask.fix_env(eight, {}, "--tensor-parallel-size", "2", 2) == {startask.BIND: "0-3|4-7"}
    ids = _getter({"device": "cpu", "cpu.core_ids": "0, 1, 2", "cpu.reserved_cpus": "3"})
    assert startask.log_cpus(ids) == 4
    unknown = _getter({"device": "cpu"})
    assert startask.log_cpus(unknown) is None
    assert startask.fix_env(unknown, {}, "--tensor-parallel-size", "2", 2) == {startask.BIND: "nobind"}
    assert "no CPUs of its host" in startask.bind_note(unknown, {startask.BIND: "nobind"}, 2)


def _facts_of(path):
    from vllm_doctor.knowledge import rulebook
    from vllm_doctor.knowledge.lifetimes import Lifetimes
    from vllm_doctor.matching.engine import Engine
    from vllm_doctor.read import logread

    engine, router = Engine(rulebook.load()), Lifetimes()
    engine.run(logread.read([str(path)], engine.prefilter, logread.ReadStats()), Facts(), router)
    [life] = router.lives()
    return life.facts


def test_an_excerpt_of_the_openmp_block_alone_is_the_cpu_backend(tmp_path):
    """Only the CPU backend prints its OpenMP binding block: an excerpt without the banner says it."""
    block = (LAB / "cache-fits.log").read_text().splitlines()[18:23]
    assert "OpenMP thread binding info" in block[0]
    log = tmp_path / "excerpt.log"
    log.write_text("\n".join(block) + "\n")
    facts = _facts_of(log)
    assert facts.get("device") == "cpu" and facts.get("cpu.core_ids") == "0" and facts.get("cpu.reserved_cpus") == "1"


def test_a_lab_log_says_its_hosts_cpus():
    """cache-oom ran on the lab's 2-CPU host: "Reducing Torch threads from 2", core ids [0], reserved [1]."""
    from vllm_doctor.knowledge import startask

    facts = _facts_of(LAB / "cache-oom.log")
    assert startask.log_cpus(facts.get) == 2
    assert facts.get("cpu.omp_threads_bind") == "auto" and facts.get("device") == "cpu"
