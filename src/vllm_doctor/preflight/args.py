"""The `vllm serve` command line as it will be given (everything after `--`) and the environment it
will run in: the model, each flag's value, and the variables that change what vLLM does.

vLLM's own parser is not imported (that would import vLLM): serveargs.py reads the flags as
argparse does.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

from vllm_doctor import serveargs
from vllm_doctor.errors import MAX_INT, MAX_TP, DoctorError, in_range

_PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")  # GPUs: at most MAX_TP
# the variables that change a start, kept with the command in the report
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

    def number(
        self, name: str, default: float | None = None, low: float = -MAX_INT, high: float = MAX_INT
    ) -> float | None:
        """The flag's value: finite and within `high` either way (nan, inf, 1e400: one line, not int()'s crash)."""
        value = self.flags.get(name)
        if value is None:
            return default
        flag = f"--{name.replace('_', '-')}"
        try:
            number = float(value)
        except ValueError:
            raise DoctorError(f"{flag} {value}: not a number") from None
        return float(in_range(number, flag, low, high))

    def integer(self, name: str, default: int | None = None) -> int | None:
        bounds = (0, MAX_TP) if name in _PARALLEL else (-MAX_INT, MAX_INT)  # -tp 10**18 counted TP sizes to it
        value = self.number(name, None, *bounds)
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
    model, given = serveargs.items(argv)
    flags: dict[str, str] = {}
    for name, value in given:
        if value is not None:
            flags[name] = value
        elif name.removeprefix("no_") in serveargs.SWITCHES:
            flags[name.removeprefix("no_")] = "false" if name.startswith("no_") else "true"
        else:
            flags[name] = "true"
    model = flags.pop("model", None) or model
    source = os.environ if env is None else env
    kept = {k: v for k, v in source.items() if k.startswith(serveargs.ENV_PREFIXES)}
    return ServeArgs(argv, model, flags, kept)


def from_cmdline(words: list[str]) -> ServeArgs | None:
    """Another process's command line, when it is a vLLM server: `vllm serve ...`, `python -m
    vllm.entrypoints.openai.api_server ...`; None otherwise."""
    served = serveargs.server_words(words)
    return None if served is None else parse(served, env={})
