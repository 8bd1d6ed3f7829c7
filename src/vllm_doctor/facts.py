"""What the log says about the server: version, arguments, memory, KV capacity, the stats series.

Fact rules in rules/facts/ name the facts their groups fill; this module knows the names, their
types, and keeps the stats series as running aggregates so memory stays flat over a week of stats
lines, with a bounded set of its samples for the pictures. The argument dumps are read by
serveargs.parse_args.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from itertools import accumulate, compress, pairwise
from math import isinf, isnan
from operator import add
from typing import Any

from vllm_doctor.data import Line, TracebackRecord

KV_NEAR_FULL_PCT = 80.0  # KV usage at or above this, with requests waiting, is a full cache

# the startup and shutdown phases a fact rule may mark (`phase = "..."`), in the order they come;
# the checks read them (oom_phase: weights or cache; shutdown)
WEIGHT_PHASES = frozenset({"weights_loading"})
# an OOM here: the cache; after "kv_cache_sized" (the cache's size printed) or in "graph_capture",
# what is left beside the cache (warmup-oom)
CACHE_PHASES = frozenset({"weights_loaded", "profiling", "kv_cache_alloc", "kv_cache_sized", "graph_capture"})
SHUTDOWN_PHASES = frozenset({"shutdown_started", "shutdown_complete"})
# a server's lifetime: where one starts (banner, arguments, engine banner) and that it became ready
LIFE_PHASES = frozenset({"server_start", "ready"})
PHASES = WEIGHT_PHASES | CACHE_PHASES | SHUTDOWN_PHASES | LIFE_PHASES

# name -> type; dotted names nest in the JSON report ("kv_cache.tokens" -> facts.kv_cache.tokens)
FACTS: dict[str, type] = {
    "vllm_version": str,
    "engine": str,  # "V0" or "V1"
    "model": str,
    "device": str,
    "port": int,  # --port: the API server's port (an argument dump, the command line)
    "max_model_len": int,
    "pooling_task": str,  # the pooling task served (embed, classify, score, reward): requests end within a step
    "pooling_route": str,  # a pooling API route its clients call (/v1/embeddings, /pooling, /score, /rerank, /classify)
    "speculative.draft_architecture": str,  # a draft/MTP model's "Resolved architecture" (its lines are not the model's)
    "tensor_parallel_size": int,
    "pipeline_parallel_size": int,
    "data_parallel_size": int,
    "gpu_memory_utilization": float,
    "kv_cache_memory_bytes": int,  # --kv-cache-memory-bytes: the KV space set explicitly (0.10.2+)
    "cpu_kvcache_space": int,  # VLLM_CPU_KVCACHE_SPACE (GiB): the CPU backend's KV space
    "cpu.torch_threads": int,  # the CPU backend's "Reducing Torch threads from N": the log's host CPUs
    "cpu.core_ids": str,  # a rank's OpenMP "core ids=[..]" (the last printed)
    "cpu.reserved_cpus": str,  # the OpenMP binding's "reserved_cpus=[..]"
    "cpu.omp_threads_bind": str,  # the VLLM_CPU_OMP_THREADS_BIND the start ran with ('auto', 'nobind', '0-3|4-7')
    "num_attention_heads": int,
    "num_kv_heads": int,
    "weights_gib": float,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "dtype": str,
    "kv_cache_dtype": str,
    "quantization": str,
    "enable_lora": bool,
    "enable_prefix_caching": bool,
    "enable_chunked_prefill": bool,
    "long_prefill_token_threshold": int,
    "enforce_eager": bool,
    "scheduling_policy": str,
    "trust_remote_code": bool,
    "disable_hybrid_kv_cache_manager": bool,  # windowed layers sized as full attention
    "derived_max_model_len": int,
    "max_len_key": str,
    "kv_cache.gpu_blocks": int,
    "kv_cache.cpu_blocks": int,
    "kv_cache.block_size": int,
    "kv_cache.tokens": int,
    "kv_cache.max_concurrency": float,
    "kv_cache.concurrency_tokens": int,
    "kv_cache.available_gib": float,
    "kv_cache.explicit_gib": float,  # the KV space set explicitly (VLLM_CPU_KVCACHE_SPACE, --kv-cache-memory-bytes)
    "kv_cache.estimated_max_model_len": int,
    "kv_cache.tokens_from": str,  # "log", or how it was computed from blocks
    "memory.total_gib": float,
    "memory.free_gib": float,
    "memory.requested_gib": float,
    "memory.weights_gib": float,
    "memory.activation_gib": float,
    "memory.non_torch_gib": float,
    "memory.cudagraph_gib": float,
    "memory.kv_gib": float,
    "memory.after_warmup_free_gib": float,  # 0.34's extensible cache: free memory measured after warmup
    "memory.transient_gib": float,  # ... and what it keeps for transient activations
    "kv_cache.extended_gib": float,  # ... the KV cache it extended to, once measured (the final size)
    "kv_cache.sized_after": str,  # "warmup": vLLM's cache check ran on the memory left after CUDA graphs and warmup
    "pydantic_value_error": str,  # a pydantic ValidationError's "Value error, ..." line: the message it wraps
}

# fields of one stats sample a stats rule may fill
STATS_FIELDS = {
    "running": int,
    "waiting": int,
    "swapped": int,
    "deferred": int,
    "preemptions": int,  # per interval (V1 "Preemptions: N")
    "preemptions_total": int,  # cumulative (V0 warning "total_num_cumulative_preemption=N")
    "preempted": str,  # a V0 preemption warning (its mode); at least one preemption
    "kv_usage_pct": float,
    "prefix_hit_pct": float,
    "prompt_tps": float,
    "gen_tps": float,
}

# fields of one traceback record a `series = "traceback"` rule may fill: a frame (file, lineno,
# function, code), the exception that ended a traceback (exc_type, exc_message), or a line that says
# the process failed without one (fatal), or one that opens a traceback Python ignored (teardown)
TRACEBACK_FIELDS = {
    "file": str,
    "lineno": int,
    "function": str,
    "code": str,
    "exc_type": str,
    "exc_message": str,
    "fatal": str,
    "teardown": str,
}
# an HTTP access line (uvicorn's `"POST /v1/completions HTTP/1.1" 500`): its status, counted by class
ACCESS_FIELDS: dict[str, type] = {"status": int}
SERIES_FIELDS: dict[str, dict[str, type]] = {
    "stats": STATS_FIELDS,
    "traceback": TRACEBACK_FIELDS,
    "access": ACCESS_FIELDS,
}
TRACEBACK_KEPT = 600  # records kept per lifetime (the latest): a startup's tracebacks fit many times over

ARGS = "args"  # a fact rule group holding a whole argument dump, parsed by serveargs.parse_args()
ARG_DUMPS_KEPT, ARG_DUMP_CHARS = 64, 16384  # argument dumps kept per lifetime (the latest), and their length


def convert(kind: type, value: Any) -> Any:
    """A captured string as the fact's type; None when it does not convert."""
    if value is None:
        return None
    if type(value) is str:  # the common case, a stats line's plain number: what the general path gives, sooner
        if kind is float and value.isascii():
            try:
                number = float(value)  # (without a comma or quote, float() reads what the path below reads)
                return None if isinf(number) else number
            except ValueError:
                pass
        elif kind is int and len(value) <= 15 and value.isascii() and value.isdigit():
            return int(value)  # (within a double's 15 exact digits, int(float(x)) is int(x))
    if isinstance(value, kind) and kind is not str and not (kind is int and isinstance(value, bool)):
        return value
    text = str(value).strip().strip("'\"")
    if text in ("", "None", "none", "null"):
        return None
    try:
        if kind is bool:
            return text.lower() in ("true", "1", "yes")
        if kind is int:
            return int(float(text.replace(",", "")))
        if kind is float:  # 500 digits read as inf: no figure (a NaN stays, the stats read it as unknown)
            number = float(text.replace(",", ""))
            return None if isinf(number) else number
    except (ValueError, OverflowError):  # a hostile line's 5000-digit "number" is no number
        return None
    if text.startswith("torch."):
        text = text[len("torch.") :]
    return text


