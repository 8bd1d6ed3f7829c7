"""One log, many lives: the input split into server lifetimes, so facts, stats and diagnoses never
cross a restart, and how each lifetime ended.

A lifetime starts at a `phase = "server_start"` rule (the version banner, the argument dump, the
engine banner: rules/facts/server-start-*.toml). The same start marker from the same process a
second time, or any start marker after the server was ready, served or shut down, is a restart.
Several servers writing to one file are told apart by their API server's pid and their
collector's container name; an engine or worker process goes to the server whose API pid is the
nearest below its own (a child's pid follows its parent's), lines without a pid to the lifetime
the previous line of their container went to. Several inputs are several servers unless one
continues a process of another (same pid and container, at a later time: a rotated log); output
with no start marker that did not get past startup belongs to the start below it (an excerpt
pasted error first).

The engine asks `Lifetimes.route(rule, line)` for the store each match fills (matching/engine.py's
Router); it imports nothing from here. The prefixes read here (pid, container, time, host) are
read from the line's raw text with local patterns: read/lineparse.py strips them for matching
and keeps only the process name, and the split needs the rest. Imports data and facts.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.data import Line, Match, Rule
from vllm_doctor.facts import TIME, Facts, line_time

START = "server_start"
READY = "ready"
_SHUTDOWN = ("shutdown_started", "shutdown_complete")
CRASH_LOOP = 3  # this many failed starts in a row with one cause is a crash loop

_PROC = re.compile(r"\((?P<name>[^()=]{0,60}?)\s?(?:rank=\d+ )?pid=(?P<pid>\d+)")
_UVICORN_PID = re.compile(r"Started server process \[(?P<pid>\d+)\]")
_CONTAINER = re.compile(
    r"^(?:\S*\d\d:\d\d:\d\d\S*\s+(?:std(?:out|err)\s+[FP]\s+)?)?"
    r"(?:\[pod/(?P<pod>[^\]\s/]+)(?:/(?P<ctr>[^\]\s]+))?\]\s|(?P<svc>[A-Za-z][\w.\-]*)\s+\|\s)"
)
_SYSLOG_HOST = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d (?P<host>[\w.\-]+) ")
PHASE_WORDS = {
    START: "startup, before weight loading",
    "weights_loading": "weight loading",
    "weights_loaded": "startup, after the weights loaded",
    "profiling": "memory profiling",
    "kv_cache_alloc": "KV cache allocation",
    "graph_capture": "CUDA graph capture",
    "kv_cache_sized": "startup, after the KV cache was sized",  # no phase line, the KV numbers printed
    READY: "serving",
    "shutdown_started": "shutdown",
    "shutdown_complete": "shutdown",
}


@dataclass
class Who:
    """What a line's prefixes say about where it came from."""

    container: str | None
    pid: int | None
    process: str | None
    time: str | None  # "11-30 01:53:24" as the log has it (no year)
    host: str | None
    own_clock: bool = True  # the time is vLLM's own (not a collector's timestamp on the line)
    space: int = 0  # the input whose server this line is of (Lifetimes.route sets it)

    @property
    def key(self) -> tuple[int, str | None]:
        return self.space, self.container


def who(line: Line) -> Who:
    raw = line.raw
    c = _CONTAINER.match(raw)
    container = None
    host = None
    if c:
        container = f"pod/{c['pod']}/{c['ctr']}" if c["pod"] and c["ctr"] else (c["pod"] or c["svc"])
        host = c["pod"]  # a pod's hostname is its name
    s = _SYSLOG_HOST.match(raw)
    if s:
        host = s["host"]
    pid = None
    p = _PROC.search(raw, 0, 200)
    if p and (line.process is not None or not p["name"].strip()):
        pid = int(p["pid"])
    elif "Started server process" in raw:
        u = _UVICORN_PID.search(raw)
        pid = int(u["pid"]) if u else None
    time, own = line_time(raw)
    return Who(container, pid, line.process, time, host, own)


def seconds(time: str | None) -> int | None:
    """A log time as seconds in a year of 31-day months: enough to say how long a start lasted."""
    t = TIME.search(time or "")
    if t is None:
        return None
    return ((int(t["mo"]) * 31 + int(t["d"])) * 24 + int(t["h"])) * 3600 + int(t["m"]) * 60 + int(t["s"])


