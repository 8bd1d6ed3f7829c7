"""The bulk of a serving log read a region at a time: one compiled scan per family, no Python
step per access line.

A running server writes an access line per request and a stats line every few seconds; each is
a hit of one fact rule's anchors only (matching/engine.py's families: a rule's `bulk` form, the
whole line as uvicorn or vLLM's logger writes it). When every anchor of the families in a region
lies in a line of its family's form (byte counts, and one findall per family present), the
region's other anchors are scanned without the families' (Prefilter.scan_general), and the
families' lines are read here: the stats lines as column batches (each line a sample), the
access lines as runs counted by status; where the stats lines between two picked lines are one
process's, they are one batch and the access lines among them one run, however the two
interleave (_merged). Elsewhere the region is read line by line, as any other.

A family's line may stand behind what collectors and terminals add (compose/pod names, docker or
CRI stamps: LEAD; ANSI colour around V1's `(APIServer pid=N)`, which the rules' forms allow): its
text is then what the general path reads (colour undone), and its run key (the form's `_key`
group, the process, with the container) keeps lines of two processes apart.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from itertools import accumulate, chain
from operator import add
from typing import Any

from vllm_doctor.read import lineparse
from vllm_doctor.read.bulkform import compile_form, lead_form
from vllm_doctor.read.prefilter import SMALL, find_each


@dataclass
class Family:
    key: int  # what the engine knows the family by (its rule's index)
    text: str  # the rule's bulk form (compile_form), compiled on first use: a startup log has no such line
    anchors: tuple[bytes, ...]  # the anchors only its rule holds
    counted: bool  # its lines are only counted by their one group's value (access), not read one by one
    finder: Any = None  # a hyperscan database of its anchors (_holds), made on first use; False: none
    spots: Any = None  # the same reporting every occurrence (_occurrences)

    fast: dict[bytes, re.Pattern[bytes]] = field(default_factory=dict)  # a literal lead -> its form (lead_form)
    missed: int = 0  # regions to go before the literal lead is tried again (_split)

    @cached_property
    def forms(self) -> tuple[re.Pattern[bytes], re.Pattern[bytes], re.Pattern[bytes], bytes, bytes]:
        return compile_form(self.text)

    # the newline before a whole line, the line as its first group, then its groups (compile_form)
    @property
    def form(self) -> re.Pattern[bytes]:
        return self.forms[0]

    @property
    def line(self) -> re.Pattern[bytes]:  # the same from the line's start (a match at a line's start)
        return self.forms[1]

    @property
    def whole(self) -> re.Pattern[bytes]:  # the same without its groups: whether a line is of the form (_strays)
        return self.forms[2]

    @cached_property
    def names(self) -> list[str]:  # the rule's groups, as a Found holds them
        return [name for name in self.form.groupindex if not name.startswith("_")]


def _holds(f: Family, data: bytes) -> bool:
    """Whether data holds one of f's anchors: a byte search each in short data, as the prefilter
    scans a short buffer (a startup log never loads hyperscan), else one scan of them all."""
    if len(data) <= SMALL:
        return any(a in data for a in f.anchors)
    if f.finder is None:
        f.finder = finder(f.anchors)
    return holds(f.finder, f.anchors, data)


def holds(db: Any, literals: tuple[bytes, ...], data: bytes) -> bool:
    """Whether data holds one of the literals: one multi-literal scan of finder()'s database (ten
    times faster than a search per literal over a region), stopped at the first, else (False:
    none) a search each."""
    if db is False:
        return any(a in data for a in literals)
    import hyperscan

    try:
        db.scan(data, match_event_handler=_stop)
    except hyperscan.ScanTerminated:
        return True
    return False


def _stop(*_: Any) -> bool:
    return True  # (hyperscan ends the scan)


def finder(anchors: tuple[bytes, ...], every: bool = False) -> Any:
    """A hyperscan database of the literals for holds() (every: reporting each occurrence);
    False without hyperscan."""
    try:
        import hyperscan
    except ImportError:
        return False
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    n = len(anchors)
    db.compile(
        expressions=[b"".join(b"\\x%02x" % c for c in a) for a in anchors],  # every byte as itself
        ids=list(range(n)),
        elements=n,
        flags=[0 if every else hyperscan.HS_FLAG_SINGLEMATCH] * n,  # whether, not where: one report per anchor
    )
    return db


def _occurrences(f: Family, region: bytes) -> list[int]:
    """Where each occurrence of f's anchors ends in the region, in order: one scan of them all."""
    if f.spots is None:
        f.spots = finder(f.anchors, every=True)
    if f.spots is False:
        return [end for end, _ in find_each(f.anchors, region)]
    found: list[int] = []
    keep = found.append
    f.spots.scan(region, match_event_handler=lambda _id, _start, end, _flags, _ctx: keep(end))
    return sorted(found)