# The stats series as points a picture can draw: each kept point is one stats sample as vLLM
# printed it (its line, its time, running, waiting, KV usage, preemptions), never an average.
# Bounded however long the log is: past POINTS_KEPT points, neighbours are paired and the busier of each
# pair stays (the one with more waiting, then more KV usage), so a queue's peak survives thinning;
# the latest sample always stays, since the failure is at the end.
POINTS_KEPT = 240
MANY = 64  # samples read as columns from this many on (StatsSeries.add_many): fewer cost less one by one
POINT_FIELDS = ("running", "waiting", "kv_usage_pct", "preemptions")
# a line's time: vLLM's own, after the level ("INFO 11-30 01:58:49"), preferred to a collector's
# timestamp at the head of the line; knowledge/lifetimes.py dates lifetimes by the same rule
TIME = re.compile(r"(?<!\d)(?:\d{4}-)?(?P<mo>\d\d)-(?P<d>\d\d)[T ](?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?!\d)")
_VLLM_TIME = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<mo>\d\d)-(?P<d>\d\d) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)"
)


def line_time(raw: str) -> tuple[str | None, bool]:
    """("11-30 01:58:49" or None, whether it is vLLM's own time rather than a collector's)."""
    t = _VLLM_TIME.search(raw, 0, 240)
    own = t is not None
    t = t or TIME.search(raw, 0, 200)
    return (f"{t['mo']}-{t['d']} {t['h']}:{t['m']}:{t['s']}" if t else None), own


