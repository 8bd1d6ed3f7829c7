"""Reading vLLM's argument dumps and pasted command lines into facts."""

from __future__ import annotations

import pytest

from vllm_doctor.facts import Facts
from vllm_doctor.serveargs import parse_args


@pytest.mark.parametrize(
    ("blob", "expected", "complete"),
    [
        (
            "{'model_tag': 'Qwen/Qwen3-8B', 'max_model_len': 32768, 'tensor_parallel_size': 2, 'gpu_memory_utilization': 0.85}",
            {
                "model": "Qwen/Qwen3-8B",
                "max_model_len": 32768,
                "tensor_parallel_size": 2,
                "gpu_memory_utilization": 0.85,
            },
            True,
        ),
        (
            "Namespace(host=None, port=8000, model='meta-llama/Llama-2-7b-chat-hf', tensor_parallel_size=1, max_model_len=None, gpu_memory_utilization=0.9)",
            {
                "port": 8000,
                "model": "meta-llama/Llama-2-7b-chat-hf",
                "tensor_parallel_size": 1,
                "gpu_memory_utilization": 0.9,
            },  # fmt: skip
            False,
        ),
        (
            "model='Qwen/Qwen3-8B', dtype=torch.bfloat16, max_seq_len=32768, tensor_parallel_size=2, quantization=None, kv_cache_dtype=auto",
            {
                "model": "Qwen/Qwen3-8B",
                "dtype": "bfloat16",
                "max_model_len": 32768,
                "tensor_parallel_size": 2,
                "kv_cache_dtype": "auto",
            },
            False,
        ),
        (
            " --tensor-parallel-size 4 --max-model-len=32768 -pp 2 --enforce-eager",
            {"tensor_parallel_size": 4, "max_model_len": 32768, "pipeline_parallel_size": 2, "enforce_eager": True},
            False,
        ),
        ("{'model': 'x', 'max_model_len': 4096", {"model": "x", "max_model_len": 4096}, False),  # cut short
    ],
)
def test_parse_args(blob, expected, complete):
    got, was_complete = parse_args(blob)
    assert got == expected
    assert was_complete is complete


def test_a_complete_dict_implies_defaults_and_a_cut_one_does_not():
    f = Facts()
    f.set_args("{'model': 'm', 'max_model_len': 1024}", 3)
    assert f.get("tensor_parallel_size") == 1
    g = Facts()
    g.set_args("{'model': 'm', 'max_model_len': 1024", 3)
    assert g.get("tensor_parallel_size") is None


def test_literal_eval_never_runs_code():
    got, complete = parse_args("{'model': __import__('os').system('echo pwned')}")
    assert complete is False  # not a literal: read as text, never evaluated
    assert got == {"model": "__import__"}


def test_a_stats_line_with_garbage_numbers_is_read_without_crashing(run, tmp_path):
    """Found by bench/fuzz.py (seed 1): a mangled stats value arrived as text and was compared."""
    log = tmp_path / "x.log"
    log.write_text(
        "Engine 000: Running: 5 reqs, Waiting: 3 reqs, GPU KV cache usage: 9" + "9" * 400 + ".9%\n"
        "Engine 000: Running: 5 reqs, Waiting: " + "7" * 5000 + " reqs, GPU KV cache usage: 1e999%\n"
    )
    report = run(log)  # used to raise TypeError
    assert report.facts["stats"]["samples"] >= 1 and report.facts["stats"]["running_max"] == 5


def test_environment_style_arguments_are_read():
    from vllm_doctor.serveargs import parse_args

    assert parse_args("TENSOR_PARALLEL_SIZE=4")[0] == {"tensor_parallel_size": 4}
    assert parse_args("VLLM_MAX_MODEL_LEN='8192'")[0] == {"max_model_len": 8192}
    assert parse_args("MODEL_NAME=Qwen/Qwen2.5-7B")[0] == {"model": "Qwen/Qwen2.5-7B"}


def test_a_draft_models_max_length_does_not_replace_the_served_models():
    from vllm_doctor.facts import DRAFT

    facts = Facts()
    facts.set("max_model_len", 8192, 4)
    facts.set(DRAFT, "Qwen3NextMTP", 5)
    facts.set("max_model_len", 262144, 6)  # the draft config's own "Using max model len"
    assert facts.get("max_model_len") == 8192
    facts.set("max_model_len", 4096, 9)  # only the one line after the draft's architecture is the draft's
    assert facts.get("max_model_len") == 4096
    alone = Facts()  # nothing known before: the first length is the only one there is
    alone.set(DRAFT, "DeepSeekMTPModel", 1)
    alone.set("max_model_len", 163840, 2)
    assert alone.get("max_model_len") == 163840