@dataclass
class Lifetime:
    index: int  # 1-based, in the order the starts appear
    container: str | None
    space: int = 0  # the input that holds this server's first lines (several inputs are several servers)
    owner: int | None = None  # the API server's pid (or the first pid that started it)
    facts: Facts = field(default_factory=Facts)
    matches: dict[str, Match] = field(default_factory=dict)
    kinds: set[tuple[str, str | None]] = field(default_factory=set)  # (start rule, process) seen
    started: str | None = None
    ended: str | None = None
    ready_at: str | None = None
    first: tuple[int, int] | None = None  # (source, line)
    last: tuple[int, int] | None = None
    pids: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    own_clock: bool = False  # started/ended are vLLM's own times (a collector's are used only without them)
    headless: bool = False  # opened by output before any start marker (an excerpt, a log cut at its head)

    @property
    def ready(self) -> bool:
        """Ready, or evidently serving: stats lines are printed only once the engine runs."""
        stats = self.facts.stats
        return self.ready_at is not None or stats.samples > 0 or stats.preemptions is not None

    @property
    def progressed(self) -> bool:
        """Past startup: another start marker after this is a restart, whatever printed it."""
        return self.ready or any(p[2] in _SHUTDOWN for p in self.facts.phases)

    def last_phase(self) -> str | None:
        phases = [p[2] for p in self.facts.phases]
        if not any(p in _SHUTDOWN or p == READY for p in phases):  # numbers printed at a step mark it too
            if self.facts.get("kv_cache.tokens") is not None or self.facts.get("kv_cache.gpu_blocks") is not None:
                phases.append("kv_cache_sized")
            elif self.facts.get("weights_gib") is not None and "weights_loaded" not in phases:
                phases.append("weights_loaded")
        if self.facts.stats.samples and READY not in phases and not any(p in _SHUTDOWN for p in phases):
            phases.append(READY)
        return phases[-1] if phases else None


class Lifetimes:
    """The engine's router: one Lifetime per server start."""

    def __init__(self) -> None:
        self.all: list[Lifetime] = []
        self._by_pid: dict[tuple[int, str | None, int], Lifetime] = {}
        self._last: dict[tuple[int, str | None], Lifetime] = {}  # (space, container) -> where its last line went
        self._spaces: dict[int, int] = {}  # input -> the input whose server it continues (itself: another server)

    def route(self, rule: Rule, line: Line) -> tuple[Facts, dict[str, Match]]:
        w = who(line)
        w.space = self._space(line.source, w)
        life = self._find(w, start=rule.phase == START)
        if rule.phase == START:
            kind = (rule.id, w.process)
            if life is None or _restart(life, kind, w):
                life = self._open(w, superseded=life)
            life.kinds.add(kind)
        elif life is None:
            life = self._open(w, superseded=None)  # output before any start: a lifetime cut at its head
            life.headless = True
        if rule.phase == READY and life.ready_at is None:  # uvicorn's lines carry no time: the last one seen
            life.ready_at = (w.time if w.own_clock or not life.own_clock else life.ended) or life.ended or "?"
        self._touch(life, w, line)
        return life.facts, life.matches

    def _find(self, w: Who, start: bool) -> Lifetime | None:
        if w.pid is not None:
            known = self._by_pid.get((*w.key, w.pid))
            if known is not None:
                return known
            mine = [life for life in self.all if _key(life) == w.key]
            if start and w.process == "APIServer" and mine and mine[-1].owner not in (None, w.pid):
                return None  # another API server: another server (or a restart with a new pid)
            below = [life for life in mine if life.owner is not None and life.owner <= w.pid]
            if below:
                return max(below, key=lambda life: (life.owner or 0, life.index))
        return self._last.get(w.key)

    def _space(self, source: int, w: Who) -> int:
        """Several inputs are separate servers unless an input continues a process of an earlier
        one: its first line with a pid has that pid in the same container, at a time not before
        that lifetime's end (a rotated log). Its lines before that one wait in a space of their own
        and join the earlier server with it."""
        if source in self._spaces:
            return self._spaces[source]
        if w.pid is None:
            return source  # undecided yet
        self._spaces[source] = source
        t = seconds(w.time)
        for (space, container, pid), life in self._by_pid.items():
            end = seconds(life.ended)
            follows = t is not None and end is not None and t >= end
            if space != source and (container, pid) == (w.container, w.pid) and follows:
                self._spaces[source] = space
                self._rejoin(source, space)
                break
        return self._spaces[source]

    def _rejoin(self, source: int, space: int) -> None:
        """The lines an input routed before it was known to continue `space`: into that server's last lifetime."""
        for life in [x for x in self.all if x.space == source]:
            into = self._last.get((space, life.container))
            if into is None:
                life.space = space
                continue
            _merge(into, life)
            self.all.remove(life)
        self._last = {k: v for k, v in self._last.items() if k[0] != source}
        self._by_pid = {k: v for k, v in self._by_pid.items() if k[0] != source}

    def _open(self, w: Who, superseded: Lifetime | None) -> Lifetime:
        life = Lifetime(index=len(self.all) + 1, container=w.container, owner=w.pid, space=w.space)
        if superseded is not None:  # its processes died with it: their pids may come back (pid 1 in a container)
            for key in [k for k, v in self._by_pid.items() if v is superseded]:
                del self._by_pid[key]
        self.all.append(life)
        return life

    def _touch(self, life: Lifetime, w: Who, line: Line) -> None:
        if w.pid is not None:
            self._by_pid.setdefault((*w.key, w.pid), life)
            life.pids.add(w.pid)
            if life.owner is None:
                life.owner = w.pid
        if w.host:
            life.hosts.add(w.host)
        where = (line.source, line.no)
        if life.first is None:
            life.first = where
        if life.last is None or where > life.last:
            life.last = where
        if w.time and (w.own_clock or not life.own_clock):
            if w.own_clock and not life.own_clock:  # vLLM's clock wins over a collector's from here on
                life.own_clock, life.started = True, None
            life.started = life.started or w.time
            life.ended = w.time
        self._last[w.key] = life

    def lives(self) -> list[Lifetime]:
        """Every lifetime (each was opened by a line routed to it), renumbered from 1. A start that
        says nothing but its banner and arguments, right after output that had no start, is that
        output's header pasted below it (an excerpt), not a restart: it is merged into it. Output
        with no start that did not get past startup is part of the start below it (the error
        pasted above the banner), unless its times say it came before that start."""
        out: list[Lifetime] = []
        for life in self.all:
            head = next((o for o in reversed(out) if _key(o) == _key(life)), None)
            if head is not None and not head.kinds and life is self._latest(_key(life)) and _thin(life):
                _merge(head, life)
                continue
            if head is not None and ((not head.kinds and _prelude(head)) or _pasted_above(head, life)):
                # import-time warnings, or the error pasted above its start; a prelude of facts only
                # (the CPU build's import line) is the start's, but the start is still its banner
                _merge(life, head, before=True, lines=bool(head.matches) or not _prelude(head))
                out.remove(head)
            out.append(life)
        for i, life in enumerate(out, 1):
            life.index = i
        return out

    def _latest(self, key: tuple[int, str | None]) -> Lifetime | None:
        return next((life for life in reversed(self.all) if _key(life) == key), None)