SAMPLE = 64 << 10  # bytes at a region's head that tell whether a read family's lines are most of it
MAX_STRAYS = 256  # more lines of a family's anchors out of its form: the region is read line by line


@dataclass
class Found:
    """A family's lines in a region, in order, found once (_split, _read_lines)."""

    starts: list[int]  # where each line starts in the buffer
    lines: list[bytes]
    # per group of the rule, its value (bytes) in each line, None where it took no part
    groups: dict[str, Sequence[Any]]
    rest: bytes  # the region without them (their newlines stay): what may still hold the family's anchors
    keys: list[tuple]  # each line's run key: (container, process) where the line names them, else None
    timed: bool  # a line has a collector's stamp: a time
    bare: bool = False  # rest holds none of the family's anchors (known already: _split)

    @classmethod
    def of(cls, f: Family, starts: list[int], lines: list[bytes], groups: Sequence[Sequence[Any]], rest: bytes):
        """From the columns of the form's groups (its line aside)."""
        at, n = f.form.groupindex, len(lines)
        ctr, process = groups[at["_ctr"] - 2], groups[at["_key"] - 2] if "_key" in at else [None] * n
        timed = groups[at["_t1"] - 2].count(None) < n or groups[at["_t2"] - 2].count(None) < n
        named = {name: groups[at[name] - 2] for name in f.names}
        return cls(starts, lines, named, rest, list(zip(ctr, process, strict=True)), timed)

    def end(self, j: int) -> int:
        return self.starts[j] + len(self.lines[j])


class Present(list):
    """The families present in a covered region (a list of them), and each family's lines in it:
    key -> Found."""

    found: dict[int, Found]
    strays: list[tuple[int, int]]  # (start, end) of the lines holding a counted family's anchors out of its form


def covered(buf: bytearray, lo: int, cut: int, families: list[Family]) -> Present | None:
    """The families whose lines buf[lo:cut] holds, when every anchor of the families in it lies
    in a line of its family's form (or, for a counted family, in a few other lines: strays) and no
    such line holds another family's anchor; else None. A family none of whose anchors occur
    costs one scan for them all (a byte search each in a short region)."""
    region = bytes(buf[lo:cut])
    present = Present(f for f in families if _holds(f, region))
    present.found, present.strays = {}, []
    alone: set[int] = set()  # the families whose anchors are in their own lines only
    lined: list[tuple[Family, bytes]] = []  # a family's lines, to hold against the others' anchors
    for f in present:
        found = _split(region, lo, f) if f.counted else _read_lines(buf, lo, cut, region, f)
        if found is None:
            return None
        present.found[f.key] = found
        if f.counted and sum(g.counted for g in present) == 1 and (found.bare or not _holds(f, found.rest)):
            alone.add(f.key)  # none out of its lines: one split and one scan, no counting
            continue
        lines = b"\n".join(found.lines)  # (no anchor holds a newline)
        if f.counted:  # every anchor as often in its lines as in the region, or the rest in strays
            missing = {a: region.count(a) - lines.count(a) for a in f.anchors}
            if any(missing.values()) and not _strays(region, lo, f, missing, present.strays):
                return None
        elif _holds(f, found.rest):  # a read family: none of its anchors between its lines
            return None
        else:
            alone.add(f.key)
        lined.append((f, lines))
    # (a line of one family's form is of no other's: a family alone has no anchor in the others')
    if any(_holds(g, lines) for f, lines in lined for g in present if g is not f and g.key not in alone):
        return None
    return present