def point(sample: dict[str, Any], line: int, source: int, text: str) -> dict[str, Any]:
    """One stats sample as a point: its line, its time ("11-30 01:58:49", None without one), the
    fields drawn."""
    out: dict[str, Any] = {"line": line, "source": source, "time": line_time(text)[0]}
    out.update({k: sample.get(k) for k in POINT_FIELDS})
    return out


def keep_point(points: list[dict[str, Any]], new: dict[str, Any]) -> None:
    """Append `new`; past POINTS_KEPT, halve the list pair by pair (the last point is never paired away)."""
    points.append(new)
    if len(points) <= POINTS_KEPT:
        return
    last = points.pop()
    thinned = [max(points[i : i + 2], key=_busy) for i in range(0, len(points), 2)]
    points[:] = [*thinned, last]


def _busy(p: dict[str, Any]) -> tuple[float, float]:
    return (p.get("waiting") or 0, p.get("kv_usage_pct") or 0.0)


@dataclass
class StatsSeries:
    """Running aggregates of the periodic stats lines; bounded however long the log is."""

    samples: int = 0
    running_max: int | None = None
    waiting_max: int | None = None
    kv_usage_max_pct: float | None = None
    swapped_max: int | None = None
    deferred_max: int | None = None
    preemptions: int | None = None
    waiting_samples: int = 0  # samples with requests waiting
    waiting_run: int = 0  # current run of consecutive waiting samples
    waiting_run_max: int = 0  # ... the longest: how long a backlog lasted
    waiting_full: int = 0  # ... while the KV cache was near full
    waiting_kv_max_pct: float | None = None  # highest KV usage seen while requests waited
    waiting_running_min: int | None = None
    waiting_running_max: int | None = None
    waiting_idle: int = 0  # ... while nothing ran or was generated, and no prompt was processed (a stall)
    full_run: int = 0  # current run of consecutive waiting+full samples
    full_run_max: int = 0
    idle_run: int = 0  # current run of consecutive waiting+idle samples (a stall, if it lasts)
    prompt_samples: int = 0  # samples whose interval processed prompts (prompt throughput above 0)
    gen_samples: int = 0  # samples whose interval generated tokens (none in a pooling server's)
    prefix_traffic_samples: int = 0  # samples with a prefix hit rate while prompts were processed
    prefix_hit_last_pct: float | None = None  # ... the latest of them (V1's rate is over recent requests)
    evidence: list[tuple[int, int, str]] = field(default_factory=list)  # (line, source, text)
    first_line: int | None = None
    last: tuple[int, int, dict] | None = None  # the latest sample: (line, source, fields), what it did last
    points: list[dict] = field(default_factory=list)  # the samples to draw, bounded (keep_point)

    def add(self, sample: dict[str, Any], line: int, source: int, text: str) -> None:
        if sample.get("preempted") is not None:  # a preemption warning, not a stats sample
            self.preemptions = _max(self.preemptions, sample.get("preemptions_total") or 1)
            if len(self.evidence) < 40:
                self.evidence.append((line, source, text))
            return
        if sample.get("running") is None and sample.get("prefix_hit_pct") is not None:
            self._v0_prefix(sample["prefix_hit_pct"])  # V0's hit-rate line, after its stats line
            return
        self.samples += 1
        self.last = (line, source, sample)
        keep_point(self.points, point(sample, line, source, text))
        running = sample.get("running")
        waiting = sample.get("waiting")
        kv = sample.get("kv_usage_pct")
        self.running_max = _max(self.running_max, running)
        self.waiting_max = _max(self.waiting_max, waiting)
        self.kv_usage_max_pct = _max(self.kv_usage_max_pct, kv)
        self.swapped_max = _max(self.swapped_max, sample.get("swapped"))
        self.deferred_max = _max(self.deferred_max, sample.get("deferred"))
        if sample.get("preemptions") is not None:
            self.preemptions = (self.preemptions or 0) + sample["preemptions"]
        self.prompt_samples += bool(sample.get("prompt_tps"))
        self.gen_samples += bool(sample.get("gen_tps"))
        if sample.get("prefix_hit_pct") is not None and sample.get("prompt_tps") != 0.0:  # no traffic, no rate
            self.prefix_traffic_samples += 1
            self.prefix_hit_last_pct = sample["prefix_hit_pct"]
        if waiting:
            self.waiting_samples += 1
            self.waiting_kv_max_pct = _max(self.waiting_kv_max_pct, kv)
            self.waiting_running_min = _min(self.waiting_running_min, running)
            self.waiting_running_max = _max(self.waiting_running_max, running)
            self.waiting_run += 1
            self.waiting_run_max = max(self.waiting_run_max, self.waiting_run)
            idle = sample.get("prompt_tps") in (0.0, None) and (running == 0 or sample.get("gen_tps") == 0.0)
            self.waiting_idle += idle
            self.idle_run = self.idle_run + 1 if idle else 0
            full = kv is not None and kv >= KV_NEAR_FULL_PCT
            self.waiting_full += full
            self.full_run = self.full_run + 1 if full else 0
            self.full_run_max = max(self.full_run_max, self.full_run)
            if len(self.evidence) < 40:
                self.evidence.append((line, source, text))
        else:
            self.full_run = self.idle_run = self.waiting_run = 0
            if sample.get("preemptions") and len(self.evidence) < 40:
                self.evidence.append((line, source, text))
        self.first_line = line if self.first_line is None else self.first_line

    def add_many(self, cols: dict[str, list], lines: list[int], source: int, text: Callable[[int], str]) -> None:
        """Samples as columns (field -> values, None where one lacks it), in order: add() on each, by
        builtins over whole columns. text(j), sample j's text, is asked of the points and evidence only."""
        n, none = len(lines), [None] * len(lines)
        running, waiting, kv, prompt, gen, preempt = (
            cols.get(k, none) for k in ("running", "waiting", "kv_usage_pct", "prompt_tps", "gen_tps", "preemptions")
        )
        odd = None in running or cols.get("preempted", none).count(None) < n or any(map(isnan, filter(None, kv)))
        if n < MANY or odd:  # a few, or a V0 hit-rate line, a preemption warning or a NaN among them: one by one
            for j in range(n):
                self.add({k: v[j] for k, v in cols.items() if v[j] is not None}, lines[j], source, text(j))
            return
        self.samples += n
        self.first_line = lines[0] if self.first_line is None else self.first_line
        self.last = (lines[-1], source, {k: v[-1] for k, v in cols.items() if v[-1] is not None})
        self._points(cols, lines, source, text)
        for name, field_ in (("running", "running_max"), ("waiting", "waiting_max"), ("kv_usage_pct", "kv_usage_max_pct"),
                             ("swapped", "swapped_max"), ("deferred", "deferred_max")):  # fmt: skip
            setattr(self, field_, _max(getattr(self, field_), _top(max, cols.get(name, none))))
        if preempt.count(None) < n:
            self.preemptions = (self.preemptions or 0) + sum(filter(None, preempt))
        self.prompt_samples += sum(map(bool, prompt))
        self.gen_samples += sum(map(bool, gen))
        rates = [p for p, t in zip(cols.get("prefix_hit_pct", none), prompt, strict=True) if p is not None and t != 0.0]
        self.prefix_traffic_samples += len(rates)
        self.prefix_hit_last_pct = rates[-1] if rates else self.prefix_hit_last_pct
        wait = list(compress(range(n), waiting))
        w_running, w_kv = list(compress(running, waiting)), list(compress(kv, waiting))  # (in wait's order)
        self.waiting_samples += len(wait)
        self.waiting_kv_max_pct = _max(self.waiting_kv_max_pct, _top(max, w_kv))
        self.waiting_running_min = _min(self.waiting_running_min, _top(min, w_running))
        self.waiting_running_max = _max(self.waiting_running_max, _top(max, w_running))
        idle = [j for j in wait if prompt[j] in (0.0, None) and (running[j] == 0 or gen[j] == 0.0)]
        full = [j for j, k in zip(wait, w_kv, strict=True) if k is not None and k >= KV_NEAR_FULL_PCT]
        self.waiting_idle, self.waiting_full = self.waiting_idle + len(idle), self.waiting_full + len(full)
        self.idle_run = _runs(idle, n, self.idle_run)[0]
        self.full_run, longest = _runs(full, n, self.full_run)
        self.full_run_max = max(self.full_run_max, longest)
        self.waiting_run, longest = _runs(wait, n, self.waiting_run)
        self.waiting_run_max = max(self.waiting_run_max, longest)
        told = wait if not any(preempt) else [j for j in range(n) if waiting[j] or preempt[j]]
        self.evidence.extend((lines[j], source, text(j)) for j in told[: max(0, 40 - len(self.evidence))])

    def _points(self, cols: dict[str, list], lines: list[int], source: int, text: Callable[[int], str]) -> None:
        """keep_point() of each sample at once: its thinning pairs by count alone (run on group sizes),
        a group keeps its busiest, the first on a tie (one max()); only those are made points."""
        old, n, none = len(self.points), len(lines), [None] * len(lines)
        keys = [_busy(p) for p in self.points]
        waiting, kv = cols.get("waiting", none), cols.get("kv_usage_pct", none)  # (_busy's `or` changes None alone)
        keys += zip(waiting if None not in waiting else [w or 0 for w in waiting],
                    kv if None not in kv else [k or 0.0 for k in kv], strict=True)  # fmt: skip
        sizes, j = [1] * old, 0
        while j < n:  # filled to POINTS_KEPT + 1, then halved pair by pair, the last one aside
            take = max(1, POINTS_KEPT + 1 - len(sizes))
            sizes += [1] * min(take, n - j)
            j += take
            if len(sizes) > POINTS_KEPT:
                last, even = sizes.pop(), len(sizes) & ~1
                sizes = [*map(add, sizes[0:even:2], sizes[1:even:2]), *sizes[even:], last]
        ends = list(accumulate(sizes, initial=0))
        kept = [max(range(a, b), key=keys.__getitem__) for a, b in pairwise(ends)]
        fields = [(k, cols.get(k, none)) for k in POINT_FIELDS]  # (the kept points come first, then the samples)
        made = [
            point({k: v[j] for k, v in fields}, lines[j], source, text(j)) for j in [i - old for i in kept if i >= old]
        ]
        self.points[:] = [*(self.points[i] for i in kept if i < old), *made]

    def _v0_prefix(self, pct: float) -> None:
        """V0's hit rate (cumulative since start) completes the stats sample before it: a rate
        only where that interval processed prompts."""
        before = self.last[2] if self.last else {}
        if before.get("prompt_tps"):
            self.prefix_traffic_samples += 1
            self.prefix_hit_last_pct = pct

    def summary(self) -> dict[str, Any]:
        kept = ("samples", "running_max", "waiting_max", "kv_usage_max_pct", "preemptions")
        # and the samples the pictures draw, as vLLM printed them
        return {**{k: getattr(self, k) for k in kept}, "series": [dict(p) for p in self.points]}