def _key(life: Lifetime) -> tuple[int, str | None]:
    return life.space, life.container


def _thin(life: Lifetime) -> bool:
    """Only start markers: no match, no stats, no phase past the start."""
    stats = life.facts.stats
    return not (life.matches or stats.samples or stats.preemptions is not None or life.ready_at) and all(
        p[2] == START for p in life.facts.phases
    )


def _prelude(life: Lifetime) -> bool:
    """Output before any start with no progress and no blocker: what a start prints before its
    banner (import warnings, a detected platform), not the tail of an earlier lifetime."""
    stats = life.facts.stats
    return not (stats.samples or stats.preemptions is not None or life.ready_at or life.facts.phases) and all(
        m.rule.severity != "blocker" for m in life.matches.values()
    )


def _pasted_above(head: Lifetime, below: Lifetime) -> bool:
    """Output with no start marker that belongs to the start below it: it never became ready nor
    shut down (a tail of an earlier server would have), and it is not older than that start (a log
    cut at its head is the tail of the start before, written earlier)."""
    if not head.headless or head.progressed:
        return False
    ended, started = seconds(head.ended), seconds(below.started)
    return ended is None or started is None or ended >= started


def _merge(into: Lifetime, other: Lifetime, before: bool = False, lines: bool = True) -> None:
    """`other`'s facts, matches and lines into `into` (whose own facts win); `before`: other came
    first; not `lines`: its lines do not move where `into` begins and ends."""
    for name, value in other.facts.values.items():
        if name not in into.facts.values:
            into.facts.values[name] = value
            into.facts.where[name] = other.facts.where.get(name, 0)
    for rule_id, match in other.matches.items():
        into.matches.setdefault(rule_id, match)
    into.facts.phases.extend(other.facts.phases)
    into.facts.traceback.extend(other.facts.traceback)
    into.kinds |= other.kinds
    into.pids |= other.pids
    into.hosts |= other.hosts
    ends = [x for x in (into.first, into.last, *((other.first, other.last) if lines else ())) if x is not None]
    into.first, into.last = (min(ends), max(ends)) if ends else (None, None)
    if before:
        into.started = other.started or into.started
    else:
        into.started = into.started or other.started
        into.ended = other.ended or into.ended


def _restart(life: Lifetime, kind: tuple[str, str | None], w: Who) -> bool:
    """Whether a start marker begins a new lifetime after `life`: the same marker from the same
    process again, or any after it was ready or shut down. Output before any start (a log cut at
    its head) is a lifetime of its own, unless the marker is older than it: an excerpt pasted out
    of order (the arguments asked for, below the stats lines)."""
    if not life.kinds:
        earlier = seconds(w.time), seconds(life.ended)
        return not (earlier[0] is not None and earlier[1] is not None and earlier[0] < earlier[1])
    return kind in life.kinds or life.progressed