def _split(region: bytes, lo: int, f: Family) -> Found:
    """A family's lines in the region (buf[lo:...]) by one re.split of its form, which gives the
    text before a line, the line, its groups' values, in turn (no match object, no Python step a
    line); where each line starts, from the lengths of the texts and lines before it (and the
    newline before each, which the form takes). Where the region's lines share one literal lead
    (most serving logs: one API server, its lines alike), by that lead first (lead_form)."""
    fast = lead_form(region, f.forms, f.line, f.anchors, f.fast) if f.missed <= 0 else None
    f.missed -= 1
    if fast is not None:
        pattern, key = fast
        parts = pattern.split(region)
        step = 1 + pattern.groups
        texts, lines = parts[0::step], parts[1::step]
        rest = b"".join(texts)
        if not _holds(f, rest):  # each line of the family's anchors: the lines of this lead
            before = map(add, map(len, texts), chain((0,), map(len, lines)))
            starts = list(accumulate(before, initial=lo))[1:-1]  # (the last text ends the region)
            at = pattern.groupindex
            named: dict[str, Sequence[Any]] = {name: parts[at[name] :: step] for name in f.names}
            return Found(starts, lines, named, rest, [key] * len(lines), False, True)
        f.missed = MISSED  # lines of other leads here: the form's whole split, a while
    parts = f.form.split(b"\n" + region)
    step = 1 + f.form.groups
    texts, lines = parts[0::step], parts[1::step]
    before = map(add, map(len, texts), chain((0,), map(_NEWLINE_AFTER, map(len, lines))))
    starts = list(accumulate(before, initial=lo))[1:-1]  # (the last text ends the region)
    return Found.of(f, starts, lines, [parts[g::step] for g in range(2, step)], b"".join(texts))


_NEWLINE_AFTER = (1).__add__  # a line's length and the newline after it
MISSED = 16  # regions the whole split goes on for once a literal lead missed lines


def _read_lines(buf: bytearray, lo: int, cut: int, region: bytes, f: Family) -> Found | None:
    """The lines of a read family's form in the region. Where they are a few of its lines, the
    lines that hold its anchors (a form's line holds one, as the rule reads only such lines:
    tests/matching/test_engine_bulk.py), each matched alone: a search for the form's lead would
    try it at each line of a serving log whose lines share it ("(APIServer pid=1) "). Then no
    anchor of the family is out of its lines (rest is empty). None: a line holding one is of no form."""
    anchor = next(a for a in f.anchors if a in region)
    head = region[:SAMPLE]
    if head.count(anchor) * 4 >= head.count(b"\n"):  # most lines are (the head tells): one search for all
        return _split(region, lo, f)
    out: list[re.Match[bytes]] = []
    for end in _occurrences(f, region):
        if out and end <= out[-1].end() - lo:
            continue  # (in the line just read: an anchor holds no newline)
        m = f.line.match(buf, lo + region.rfind(b"\n", 0, end) + 1, cut)
        if m is None:
            return None
        out.append(m)
    line, *groups = zip(*map(re.Match.groups, out), strict=True)
    return Found.of(f, list(map(re.Match.start, out)), list(line), groups, b"")


def _strays(region: bytes, lo: int, f: Family, missing: dict[bytes, int], out: list[tuple[int, int]]) -> bool:
    """The lines of the region, not of f's form, that hold the occurrences of its anchors its
    lines do not (a startup's "Route: /v1/models" line holds the access lines' " /v1/"), added to
    out as (start, end) in the buffer, when there are a few and they hold every such occurrence;
    the caller reads them as hit lines (logread._select). Else False: the region is read line by
    line."""
    found: dict[int, int] = {}
    for a, n in missing.items():
        at = region.find(a) if n > 0 else -1
        while at >= 0:
            start = region.rfind(b"\n", 0, at) + 1
            end = region.find(b"\n", at)
            end = len(region) if end < 0 else end
            if start not in found and f.whole.fullmatch(region, start, end) is None:
                found[start] = end
                if len(found) > MAX_STRAYS:
                    return False
            at = region.find(a, end)
    if any(sum(region.count(a, s, e) for s, e in found.items()) != n for a, n in missing.items()):
        return False
    out.extend(sorted((lo + s, lo + e) for s, e in found.items()))
    return True


