"""The plain data that flows through the pipeline: read -> match -> facts -> checks -> diagnoses -> render.

Every stage takes and returns these, so each stage can be tested alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEVERITIES = ("blocker", "warning", "info")
# facts.model_shape of the report (issue 3's facts.model keys, plus the name and where it came from)
MODEL_SHAPE_KEYS = ("name", "layers", "attention_heads", "kv_heads", "head_dim", "kv_bytes_per_token",
                    "max_position_embeddings", "params", "params_source", "source")  # fmt: skip
# facts.concurrency of the report: null when the log gives no KV cache size (more keys with a target)
CONCURRENCY_KEYS = ("kv_tokens", "max_model_len", "worst_case_sequences")
CONFIDENCES = ("high", "medium", "low")
# a fix's `direction`: lower or raise a number, set a value, turn a switch on
FIX_DIRECTIONS = ("lower", "raise", "set", "enable")


@dataclass(slots=True)  # one per candidate line: keep it small
class Line:
    """One line of input, cleaned for matching but numbered as in the original."""

    no: int  # 1-based line number in the original input
    text: str  # message text: colour codes and process/logger prefixes removed
    raw: str  # the line as read (colour codes removed), for evidence
    source: int = 0  # index of the input path this line came from
    process: str | None = None  # e.g. "EngineCore_DP0", "Worker_TP1", "APIServer", "rank0"
    level: str | None = None  # logger level when the line carries one
    hit: bool = True  # False for context lines read only to join wrapped messages
    anchors: tuple[int, ...] = ()  # indexes of the prefilter anchors found in this line


@dataclass
class Pattern:
    regex: str
    since: str | None = None  # first vLLM release with this wording (documentation)
    until: str | None = None  # first release without it (exclusive)
    source: str | None = None  # the vLLM source file the text comes from
    level: str | None = None  # only lines logged at this level
    unless: str | None = None  # the match is void when this regex matches the same text
    example: str | None = None  # a real line the regex must match (checked by `rules check`)
    counter_examples: list[str] = field(default_factory=list)  # near misses the rule must not match
    needs: tuple[str, ...] = ()  # a match contains one of these (matching/literal.py): the engine's gate


@dataclass
class Fix:
    """One fix. In a rule file action, why and value may be lists of fallbacks, the most specific
    first (like a summary): the first variant is action/why/value here, the rest `fallbacks`.
    The fix shows the first variant whose names are all known."""

    action: str
    why: str
    flag: str | None = None
    value: str | None = None
    when: str | None = None
    direction: str | None = None  # what it does to `flag` (FIX_DIRECTIONS); fixcheck.py holds it to the numbers
    fallbacks: list[tuple[str, str, str | None]] = field(default_factory=list)  # (action, why, value)

    def variants(self) -> list[tuple[str, str, str | None]]:
        return [(self.action, self.why, self.value), *self.fallbacks]


@dataclass
class Rule:
    id: str
    kind: str  # "diagnosis", "fact" or "preflight" (a finding of `vllm-doctor check`, preflight/)
    title: str
    explanation: str
    path: str  # the file it was loaded from
    category: str | None = None
    severity: str = "info"
    confidence: str = "high"
    priority: int = 50  # among blockers, a higher priority is reported first
    wrapper: bool = False  # a generic wrapper error that yields to a real cause
    fallback: bool = False  # reported only when no other rule explains the failure (unrecognised-failure)
    summary: list[str] = field(default_factory=list)  # first template whose names are known wins
    survived: list[str] = field(default_factory=list)  # a blocker the server got past: what it means (an info note)
    anchors: list[str] = field(default_factory=list)  # literals that a candidate line must contain
    patterns: list[Pattern] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)  # named group -> fact name
    series: str | None = None  # fact rules: "stats" feeds the stats series
    bulk: str | None = None  # built-in series rules: the whole line in its plain form, read in bulk (read/bulk.py)
    phase: str | None = None  # fact rules: marks a startup phase at the matched line
    checks: list[str] = field(default_factory=list)
    when: str | None = None
    fixes: list[Fix] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # preflight rules: the values their check gives the templates
    # from --rules (not built in): its patterns are checked in full on loading, and it has no
    # bulk form. Every pattern compiles in the linear-time subset (RE2, matching/linear.py).
    linear: bool = False
    replaces: str | None = None  # the id of an earlier rule (built in) it takes the place of, as its file says
    source: str | None = None  # the --rules directory it came from; None: built in
    replaced: str | None = None  # the file of the rule it replaced (loader.py), for the report to name


EVIDENCE_CHARS = 400  # an evidence line is cut here; the report flags the cut (truncated)


@dataclass(slots=True)
class Evidence:
    line: int
    text: str
    source: int = 0
    truncated: bool = False  # the text was cut at EVIDENCE_CHARS


def cut_evidence(line: int, text: str, source: int = 0) -> Evidence:
    """An evidence line, cut at EVIDENCE_CHARS and flagged when it was."""
    return Evidence(line, text[:EVIDENCE_CHARS], source, len(text) > EVIDENCE_CHARS)


@dataclass(slots=True)
class TracebackRecord:
    """A frame, an exception line or a fatal line of a traceback, where it was (knowledge/tracebacks.py reads them)."""

    line: int
    source: int
    process: str | None
    level: str | None
    text: str
    fields: dict[str, Any]


@dataclass
class Match:
    """All the places one rule matched, with the numbers of its first match."""

    rule: Rule
    evidence: list[Evidence] = field(default_factory=list)
    groups: dict[str, Any] = field(default_factory=dict)
    count: int = 0
    first_line: int = 0


@dataclass
class FixOut:
    rank: int
    action: str
    flag: str | None
    value: str | None
    why: str
    direction: str | None = None


@dataclass
class Diagnosis:
    rule: str
    category: str
    severity: str
    confidence: str
    title: str
    summary: str
    explanation: str
    evidence: list[Evidence]
    numbers: dict[str, Any]
    fixes: list[FixOut]
    context: list[Evidence] = field(default_factory=list)  # wrapper errors that point at this cause
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (fix action, why fixcheck refused it)
    priority: int = 50
    first_line: int = 0
    wrapper: bool = False
    fallback: bool = False


@dataclass(frozen=True)
class Corrected:
    """The serve line with one fix applied (knowledge/command.py), before secrets are masked."""

    line: str  # `vllm serve MODEL --flag value ...`, ready to paste
    rule: str  # the diagnosis whose fix it applies
    fix: int  # that fix's rank
    change: str  # the flag as changed: "--max-model-len 8064"


@dataclass
class Report:
    paths: list[str]
    lines: int
    status: str  # failed | degraded | healthy | unknown
    diagnoses: list[Diagnosis]
    facts: dict[str, Any]
    warnings: list[str] = field(default_factory=list)  # about the input (truncated gzip, ...)
    lifetimes: list[Life] = field(default_factory=list)  # every server start in the input, in order
    shown: int | None = None  # the lifetime the top level is (its index); None: no lifetimes
    crash_loop: tuple[str, int, int] | None = None  # (cause, first, last index) of N same failures in a row
    empty: bool = False  # the input held no bytes at all
    all_lifetimes: bool = False  # --lifetime all: the renderers show every earlier start's diagnoses too
    corrected: Corrected | None = None  # the serve line with the top fix applied; None: the log has no command
    series: list[dict[str, Any]] = field(default_factory=list)  # stats samples to draw (facts.py: keep_point)
    settings: list[dict[str, Any]] = field(default_factory=list)  # settings and --rules in force (cli/sources.py)
    areas: list[dict[str, Any]] = field(default_factory=list)  # check: each area's checks and how they went (text only)


@dataclass
class Life:
    """One server lifetime: from a start to the next (or the end of the input), diagnosed alone."""

    index: int
    started: str | None  # the log's own time ("11-30 01:53:24"), None when its lines carry none
    ended: str | None
    ready: bool
    ready_at: str | None
    last_phase: str | None
    end: str  # fatal | shutdown | serving | abrupt
    outcome: str  # "cache-oom", "serving since 02:04", "stopped during weight loading"
    note: str | None  # what to check when it ended with no sign of why
    last_stats: dict[str, Any] | None  # the last stats sample: line, running, waiting, kv_usage_pct
    lines: tuple[int, int]  # first and last line of it that said something
    server: str | None  # "pid 15836", "vllm-1", "pod/vllm-0/vllm pid 1"
    report: Report
    sources: tuple[int, int] = (0, 0)  # the inputs (indexes into paths) of the first and last line
    space: int = 0  # its server: the input holding that server's first lines (one per input unless one process)
