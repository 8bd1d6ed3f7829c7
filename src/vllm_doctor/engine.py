"""Run the rules over candidate lines: fill the facts, collect what each diagnosis rule matched.

The engine knows nothing about vLLM. A rule is tried only on lines that hold one of its anchors;
when its pattern does not match the line alone, it is tried again on the line joined to its
neighbours, which undoes terminal hard-wraps and messages split over two or three lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .data import Evidence, Line, Match, Rule
from .facts import ARGS, Facts, number
from .prefilter import Prefilter
from .rules import compile_regex

MAX_EVIDENCE = 6  # evidence lines kept per rule
EVIDENCE_CHARS = 400
REGEX_TIMEOUT = 1.0  # seconds one pattern may spend on one text (ReDoS guard)


class Engine:
    def __init__(self, rules: list[Rule]):
        self.rules = rules
        anchors: dict[str, int] = {}
        by_anchor: list[list[int]] = []
        for index, rule in enumerate(rules):
            for a in rule.anchors:
                if a not in anchors:
                    anchors[a] = len(anchors)
                    by_anchor.append([])
                by_anchor[anchors[a]].append(index)
        self.prefilter = Prefilter(anchors)
        self._by_anchor = by_anchor
        self._compiled: dict[int, list] = {}
        self.timeouts = 0

    def _patterns(self, index: int) -> list:
        compiled = self._compiled.get(index)
        if compiled is None:
            compiled = [
                (compile_regex(p.regex), compile_regex(p.unless) if p.unless else None, p.level)
                for p in self.rules[index].patterns
            ]
            self._compiled[index] = compiled
        return compiled

    def run(self, lines: Iterable[Line], facts: Facts) -> dict[str, Match]:
        """Feed every candidate line through the rules; returns diagnosis matches by rule id."""
        matches: dict[str, Match] = {}
        covered: dict[int, tuple[int, int]] = {}  # rule index -> (source, last line used by a match)
        for prev, line, nexts in _neighbourhoods(lines):
            if not line.hit:
                continue
            candidates = sorted({r for a in line.anchors for r in self._by_anchor[a]})
            for index in candidates:
                done = covered.get(index)
                floor = done[1] if done and done[0] == line.source else 0
                if line.no <= floor:
                    continue
                used = self._match_rule(index, prev, line, nexts, floor, facts, matches)
                if used:
                    covered[index] = (line.source, used)
        return matches

    def _match_rule(self, index, prev, line, nexts, floor, facts, matches) -> int:
        """Try one rule around one line; returns the last line number used, 0 when no match."""
        rule = self.rules[index]
        for window in _windows(prev, line, nexts, floor):
            for joiner in ("", " ") if len(window) > 1 else ("",):
                text = joiner.join(w.text for w in window)
                found = list(self._search(index, text, window[0].level))
                if found:
                    self._record(rule, found, window, facts, matches)
                    return window[-1].no
        return 0

    def _search(self, index: int, text: str, level: str | None) -> Iterator[dict[str, Any]]:
        rule = self.rules[index]
        for rx, unless, want_level in self._patterns(index):
            if want_level and level != want_level:
                continue
            try:
                if rule.kind == "fact":
                    ms = list(rx.finditer(text, timeout=REGEX_TIMEOUT))
                else:
                    m = rx.search(text, timeout=REGEX_TIMEOUT)
                    ms = [m] if m else []
                if ms and unless is not None and unless.search(text, timeout=REGEX_TIMEOUT):
                    ms = []
            except TimeoutError:
                self.timeouts += 1
                continue
            if ms:
                for m in ms:
                    yield {k: v for k, v in m.groupdict().items() if v is not None}
                return

    def _record(self, rule: Rule, found: list[dict[str, str]], window: list[Line], facts: Facts, matches) -> None:
        line = window[0]
        for groups in found:
            _fill_facts(rule, groups, line, facts)
        if rule.kind == "fact":
            return
        match = matches.get(rule.id)
        if match is None:
            match = matches[rule.id] = Match(rule=rule, first_line=line.no)
            match.groups = {k: number(v) for k, v in found[0].items()}
        match.count += 1
        for w in window:
            if len(match.evidence) < MAX_EVIDENCE and not any(
                e.line == w.no and e.source == w.source for e in match.evidence
            ):
                match.evidence.append(Evidence(w.no, w.raw.strip()[:EVIDENCE_CHARS], w.source))


def _fill_facts(rule: Rule, groups: dict[str, str], line: Line, facts: Facts) -> None:
    if rule.series:
        sample = {rule.facts[g]: number(v) for g, v in groups.items() if g in rule.facts}
        facts.stats.add(sample, line.no, line.source, line.raw.strip()[:EVIDENCE_CHARS])
    else:
        for group, value in groups.items():
            name = rule.facts.get(group)
            if name == ARGS:
                facts.set_args(value, line.no)
            elif name is not None:
                facts.set(name, value, line.no)
    if rule.phase:
        facts.phases.append((line.no, line.source, rule.phase, line.process))


def _windows(prev: Line | None, line: Line, nexts: list[Line], floor: int) -> Iterator[list[Line]]:
    """The line alone, then joined with its neighbours (never reusing lines already matched)."""
    yield [line]
    after = []
    for n in nexts:
        if n.source == line.source and n.no == line.no + len(after) + 1:
            after.append(n)
    before = prev if prev and prev.source == line.source and prev.no == line.no - 1 and prev.no > floor else None
    if after:
        yield [line, after[0]]
    if before:
        yield [before, line]
    if before and after:
        yield [before, line, after[0]]
    if len(after) > 1:
        yield [line, *after[:2]]


def _neighbourhoods(lines: Iterable[Line]) -> Iterator[tuple[Line | None, Line, list[Line]]]:
    """(previous line, line, next two lines) for every line, streaming."""
    buf: list[Line] = []
    for line in lines:
        buf.append(line)
        if len(buf) > 4:
            del buf[0]
        if len(buf) >= 3:
            centre = len(buf) - 3
            yield (buf[centre - 1] if centre > 0 else None), buf[centre], buf[centre + 1 :]
    # the last two lines (or all of a short input) have not been a centre yet
    start = max(0, len(buf) - 2)
    for centre in range(start, len(buf)):
        yield (buf[centre - 1] if centre > 0 else None), buf[centre], buf[centre + 1 :]
