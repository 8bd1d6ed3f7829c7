"""The `vllm serve` command line read as vLLM's argparse reads it, without importing vLLM: one
reader for every place that meets one (check's and serve's arguments, another server's
/proc/<pid>/cmdline, a command line pasted above a log).

Flags come as `--name value`, `--name=value` or the short -tp/-pp/-dp/-q; the switches that take
no value are listed, so a switch before the model does not swallow it; a negative number is a
value, not a flag; a shell continuation (`\\`) is skipped.
"""

from __future__ import annotations

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
