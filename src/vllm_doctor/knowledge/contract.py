"""The rule <-> check contract: what a named check receives (CheckInput), what it gives back
(CheckResult), and its declaration (Check: the names it reads and the names it may return).

The checks themselves are in checks.py; `rules check` and `rules show` read the declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_doctor.data import Evidence, Match
from vllm_doctor.facts import Facts

if TYPE_CHECKING:  # the model and GPU modules load only when a model or GPU is involved
    from vllm_doctor.capacity.gpu import GpuSnapshot
    from vllm_doctor.capacity.modelcfg import ModelShape


@dataclass
class Options:
    target_concurrency: int | None = None
    target_len: int | None = None
    model: str | None = None  # --model ID|PATH: the model whose config.json to read (else the log's)
    config: str | None = None  # --config FILE: this config.json
    offline: bool = False  # --offline: never touch the network
    lookup_model: bool = False  # look up the log's model (the CLI turns this on; library callers opt in)
    gpu: bool = False  # take an NVML snapshot of this machine (the CLI does, unless --no-gpu)
    # the log is from this machine (serve, --this-host): only then does the snapshot inform fixes;
    # None decides from the log (its hostname, or a pid of it holding this machine's GPU memory)
    this_host: bool | None = None
    lifetime: int | None = None  # the server lifetime the report leads with (1-based); None: the latest
    tpot_budget_ms: float | None = None  # --tpot-budget: inter-token latency p95 the operator allows
    ttft_budget_ms: float | None = None  # --ttft-budget: time to first token p95 the operator allows
    # resolved by explain() before the checks run; None when unknown or skipped
    shape: ModelShape | None = None
    gpu_snapshot: GpuSnapshot | None = None


@dataclass
class CheckInput:
    values: dict[str, Any]
    facts: Facts
    match: Match | None
    options: Options = field(default_factory=Options)
    read: set[str] = field(default_factory=set)  # every name asked for (the contract test checks them)

    def get(self, *names: str) -> Any:
        """The first of several names that is known (a matched group or a fact)."""
        self.read.update(names)
        for name in names:
            value = self.values.get(name)
            if value is not None:
                return value
        return None


@dataclass
class CheckResult:
    """What a check found: named values for the rule, evidence lines it contributes (used when the
    rule matched no line of its own), and a confidence it lowers the diagnosis to."""

    values: dict[str, Any] = field(default_factory=dict)
    evidence: list[Evidence] = field(default_factory=list)
    confidence: str | None = None


class CheckContractError(AssertionError):
    """A check read or returned a name it does not declare (a bug in checks.py)."""


STRICT = False  # tests turn this on: a check that breaks its declaration raises instead of being trimmed


@dataclass(frozen=True)
class Check:
    """A named check: the names it reads (groups or facts), the names it may return, the function."""

    name: str
    reads: frozenset[str]
    returns: frozenset[str]
    fn: Callable[[CheckInput], CheckResult]
    doc: str = ""

    def __call__(self, inp: CheckInput) -> CheckResult:
        result = self.fn(inp)
        extra = result.values.keys() - self.returns
        unread = inp.read - self.reads
        if extra or unread:
            if STRICT:
                raise CheckContractError(f"{self.name}: returns {sorted(extra)} / reads {sorted(unread)} undeclared")
            for k in extra:  # outside the tests: a rule only ever sees declared names
                del result.values[k]
        return result


def check(*, reads: Iterable[str], returns: Iterable[str]) -> Callable[[Callable[[CheckInput], CheckResult]], Check]:
    def register(fn: Callable[[CheckInput], CheckResult]) -> Check:
        doc = (fn.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        return Check(fn.__name__, frozenset(reads), frozenset(returns), fn, " ".join(doc.split()))

    return register