def entries(buf: bytearray, lo: int, cut: int, base: int, families: Present, spans: dict[int, tuple[int, int, bool]]):
    """(line no, what the line or run is, (), None) for the families' lines of buf[lo:cut] (a
    covered region, `base` lines before it), in order; and how far its newlines were counted
    (offset, newlines from lo to it), that the caller counts none twice. spans: line no -> (start, end, hit) of the
    lines picked in the region: a run never spans one, a picked context line of a family's form
    is read alone after it, a picked hit is read by the general path."""
    cursor = [lo, base]  # (offset, lines before it): each newline is counted once, in order
    out: list[tuple[int, Any, tuple[int, ...], None]] = []
    pos = lo
    for start, end, hit in sorted(spans.values()):
        if start < pos:
            continue
        _gap(buf, pos, start, families, cursor, out)
        if not hit:
            _gap(buf, start, end + 1, families, cursor, out)
        pos = end + 1
    _gap(buf, pos, cut, families, cursor, out)
    return out, (cursor[0], cursor[1] - base)


def _no(buf: bytearray, at: int, cursor: list[int]) -> int:
    cursor[1] += buf.count(b"\n", cursor[0], at)
    cursor[0] = at
    return cursor[1] + 1


def _gap(buf: bytearray, a: int, b: int, families: Present, cursor: list[int], out: list) -> None:
    """The families' lines of buf[a:b] (whole lines): a read family's lines in column batches
    (Columns), a batch ended by another family's line; the counted family's lines between two
    of those as one run."""
    if a >= b:
        return
    read = []  # (family, its lines, the first in buf[a:b], past the last)
    for f in families:
        if not f.counted:
            found = families.found[f.key]
            read.append((f, found, bisect_left(found.starts, a), bisect_left(found.starts, b)))
    if len(read) == 1 and read[0][2] < read[0][3]:
        f, found, i, k = read[0]
        first, end = found.starts[i], found.end(k - 1)
        if sum(map(len, found.lines[i:k])) + k - i - 1 == end - first:  # every line between is one of them
            _runs(buf, a, first, families, cursor, out)
            no = _no(buf, first, cursor)
            cursor[0], cursor[1] = end, cursor[1] + k - i - 1  # (counted just now: not again)
            out.append((no, (f.key, Columns.of(f, found, i, k, list(range(no, no + k - i))), None, None), (), None))
            _runs(buf, end, b, families, cursor, out)
            return
        if _one_process(found.keys, i, k) and _merges(families, found, i, b):
            _merged(buf, a, b, families, read[0], cursor, out)
            return
    lines = sorted(((found.starts[j], f, found, j) for f, found, i, k in read for j in range(i, k)), key=_first)
    pos, no, batch_key = a, 0, -1
    batch: Columns | None = None
    for start, f, found, j in lines:
        if start - pos > 1 and _runs(buf, pos, start, families, cursor, out):
            batch = None  # a run between: the batch before it is done
        no = no + 1 if batch is not None and start - pos == 1 else _no(buf, start, cursor)
        if batch is None or f.key != batch_key:
            batch, batch_key = Columns.of(f, found, j, j, []), f.key
            out.append((no, (f.key, batch, None, None), (), None))
        batch.add(found, j, no)
        pos = found.end(j)
    _runs(buf, pos, b, families, cursor, out)


def _one_process(keys: list[tuple], i: int, k: int) -> bool:
    """Whether a read family's lines i..k-1 all share the first one's process (and container):
    the lines the engine reads as one run, routed alike."""
    return keys[i][1] is not None and keys[i:k].count(keys[i]) == k - i


def _merges(families: Present, found: Found, i: int, b: int) -> bool:
    """Whether the counted family's lines from the read family's line i to b may follow its batch
    (_merged): none has a time, and each names no process (bare uvicorn lines) or the read lines' own."""
    key = found.keys[i]
    for g in families:
        if g.counted:
            c = families.found[g.key]
            ci, ck = bisect_left(c.starts, found.end(i)), bisect_left(c.starts, b)
            if ci < ck and (c.timed or not all(k == key or k == (key[0], None) for k in set(c.keys[ci:ck]))):
                return False
    return True