# the names with a dynamic part that Facts.flat() gives: a prefix and the declared names after it
STATS_PREFIX = "stats."


def stats_names() -> frozenset[str]:
    """`stats.<aggregate>`: every StatsSeries field that is a number (flat() leaves out lists)."""
    return frozenset(
        STATS_PREFIX + f.name for f in fields(StatsSeries) if not str(f.type).startswith(("list", "tuple"))
    )


def fact_names() -> frozenset[str]:
    """Every name Facts.flat() can hold: the facts, and the stats series' aggregates."""
    return frozenset(FACTS) | stats_names()


def _max(a, b):
    return a if b is None else b if a is None or b > a else a


def _top(pick, values: list):
    """max or min of the values that are not None (None when none is)."""
    unknown = values.count(None)
    known = values if not unknown else [v for v in values if v is not None] if unknown < len(values) else ()
    return pick(known, default=None)


def _runs(marked: list[int], n: int, before: int) -> tuple[int, int]:
    """(the run at the end, the longest run) of the marked samples of n, the run `before` going on."""
    parts = bytes(map(set(marked).__contains__, range(n))).split(b"\0")
    head = before + len(parts[0])
    # max of a list: with every sample marked there is one part, and max(head) alone is a TypeError
    return (len(parts[-1]) if len(parts) > 1 else head), max([head, *map(len, parts[1:])])


