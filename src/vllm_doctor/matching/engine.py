"""Run the rules over candidate lines: fill the facts, collect what each diagnosis rule matched.

The engine knows nothing about vLLM. A rule is tried only on lines that hold one of its anchors;
when its pattern does not match the line alone, it is tried again on the line joined to its
neighbours (up to five lines on), which undoes terminal hard-wraps and split messages.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice, takewhile
from typing import Any, Protocol

from vllm_doctor.data import EVIDENCE_CHARS, Line, Match, Pattern, Rule, cut_evidence
from vllm_doctor.facts import ARGS, MANY, SERIES_FIELDS, Facts, convert
from vllm_doctor.matching.linear import encodable
from vllm_doctor.matching.loader import compile_regex
from vllm_doctor.read import bulk, lineparse
from vllm_doctor.read.bulk import Family
from vllm_doctor.read.logread import CONTEXT_AFTER, Bulk  # the lines after a hit the reader delivers
from vllm_doctor.read.prefilter import Prefilter

MAX_EVIDENCE = 6  # evidence lines kept per rule


class Router(Protocol):
    """Where a match's facts go: one store per server lifetime (knowledge/lifetimes.py), so that
    facts and matches never cross a restart. The engine only asks; it knows no lifetime."""

    def route(self, rule: Rule, line: Line) -> tuple[Facts, dict[str, Match]]: ...


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
        self._family, self.prefilter.families = _families(rules, by_anchor, list(anchors))
        if self._family:
            self.prefilter.bulk_ids = frozenset(self._family)
            self.prefilter.take = self._take
        self._run: list | None = None  # the bulk lines being read: [key, facts, first Line, last Line]
        # rules that mark a phase go first on a line, a start first of all: a restart's banner opens
        # its lifetime before the same line's other facts (the version, the model, the cache size)
        self._order = {i: (r.phase != "server_start", r.phase is None, i) for i, r in enumerate(rules)}
        self._router: Router | None = None

    def run(self, lines: Iterable[Line | Bulk], facts: Facts, router: Router | None = None) -> dict[str, Match]:
        """Feed every candidate line through the rules; returns diagnosis matches by rule id.
        With a router, each match fills the facts and matches the router gives for its line."""
        matches: dict[str, Match] = {}
        self._router = router
        covered: dict[int, tuple[int, int]] = {}  # rule index -> (source, last line used by a match)
        for prev, line, nexts in _neighbourhoods(lines):
            if isinstance(line, Bulk):
                self._bulk(line, facts, covered)
                continue
            if not line.hit:
                continue
            self._end_run()
            candidates = sorted({r for a in line.anchors for r in self._by_anchor[a]}, key=self._order.__getitem__)
            for index in candidates:
                done = covered.get(index)
                floor = done[1] if done and done[0] == line.source else 0
                if line.no <= floor:
                    continue
                used = self._match_rule(index, prev, line, nexts, floor, facts, matches)
                if used:
                    covered[index] = (line.source, used)
        self._end_run()
        return matches

    def _take(self, raw: bytes, ids: set[int]) -> tuple | None:
        """A hit line of one family read whole, as _match_rule would read it alone: (rule index,
        its text, the matches' groups, None), as read/bulk.py gives a family's line; None where
        the general path must read it (another prefix, a payload, a pattern that matches only
        joined to the next line)."""
        families = {self._family[i] for i in ids}
        if len(families) != 1:
            return None
        text = raw.decode("utf-8", "replace")
        parsed = lineparse.plain(text)
        if parsed is None or parsed[1].endswith((lineparse.PAYLOAD, lineparse.PAYLOAD_OPEN)):
            return None
        index = families.pop()
        found = self._search(index, self.rules[index].patterns[0], parsed[1], parsed[3])
        return (index, text, found, None) if found else None

    def _bulk(self, item: Bulk, facts: Facts, covered: dict[int, tuple[int, int]]) -> None:
        """A family's line (or run of lines) read in bulk: its facts, as _record fills them.
        Consecutive ones of one process go to one lifetime: it is asked for the first line of
        the run and told the last (_end_run), which is the state asking for each gives."""
        index, text, found, last = item.taken
        done = covered.get(index)
        if isinstance(text, bulk.Columns):
            self._columns(index, text, bisect_right(text.nos, done[1]) if done and done[0] == item.source else 0,
                          item.source, facts, covered)  # fmt: skip
            return
        if done and done[0] == item.source and item.no <= done[1]:
            return
        key = lineparse.plain_key(text)
        rule = self.rules[index]
        run = self._run
        if run is None or run[0] != (index, item.source, key):
            self._end_run()
            line = _plain_line(item.no, item.source, text)[0]
            if self._router is not None:
                facts = self._router.route(rule, line)[0]
            run = self._run = [(index, item.source, key), facts, line, line]
        else:  # within a run only its last line is routed (_end_run): the others are only filled
            line = _filled_line(item.no, item.source, text)
        if last is None:
            for groups in found:
                _fill_facts(rule, groups, line, run[1])
            run[3] = line
        else:  # a run of a counted family (access lines): each value as often as it was seen
            [group] = rule.facts
            for value, times in found.items():
                _fill_facts(rule, {group: value}, line, run[1], times)
            run[3] = _filled_line(last[0], item.source, last[1])
        covered[index] = (item.source, run[3].no)

    def _columns(self, index: int, batch: bulk.Columns, j: int, source: int, facts: Facts, covered) -> None:
        """A batch of a read family's lines from line j on, as _bulk reads each: a run per
        process (the lines that share a prefix), its facts filled a column at a time."""
        rule, n = self.rules[index], len(batch.nos)
        while j < n:
            text = batch.text(j)
            key = lineparse.plain_key(text)
            # the lines after j that share its run key (process and container), in C
            k = j + 1 + len(list(takewhile(batch.keys[j].__eq__, islice(batch.keys, j + 1, None))))
            run = self._run
            started = run is None or run[0] != (index, source, key)
            if started:
                self._end_run()
                line = _plain_line(batch.nos[j], source, text)[0]
                if self._router is not None:
                    facts = self._router.route(rule, line)[0]
                run = self._run = [(index, source, key), facts, line, line]
            assert run is not None
            _fill_columns(rule, batch, j, k, source, run[1])
            if k - j > 1 or not started:  # a run's first line alone is its last: routed once
                run[3] = _filled_line(batch.nos[k - 1], source, batch.text(k - 1))
            covered[index] = (source, batch.nos[k - 1])
            j = k

    def _end_run(self) -> None:
        run, self._run = self._run, None
        if run is not None and run[3] is not run[2] and self._router is not None:
            last = run[3]
            self._router.route(self.rules[run[0][0]], _plain_line(last.no, last.source, last.raw)[0])

    def _match_rule(self, index, prev, line, nexts, floor, facts, matches) -> int:
        """Try one rule around one line; returns the last line number used, 0 when no match.

        Patterns go in the rule's order, each over every window, so a rule's full pattern on
        the joined lines of a wrapped message wins over its short fallback on one line (which
        would lose the message's numbers)."""
        rule = self.rules[index]
        texts = _Cached(_texts(_windows(prev, line, nexts, floor)))
        for pattern in rule.patterns:
            for window, text in texts:
                found = self._search(index, pattern, text, window[0].level)
                if found:
                    self._record(rule, found, window, facts, matches)
                    return window[-1].no
        return 0

    def _search(self, index: int, pattern: Pattern, text: str, level: str | None) -> list[dict[str, Any]]:
        """The matches' groups of one pattern in one text. Every pattern is in RE2 (matching/linear.py:
        linear in the text), compiled on the first text that holds a literal it needs (literal.py)."""
        if pattern.level and level != pattern.level:
            return []
        if pattern.needs:
            seen = encodable(text)  # what RE2 reads
            if not any(n in seen for n in pattern.needs):
                return []
        rx = compile_regex(pattern.regex)
        if self.rules[index].kind == "fact":
            ms = list(rx.finditer(text))
        else:
            m = rx.search(text)
            ms = [m] if m else []
        if ms and pattern.unless and compile_regex(pattern.unless).search(text):
            ms = []
        return [{k: v for k, v in m.groupdict().items() if v is not None} for m in ms]

    def _record(self, rule: Rule, found: list[dict[str, str]], window: list[Line], facts: Facts, matches) -> None:
        line = window[0]
        if self._router is not None:
            facts, matches = self._router.route(rule, line)
        for groups in found:
            _fill_facts(rule, groups, line, facts)
        if rule.kind == "fact":
            return
        match = matches.get(rule.id)
        if match is None:
            match = matches[rule.id] = Match(rule=rule, first_line=line.no)
        for k, v in found[0].items():  # the first match's numbers; later ones fill what it lacked
            match.groups.setdefault(k, number(v))
        match.count += 1
        for w in window:
            if len(match.evidence) < MAX_EVIDENCE and not any(
                e.line == w.no and e.source == w.source for e in match.evidence
            ):
                match.evidence.append(cut_evidence(w.no, w.raw.strip(), w.source))


def _families(rules: list[Rule], by_anchor: list[list[int]], anchors: list[str]) -> tuple[dict[int, int], list[Family]]:
    """anchor id -> rule index, for the anchors only a family's rule holds (the fact rules of the
    access and stats series, one pattern each: their lines are most of a serving log), and the
    families whose rule has a bulk form (read/bulk.py)."""
    of: dict[int, int] = {}
    for anchor, holders in enumerate(by_anchor):
        rule = rules[holders[0]]
        if len(holders) == 1 and rule.series in ("access", "stats") and not rule.phase and len(rule.patterns) == 1:
            of[anchor] = holders[0]
    families = []
    for index in sorted(set(of.values())):
        rule = rules[index]
        if rule.bulk and all(anchors.index(a) in of for a in rule.anchors):
            counted = rule.series == "access" and len(rule.facts) == 1
            families.append(Family(index, rule.bulk, tuple(a.encode() for a in rule.anchors), counted))
    return of, families


def _plain_line(no: int, source: int, text: str) -> tuple[Line, str]:
    """A family's line as a Line, and the prefix it shares with its process's other lines."""
    parsed = lineparse.plain(text)
    assert parsed is not None  # a family's form is a plain line (tests/matching/test_engine_bulk.py)
    key, message, process, level = parsed
    return Line(no=no, text=message, raw=text, source=source, process=process, level=level), key


def _filled_line(no: int, source: int, text: str) -> Line:
    """A family's line as _fill_facts reads it (its number, input and text: a family has no phase),
    without the prefix parse _plain_line gives the lines a router is asked about."""
    return Line(no=no, text=text, raw=text, source=source)


def _fill_facts(rule: Rule, groups: dict[str, str], line: Line, facts: Facts, times: int = 1) -> None:
    if rule.series:
        kinds = SERIES_FIELDS[rule.series]
        sample: dict[str, Any] = {}  # typed per field: a mangled line's "99.x%" or 5000-digit count is no value
        for group, text in groups.items():
            name = rule.facts.get(group)
            value = convert(kinds[name], text) if name else None
            if name and value is not None:
                sample[name] = value
        facts.add_sample(
            rule.series, sample, line, line.raw.strip()[: EVIDENCE_CHARS + 1], times
        )  # +1: cut_evidence() sees the cut
    else:
        for group, value in groups.items():
            name = rule.facts.get(group)
            if name == ARGS:
                facts.set_args(value, line.no)
            elif name is not None:
                facts.set(name, value, line.no)
    if rule.phase:
        facts.phases.append((line.no, line.source, rule.phase, line.process))


def _fill_columns(rule: Rule, batch: bulk.Columns, j: int, k: int, source: int, facts: Facts) -> None:
    """_fill_facts of the batch's lines j..k-1: a stats rule's columns converted whole and given
    to the series at once; a few lines, or any other rule's (or one naming a field twice), one by one."""
    named = [(rule.facts[g], values) for g, values in batch.groups.items() if rule.facts.get(g)]
    if rule.series != "stats" or k - j < MANY or len({name for name, _ in named}) < len(named):
        for i in range(j, k):
            groups = {g: v[i].decode() for g, v in batch.groups.items() if v[i] is not None}
            _fill_facts(rule, groups, _filled_line(batch.nos[i], source, batch.text(i)), facts)
        return
    kinds = SERIES_FIELDS["stats"]
    cols = {name: convert_column(kinds[name], values[j:k]) for name, values in named}
    facts.stats.add_many(cols, batch.nos[j:k], source, lambda i: batch.text(j + i).strip()[: EVIDENCE_CHARS + 1])


def number(text: str) -> int | float | str:
    """A captured group as a number when it reads as one ('8,192' -> 8192)."""
    t = text.replace(",", "").strip()
    try:
        return int(t)
    except ValueError:
        pass
    try:
        value = float(t)
    except ValueError:
        return text.strip()
    return value if value - value == 0 else text.strip()  # 1e999, nan and 5000-digit runs stay text


def convert_column(kind: type, values: Sequence[Any]) -> list[Any]:
    """convert() over a column of captured bytes (None where the group took no part), each distinct
    value converted once: a stats column repeats a few hundred values over thousands of lines."""
    distinct = list(dict.fromkeys(values))
    return list(map(dict(zip(distinct, _converted(kind, distinct), strict=True)).__getitem__, values))


def _converted(kind: type, values: list[Any]) -> list[Any]:
    """convert() of each value: one builtin over them where every one is a plain number, as
    convert() would read each."""
    if None not in values and b"" not in values:
        try:
            if kind is float:
                return list(map(float, values))
            if kind is int and max(map(len, values)) <= 15 and b"".join(values).isdigit():
                return list(map(int, values))
        except ValueError:
            pass
    return [None if v is None else convert(kind, v.decode()) for v in values]


def _windows(prev: Line | None, line: Line, nexts: list[Line], floor: int) -> Iterator[list[Line]]:
    """The line alone, then joined with its neighbours: the lines a wrapped or split message
    spans. Never reuses lines already matched, nor mixes two processes' interleaved lines."""
    yield [line]
    after: list[Line] = []
    for n in nexts:
        if n.source != line.source or n.no != line.no + len(after) + 1 or not _same_process(line, n):
            break
        after.append(n)
    before = prev
    if before and (before.source != line.source or before.no != line.no - 1 or before.no <= floor
                   or not _same_process(before, line)):  # fmt: skip
        before = None
    tail = before is not None and _is_tail(line, before)
    if tail and before is not None:
        yield [before, line]  # this line is the rest of the one before: join backwards first
    if after:
        yield [line, after[0]]
    if before:
        if not tail:
            yield [before, line]
        if after:
            yield [before, line, after[0]]
    for k in range(2, len(after) + 1):
        if k > 2 and not _bare(after[k - 1]):
            break  # past three lines, only lines that lost their prefix still belong to the message
        yield [line, *after[:k]]
        if before:
            yield [before, line, *after[:k]]


def _texts(windows: Iterator[list[Line]]) -> Iterator[tuple[list[Line], str]]:
    """Each window's lines joined as a terminal hard-wrap split them (glued as is), then as a
    message split at spaces (pieces stripped, one space between)."""
    for window in windows:
        texts = [w.text for w in window]
        yield window, "".join(texts)
        if len(window) > 1:
            yield window, " ".join(t.strip() for t in texts)


class _Cached:
    """An iterator that can be walked again: what was already produced is replayed, the rest is
    produced on demand (most lines match on the first try, and never join their neighbours)."""

    def __init__(self, it: Iterator):
        self._it: Iterator = it
        self._seen: list = []

    def __iter__(self):
        yield from self._seen
        for item in self._it:
            self._seen.append(item)
            yield item


def _same_process(a: Line, b: Line) -> bool:
    return a.process is None or b.process is None or a.process == b.process


def _bare(line: Line) -> bool:
    return line.level is None and line.process is None


def _is_tail(line: Line, before: Line) -> bool:
    """A line without a prefix after one with a prefix, starting mid-sentence: a wrapped remainder."""
    if not _bare(line) or _bare(before):
        return False
    head = line.text[:1]
    return bool(head) and (head.islower() or head in " ,.;:)]'\"")


def _without_payload_rest(lines: Iterable[Line | Bulk]) -> Iterator[Line | Bulk]:
    """The lines, less the rest of a request payload a terminal wrapped onto the next lines: a
    user's prompt is data, never a message (read/lineparse.py keeps only a payload line's head)."""
    open_at: tuple[int, int] | None = None  # (source, line) of the payload's last piece seen
    for line in lines:
        if isinstance(line, Bulk):  # a line with a prefix: it ends a payload, as any such line
            open_at = None
            yield line
            continue
        if open_at is not None:
            near = line.source == open_at[0] and 0 < line.no - open_at[1] <= lineparse.PAYLOAD_REST_LINES
            rest = lineparse.payload_rest(line.text, _bare(line)) if near else False
            if rest is not False:
                open_at = (line.source, line.no) if rest else None
                continue
            open_at = None
        if line.text.endswith(lineparse.PAYLOAD_OPEN):
            open_at = (line.source, line.no)
        if line.hit and line.text.endswith((lineparse.PAYLOAD, lineparse.PAYLOAD_OPEN)):
            line.hit = False  # its anchors were in the payload: no rule is tried on it (it stays a neighbour)
        yield line


def _neighbourhoods(
    lines: Iterable[Line | Bulk], after: int = CONTEXT_AFTER
) -> Iterator[tuple[Line | None, Line | Bulk, list[Line]]]:
    """(previous line, line, next lines) for every line, streaming. A bulk line is nobody's
    neighbour: it comes (alone) right after the line before it, in order."""
    size = after + 2
    buf: list[Line] = []
    later: dict[int, list[Bulk]] = {}  # id of a line not yet a centre -> the bulk lines after it
    for line in _without_payload_rest(lines):
        if isinstance(line, Bulk):
            if buf and buf[-1].no == line.no and buf[-1].source == line.source:
                later.setdefault(id(buf[-1]), []).append(line)  # read as context too: after it
                continue
            # no line read after this one neighbours the lines held: they are centres now (so
            # that a run of bulk lines holds nothing, however long)
            yield from _rest(buf, after, later)
            buf.clear()
            yield None, line, []
            continue
        buf.append(line)
        if len(buf) > size:
            del buf[0]
        if len(buf) >= after + 1:
            centre = len(buf) - after - 1
            yield (buf[centre - 1] if centre > 0 else None), buf[centre], buf[centre + 1 :]
            for item in later.pop(id(buf[centre]), ()):
                yield None, item, []
    yield from _rest(buf, after, later)


def _rest(buf: list[Line], after: int, later: dict[int, list[Bulk]]):
    """The lines held that have not been a centre yet (the last `after`, or all of a short input)."""
    for centre in range(max(0, len(buf) - after), len(buf)):
        yield (buf[centre - 1] if centre > 0 else None), buf[centre], buf[centre + 1 :]
        for item in later.pop(id(buf[centre]), ()):
            yield None, item, []