def _merged(buf: bytearray, a: int, b: int, families: Present, read: tuple, cursor: list[int], out: list) -> None:
    """buf[a:b] whose read family's lines are of one process, with the counted family's lines
    among them: the counted lines before the first read line as one run, the read lines as one
    batch, the counted lines after its first line as one run. The same as the interleaved
    batches and runs _gap gives: a counted line carries no process, pid or time (its form holds
    none), so after the first read line each goes where that one went (knowledge/lifetimes.py),
    and its facts are counts, whatever their order."""
    f, found, i, k = read
    first = found.starts[i]
    _runs(buf, a, first, families, cursor, out)
    runs = []  # (family, its lines, the first after the batch's first line, past its last): one key (_merges)
    for g in families:
        if g.counted:
            c = families.found[g.key]
            ci, ck = bisect_left(c.starts, found.end(i)), bisect_left(c.starts, b)
            if ci < ck:
                runs.append((g, c, ci, ck))
    at = sorted([*found.starts[i:k], *(c.starts[j] for _, c, ci, ck in runs for j in (ci, ck - 1))])
    no = dict(zip(at, map(partial(_no, buf, cursor=cursor), at), strict=True))  # (counted in order)
    out.append(
        (no[first], (f.key, Columns.of(f, found, i, k, [no[s] for s in found.starts[i:k]]), None, None), (), None)
    )
    for g, c, ci, ck in runs:
        out.append(_run(g, c, ci, ck, no[c.starts[ci]], no[c.starts[ck - 1]]))


def _first(entry: tuple) -> int:
    return entry[0]


class Columns:
    """A batch of one read family's lines, in order, as columns: the line numbers, each line's
    bytes, its run key, and per group of the rule its values (bytes, None where it took no part)."""

    __slots__ = ("nos", "lines", "keys", "groups")

    def __init__(self, nos: list[int], lines: list[bytes], keys: list[tuple], groups: dict[str, list]):
        self.nos = nos
        self.lines = lines
        self.keys = keys
        self.groups = groups  # (in the order of the form's groups, as groupdict() gives them)

    @classmethod
    def of(cls, f: Family, found: Found, i: int, k: int, nos: list[int]) -> Columns:
        """Lines i..k-1 of a family's found lines, numbered nos."""
        groups = {name: list(values[i:k]) for name, values in found.groups.items()}
        return cls(nos, found.lines[i:k], found.keys[i:k], groups)

    def add(self, found: Found, j: int, no: int) -> None:
        """One more line, found's line j."""
        self.nos.append(no)
        self.lines.append(found.lines[j])
        self.keys.append(found.keys[j])
        for name, values in found.groups.items():
            self.groups[name].append(values[j])

    def text(self, j: int) -> str:
        return text(self.lines[j])


def text(line: bytes) -> str:
    """A family's line as the general path reads it (candidates.clean): colour codes undone."""
    s = line.decode("utf-8", "replace")
    return lineparse.strip_colour(s) if "\x1b" in s else s


def _runs(buf: bytearray, a: int, b: int, families: Present, cursor: list[int], out: list) -> bool:
    """The counted family's lines of buf[a:b] as one run (the engine makes one such family);
    whether there were any."""
    before = len(out)
    for f in families:
        if not f.counted or a >= b:
            continue
        c = families.found[f.key]
        first, past = bisect_left(c.starts, a), bisect_left(c.starts, b)  # (b starts a line: each is whole in a..b)
        for i, k in _one_key(c.keys, first, past):
            no = _no(buf, c.starts[i], cursor)
            out.append(_run(f, c, i, k, no, _no(buf, c.starts[k - 1], cursor)))
    return len(out) > before


def _one_key(keys: list[tuple], i: int, k: int) -> list[tuple[int, int]]:
    """Lines i..k-1 as spans of one run key each (lines of two processes are two runs)."""
    if i >= k or keys[i:k].count(keys[i]) == k - i:
        return [(i, k)] if i < k else []
    out, start = [], i
    for j in range(i + 1, k):
        if keys[j] != keys[j - 1]:
            out.append((start, j))
            start = j
    return [*out, (start, k)]


def _counts(values: Sequence) -> dict:
    """Each value's count, in the order first seen (as Counter): one count each where there are a
    few (a run's statuses), three times faster than Counter's step a value."""
    distinct = dict.fromkeys(values)
    return {v: values.count(v) for v in distinct} if len(distinct) <= 8 else Counter(values)


def _run(f: Family, c: Found, i: int, k: int, no: int, last_no: int) -> tuple:
    """The entry of a counted family's run, its lines i..k-1: its first line, its values' counts,
    its last line."""
    [values] = c.groups.values()  # (a counted family's one group)
    run = {v.decode(): n for v, n in _counts(values[i:k]).items()}
    return no, (f.key, text(c.lines[i]), run, (last_no, text(c.lines[k - 1]))), (), None
