"""The `vllm serve` command line read as vLLM's argparse reads it, without importing vLLM: one
reader for every place that meets one (check's and serve's arguments, another server's
/proc/<pid>/cmdline, a command line pasted above a log).

Flags come as `--name value`, `--name=value` or the short -tp/-pp/-dp/-q; the switches that take
no value are listed, so a switch before the model does not swallow it; a negative number is a
value, not a flag; a shell continuation (`\\`) is skipped. The argument dumps vLLM prints
(`non-default args: {...}`, Namespace(...), an engine config line) are read here too: as facts
(parse_args), and a dict repr by the one dump_dict.
"""

from __future__ import annotations

import re
from typing import Any

SHORT = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size", "q": "quantization"}
# store_true / BooleanOptionalAction flags of `vllm serve` (and their --no- forms): they take no value
SWITCHES = {
    "trust_remote_code", "enforce_eager", "enable_prefix_caching", "enable_chunked_prefill", "disable_log_stats",
    "disable_log_requests", "enable_lora", "enable_auto_tool_choice", "disable_custom_all_reduce", "headless",
    "skip_tokenizer_init", "disable_frontend_multiprocessing", "enable_expert_parallel", "enable_log_requests",
    "disable_sliding_window", "disable_cascade_attn", "enable_sleep_mode", "async_scheduling", "disable_fastapi_docs",
    "enable_prompt_tokens_details", "enable_server_load_tracking", "enable_force_include_usage", "ssl_cert_reqs_none",
}  # fmt: skip
MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")
# the environment a vLLM server's start reads: what check keeps of it and serve's env.txt lists
ENV_PREFIXES = (
    "VLLM_",
    "CUDA_",
    "NCCL_",
    "HF_",
    "HUGGING_FACE_",
    "TORCH_",
    "PYTORCH_",
    "TRANSFORMERS_",
    "OMP_",
    "NVIDIA_",
)
ENV_NAMES = ("OPENAI_API_KEY", "LD_PRELOAD", "PYTHONUNBUFFERED")


def items(words: list[str]) -> tuple[str | None, list[tuple[str, str | None]]]:
    """(the positional model, [(flag name with underscores, its value or None for a switch)]) in
    the order given; `--model X` is left among the flags. A `--no-x` switch keeps its name."""
    model: str | None = None
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        token = words[i]
        i += 1
        if token in ("\\", "-", "--"):
            continue
        if not token.startswith("-") or _number(token):
            model = token if model is None else model
            continue
        name, eq, value = token.lstrip("-").partition("=")
        name = SHORT.get(name, name).replace("-", "_")
        if eq:
            out.append((name, value))
        elif name.removeprefix("no_") in SWITCHES:
            out.append((name, None))
        elif i < len(words) and (not words[i].startswith("-") or _number(words[i])):
            out.append((name, words[i]))
            i += 1
        else:
            out.append((name, None))
    return model, out


def server_words(argv: list[str]) -> list[str] | None:
    """The arguments after `vllm serve` (or `python -m vllm.entrypoints....api_server`) in a
    process's command line; None when it is not a vLLM server's."""
    for i, w in enumerate(argv[:8]):
        if w.rsplit("/", 1)[-1] == "vllm" and argv[i + 1 : i + 2] == ["serve"]:
            return argv[i + 2 :]
        if w in MODULES:
            return argv[i + 1 :]
    return None


def _number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


# The argument dumps vLLM prints (`non-default args: {...}`, `Namespace(...)`, an engine config
# line, a launcher's VAR=value lines): read as facts by parse_args, rebuilt into a serve line by
# knowledge/command.py; a dict repr is read by dump_dict alone.


# argument names in the dumps -> fact names
_ARG_FACTS = {
    "model": "model",
    "model_tag": "model",
    "model_name": "model",  # launchers' MODEL_NAME=
    "max_model_len": "max_model_len",
    "max_seq_len": "max_model_len",
    "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size",
    "data_parallel_size": "data_parallel_size",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "kv_cache_memory": "kv_cache_memory_bytes",
    "cpu_kvcache_space": "cpu_kvcache_space",  # VLLM_CPU_KVCACHE_SPACE=
    "block_size": "kv_cache.block_size",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "dtype": "dtype",
    "kv_cache_dtype": "kv_cache_dtype",
    "quantization": "quantization",
    "enable_lora": "enable_lora",
    "enable_prefix_caching": "enable_prefix_caching",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "long_prefill_token_threshold": "long_prefill_token_threshold",
    "enforce_eager": "enforce_eager",
    "scheduling_policy": "scheduling_policy",
    "trust_remote_code": "trust_remote_code",
    "disable_hybrid_kv_cache_manager": "disable_hybrid_kv_cache_manager",
    "device_config": "device",
    "port": "port",
    "tp": "tensor_parallel_size",  # -tp / -pp / -dp short flags of `vllm serve`
    "pp": "pipeline_parallel_size",
    "dp": "data_parallel_size",
}
# defaults vLLM applies when `non-default args` leaves an argument out
ARG_DEFAULTS = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1}

# a key starts where a word starts: a search restarting inside a 16 KiB run of word characters
# would try every suffix of it (quadratic); a match can only begin at the start anyway
_KV_PAIR = re.compile(r"""['"]?(?<!\w)(\w+)['"]?\s*[:=]\s*('[^']*'|"[^"]*"|[^,(){}\[\]]+)""")
# a command line: --tensor-parallel-size 2, --max-model-len=4096, -tp 2, --enforce-eager
_FLAG = re.compile(r"""(?:^|\s)--?([a-z][\w-]*)(?:[= ]+(?!-)("[^"]*"|'[^']*'|[^\s\\]+))?""")


def dump_dict(blob: str) -> dict | None:
    """A `{...}` argument dump as the dict it prints (literal_eval never runs code); None when it is
    not one, or is cut short."""
    import ast

    text = blob.strip()
    if not text.startswith("{"):
        return None
    try:
        parsed = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def parse_args(blob: str) -> tuple[dict[str, Any], bool]:
    """Known arguments from `non-default args: {...}`, `Namespace(...)` or an engine-config line.

    The flag is True for a whole `non-default args` dict: an argument it leaves out is at its
    default. A dump cut short (or any other form) proves nothing about absent arguments.
    """
    raw: dict[str, Any] = {}
    complete = False
    text = blob.strip()
    parsed = dump_dict(text)
    if parsed is not None:
        raw, complete = {str(k): v for k, v in parsed.items()}, True
    if not raw and text.startswith("-"):
        for m in _FLAG.finditer(text):
            raw.setdefault(m.group(1).replace("-", "_"), m.group(2) if m.group(2) is not None else "true")
    if not raw:
        for m in _KV_PAIR.finditer(text):
            raw.setdefault(m.group(1), m.group(2))
    from vllm_doctor.facts import FACTS, convert

    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = _ARG_FACTS.get(key) or _ARG_FACTS.get(key.lower().removeprefix("vllm_"))  # TENSOR_PARALLEL_SIZE=4
        if name is None:
            continue
        converted = convert(FACTS[name], value)
        if converted is not None:
            out.setdefault(name, converted)
    return out, complete
