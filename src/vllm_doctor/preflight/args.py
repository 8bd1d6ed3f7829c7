"""The `vllm serve` command line as it will be given (everything after `--`) and the environment it
will run in: the model, each flag's value, and the variables that change what vLLM does.

vLLM's own parser is not imported (that would import vLLM): flags are read the way argparse reads
them (`--name value`, `--name=value`, the short -tp/-pp/-dp/-q), with the switches that take no
value listed, so a switch before the model does not swallow it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

from vllm_doctor.errors import DoctorError

SHORT = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size", "q": "quantization"}
# store_true / BooleanOptionalAction flags of `vllm serve` (and their --no- forms): they take no value
SWITCHES = {
    "trust_remote_code", "enforce_eager", "enable_prefix_caching", "enable_chunked_prefill", "disable_log_stats",
    "disable_log_requests", "enable_lora", "enable_auto_tool_choice", "disable_custom_all_reduce", "headless",
    "skip_tokenizer_init", "disable_frontend_multiprocessing", "enable_expert_parallel", "enable_log_requests",
    "disable_sliding_window", "disable_cascade_attn", "enable_sleep_mode", "async_scheduling", "disable_fastapi_docs",
    "enable_prompt_tokens_details", "enable_server_load_tracking", "enable_force_include_usage", "ssl_cert_reqs_none",
}  # fmt: skip
# the variables that change a start, kept with the command in the report
ENV_PREFIXES = ("VLLM_", "HF_", "HUGGING_FACE_", "CUDA_VISIBLE_DEVICES", "TRANSFORMERS_", "NCCL_")
TRUE = ("1", "true", "yes", "on")


@dataclass
class ServeArgs:
    """One start: MODEL, its flags (names with underscores) and the environment."""

    argv: list[str]
    model: str | None
    flags: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def text(self, name: str) -> str | None:
        return self.flags.get(name)

    def on(self, name: str) -> bool:
        value = self.flags.get(name)
        return value is not None and value.lower() in TRUE

    def number(self, name: str, default: float | None = None) -> float | None:
        value = self.flags.get(name)
        if value is None:
            return default
        try:
            return float(value)
        except ValueError:
            raise DoctorError(f"--{name.replace('_', '-')} {value}: not a number") from None

    def integer(self, name: str, default: int | None = None) -> int | None:
        value = self.number(name)
        return default if value is None else int(value)

    @property
    def tp(self) -> int:
        return max(1, self.integer("tensor_parallel_size", 1) or 1)

    @property
    def pp(self) -> int:
        return max(1, self.integer("pipeline_parallel_size", 1) or 1)

    def env_number(self, name: str) -> float | None:
        """A numeric variable (VLLM_CPU_KVCACHE_SPACE=4); None when unset or empty."""
        value = self.env.get(name, "").strip()
        if not value:
            return None
        try:
            return float(value)
        except ValueError:
            raise DoctorError(f"{name}={value}: not a number") from None

    def env_on(self, name: str) -> bool:
        return self.env.get(name, "").strip().lower() in TRUE

    @property
    def command(self) -> str:
        return "vllm serve " + shlex.join(self.argv)


def parse(argv: list[str], env: dict[str, str] | None = None) -> ServeArgs:
    """`MODEL --flag value ...` as `vllm serve` reads it; the model may also be --model."""
    argv = list(argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv[:1] == ["serve"]:  # pasted with the subcommand: `vllm serve MODEL ...` minus `vllm`
        argv = argv[1:]
    flags: dict[str, str] = {}
    model: str | None = None
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("-") or _negative(token):
            model = token if model is None else model
            continue
        name, eq, value = token.lstrip("-").partition("=")
        name = SHORT.get(name, name).replace("-", "_")
        if eq:
            flags[name] = value
        elif name.removeprefix("no_") in SWITCHES:
            flags[name.removeprefix("no_")] = "false" if name.startswith("no_") else "true"
        elif i < len(argv) and (not argv[i].startswith("-") or _negative(argv[i])):
            flags[name] = argv[i]
            i += 1
        else:
            flags[name] = "true"
    model = flags.pop("model", None) or model
    source = os.environ if env is None else env
    kept = {k: v for k, v in source.items() if k.startswith(ENV_PREFIXES)}
    return ServeArgs(argv, model, flags, kept)


def _negative(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def from_cmdline(words: list[str]) -> ServeArgs | None:
    """Another process's command line, when it is a vLLM server: `vllm serve ...`, `python -m
    vllm.entrypoints.openai.api_server ...`; None otherwise."""
    for i, w in enumerate(words):
        if w.endswith("vllm") and words[i + 1 : i + 2] == ["serve"]:
            return parse(words[i + 2 :], env={})
        if w in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"):
            return parse(words[i + 1 :], env={})
    return None