def _min(a, b):
    return a if b is None else b if a is None or b < a else a


DRAFT = "speculative.draft_architecture"


@dataclass
class Facts:
    values: dict[str, Any] = field(default_factory=dict)
    where: dict[str, int] = field(default_factory=dict)  # fact -> line it was last read from
    stats: StatsSeries = field(default_factory=StatsSeries)
    phases: deque = field(default_factory=lambda: deque(maxlen=256))  # (line, source, phase, process)
    traceback: deque = field(default_factory=lambda: deque(maxlen=TRACEBACK_KEPT))  # TracebackRecord
    access: dict[str, int] = field(default_factory=dict)  # HTTP status class ("2xx", "5xx") -> access lines
    window: dict[str, Any] = field(default_factory=dict)  # a scrape series' window (read/window.py)
    # (line, blob) of every argument dump and command line, as printed: knowledge/command.py rebuilds the serve line
    arg_dumps: deque = field(default_factory=lambda: deque(maxlen=ARG_DUMPS_KEPT))
    draft_at: int | None = None  # the line a draft model's config began: its max length is the draft's

    def add_sample(self, series: str, sample: dict[str, Any], line: Line, text: str, times: int = 1) -> None:
        """One match of a `series` rule: a stats sample, or a traceback record; `times` access lines
        alike (a run of them, read in bulk: read/bulk.py)."""
        if series == "traceback":
            self.traceback.append(TracebackRecord(line.no, line.source, line.process, line.level, text, sample))
        elif series == "access":
            if sample.get("status") is not None:
                key = f"{sample['status'] // 100}xx"
                self.access[key] = self.access.get(key, 0) + times
        else:
            self.stats.add(sample, line.no, line.source, text)

    def set(self, name: str, value: Any, line: int = 0) -> None:
        value = convert(FACTS[name], value)
        value = value.lower() if name == "device" and value else value  # "CPU" in the banner; device_config=cpu
        if name == DRAFT:
            self.draft_at = line
        elif name == "max_model_len" and self.draft_at is not None and name in self.values and line > self.draft_at:
            self.draft_at = None  # speculative decoding: the draft/MTP model's own "Using max model len"
            return
        if value is not None:
            self.values[name] = value
            self.where[name] = line

    def set_default(self, name: str, value: Any, line: int = 0) -> None:
        if name not in self.values:
            self.set(name, value, line)

    def set_args(self, blob: str, line: int) -> None:
        """Facts from an argument dump, and the defaults a complete dump implies."""
        from vllm_doctor.serveargs import ARG_DEFAULTS, parse_args

        parsed, complete = parse_args(blob)
        self.arg_dumps.append((line, blob[:ARG_DUMP_CHARS]))
        for name, value in parsed.items():
            self.set(name, value, line)
        if complete:
            for name, value in ARG_DEFAULTS.items():
                if name not in parsed:
                    self.set_default(name, value, line)

    def get(self, name: str) -> Any:
        return self.values.get(name)

    def flat(self) -> dict[str, Any]:
        """Facts and stats aggregates by dotted name, for conditions and templates."""
        out = dict(self.values)
        for key, value in vars(self.stats).items():
            if not isinstance(value, list | tuple):
                out[f"stats.{key}"] = value
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict.fromkeys(("vllm_version", "model", "max_model_len", "tensor_parallel_size"))
        out.update(dict.fromkeys(("gpu_memory_utilization", "num_attention_heads", "weights_gib")))  # null if unsaid
        kv = ("gpu_blocks", "cpu_blocks", "block_size", "tokens", "max_concurrency", "concurrency_tokens")
        out["kv_cache"] = dict.fromkeys((*kv, "available_gib", "estimated_max_model_len"))
        for name, value in sorted(self.values.items()):
            node = out
            *parents, leaf = name.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        out["stats"] = self.stats.summary()
        return out