def from_this_host(lives: list[Lifetime], snapshot: Any) -> bool:
    """Whether the log comes from this machine: its hostname (syslog, a pod's name) is ours, or
    a pid it names holds memory on this machine's GPUs now."""
    name = platform.node()  # (gethostname(); platform is loaded already, socket would cost 3 ms a start)
    names = {name, name.split(".")[0]}
    hosts = set().union(*(life.hosts for life in lives)) if lives else set()
    if hosts & names:
        return True
    pids = set().union(*(life.pids for life in lives)) if lives else set()
    devices = getattr(snapshot, "devices", None) or []
    return any(p.pid in pids for d in devices for p in d.processes)


def _duration(a: str | None, b: str | None) -> str | None:
    sa, sb = seconds(a), seconds(b)
    if sa is None or sb is None or sb < sa:
        return None
    d = sb - sa
    return f"{d} s" if d < 120 else f"{d // 60} min" if d < 7200 else f"{d // 3600} h"


def hhmm(time: str | None) -> str:
    return time[6:11] if time and len(time) >= 11 else (time or "?")


@dataclass
class Ending:
    ready: bool
    last_phase: str | None
    end: str  # fatal | shutdown | serving | abrupt
    outcome: str  # one phrase for the timeline
    note: str | None  # what to check, for an ending with no sign of why
    last_stats: dict[str, Any] | None


def ending(life: Lifetime, status: str, top_category: str | None) -> Ending:
    """How a lifetime ended: a fatal error, a clean shutdown, still serving, or nothing (abrupt)."""
    phases = [p[2] for p in life.facts.phases]
    phase = life.last_phase()
    last = life.facts.stats.last
    stats = None
    if last is not None:
        sample = last[2]
        known = {k: sample[k] for k in ("running", "waiting", "kv_usage_pct") if sample.get(k) is not None}
        stats = {"line": last[0], **known}  # 0.7.0's stats line prints no KV usage: none, not null
    took = _duration(life.started, life.ended)
    after = f", {took} after start" if took else ""
    if status == "failed":
        return Ending(life.ready, phase, "fatal", top_category or "failed", None, stats)
    if "shutdown_complete" in phases or "shutdown_started" in phases:
        done = "shut down" if "shutdown_complete" in phases else "shutdown begun, not finished"
        since = f"served since {hhmm(life.ready_at or life.started)}, " if life.ready else ""
        what = since + done if life.ready else f"{done} during {PHASE_WORDS.get(_before_shutdown(phases) or START)}"
        return Ending(
            life.ready, phase, "shutdown", what + (f" at {hhmm(life.ended)}" if life.ended else ""), None, stats
        )
    doing = _doing(stats)
    if life.ready:
        since = f" since {hhmm(life.ready_at or life.started)}" if (life.ready_at or life.started) else ""
        note = (
            f"the log ends while serving{doing}, with no shutdown: the server is still running, or it was "
            "killed from outside (OOM killer, a liveness probe, SIGKILL); if it is gone, check `dmesg` / "
            "`kubectl describe pod` (Last State) / `docker inspect` (OOMKilled, ExitCode)"
        )
        return Ending(True, phase, "serving", f"serving{since}", note, stats)
    where = PHASE_WORDS.get(phase or START, phase or "startup")
    note = (
        f"the log stops during {where}{after}, with no error and no shutdown: killed from outside "
        "(OOM killer, a liveness or startup probe, SIGKILL), or the log was cut; check `dmesg` / "
        "`kubectl describe pod` (Last State) / `docker inspect` (OOMKilled, ExitCode)"
    )
    return Ending(False, phase, "abrupt", f"stopped during {where}", note, stats)


def _before_shutdown(phases: list[str]) -> str | None:
    rest = [p for p in phases if p not in _SHUTDOWN]
    return rest[-1] if rest else None


def _doing(stats: dict[str, Any] | None) -> str:
    if not stats:
        return ""
    parts = [f"{stats[k]} {k}" for k in ("running", "waiting") if stats.get(k) is not None]
    if stats.get("kv_usage_pct") is not None:
        parts.append(f"KV cache {stats['kv_usage_pct']}%")
    return f" (last stats, line {stats['line']}: {', '.join(parts)})" if parts else ""


def crash_loop(categories: list[str | None]) -> tuple[str, int, int] | None:
    """(cause, first, last lifetime index) of the latest run of CRASH_LOOP or more failed starts
    in a row with one cause (None for a start that did not fail)."""
    found = None
    run_start = 0
    for i, c in enumerate(categories):
        if i == 0 or c != categories[i - 1]:
            run_start = i
        if c is not None and i - run_start + 1 >= CRASH_LOOP:
            found = (c, run_start + 1, i + 1)
    return found
