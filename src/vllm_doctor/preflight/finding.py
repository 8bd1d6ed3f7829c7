"""What a check says: findings (category, severity, numbers, fixes) or why it could not run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# where in a start each failure happens, the earliest highest: the first blocker is the failure the
# start would stop at. vLLM 0.6+ binds the port before it builds the engine config (max-model-len,
# heads); the workers then bind CPUs, check free GPU memory, build the model (KV heads, vocab), load
# the weights and size the KV cache.
STAGE = {
    "port-in-use": 90, "model-not-found": 88, "hf-auth": 87, "trust-remote-code": 86, "unsupported-architecture": 85,
    "invalid-quantization": 82, "quantization-config-missing": 81,
    "context-exceeds-max": 80, "config-validation": 80, "not-enough-gpus": 78, "cuda-driver": 76,
    "unsupported-dtype": 74, "quantization-unsupported": 74, "gpu-memory-occupied": 70, "cpu-memory-utilization": 68,
    "cpu-omp-numa-binding": 66, "tp-divisibility": 60, "shm": 58, "disk-full": 56, "weights-oom": 55,
    "cpu-kvcache-exceeds-ram": 52, "cache-oom": 50,
}  # fmt: skip


class CannotRun(Exception):
    """The check cannot decide here; the message says why in one line and the other checks go on."""


@dataclass
class Fix:
    action: str
    why: str
    flag: str | None = None
    value: str | None = None


@dataclass
class Finding:
    category: str  # explain's category for the failure this start would have (cache-oom, port-in-use, ...)
    severity: str  # blocker | warning | info
    title: str
    summary: str  # the numbers behind it, in a sentence
    numbers: dict[str, Any] = field(default_factory=dict)
    fixes: list[Fix] = field(default_factory=list)
    confidence: str = "high"
    check: str = ""  # the check's name, set by the runner
    stage: int | None = None  # when in the start it would fail (default STAGE[category])

    @property
    def priority(self) -> int:
        return self.stage if self.stage is not None else STAGE.get(self.category, 40)


def blocker(category: str, title: str, summary: str, numbers=None, fixes=None, confidence="high") -> Finding:
    return Finding(category, "blocker", title, summary, dict(numbers or {}), list(fixes or []), confidence)


def warning(category: str, title: str, summary: str, numbers=None, fixes=None, confidence="high") -> Finding:
    return Finding(category, "warning", title, summary, dict(numbers or {}), list(fixes or []), confidence)


def info(category: str, title: str, summary: str, numbers=None, fixes=None) -> Finding:
    return Finding(category, "info", title, summary, dict(numbers or {}), list(fixes or []))
