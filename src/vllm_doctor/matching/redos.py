"""Catch built-in rule patterns that backtrack catastrophically, before a hostile line finds them.

The built-in patterns compile in the regex module (some use lookarounds, which RE2 lacks); a
--rules pattern compiles in RE2's linear-time subset instead (linear.py) and needs neither
check. Two checks, both run by `vllm-doctor rules check rules/` (the test suite runs it):

- static: nested quantifiers that can split the same text in more than one way (`(a+)+`,
  `(\\w+\\s?)*`: exponential) and adjacent unbounded quantifiers over overlapping characters
  (`\\d+\\d+`, `.*\\s*.*`: polynomial);
- a timed probe: the pattern searched over lines built to make it backtrack (its own example
  cut short and repeated, its anchors followed by a long run of one character, ...) of the size
  the engine can hand it. A pattern that takes longer than PROBE_BUDGET on one of them is
  rejected: scanned a million times over a log it would hang the run.

The regex module's timeout is a last guard only: it is checked between steps and can fire
seconds late on a single long repeat.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

try:  # the parser of the standard `re` reads the regex-module syntax the rules use
    import re._constants as _c  # type: ignore[import-not-found]  # private, untyped
    import re._parser as _parser  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Python < 3.11 is not supported anyway
    _parser = None

PROBE_SIZE = 16 << 10  # the longest line the engine matches whole (logread.MAX_LINE)
PROBE_BUDGET = 0.1  # seconds one pattern may take on one probe line
FLOOD = ("a", "1", " ", ".", ",", "/", ":", "=", "-", "(", ")", "[", "]", "'", '"', "\\", "\t", "é", "█")

# A sample alphabet stands in for "every character" when comparing what two parts can match.
_ALPHABET = [chr(c) for c in range(32, 127)] + ["\t", "\n", "\r", "é", "█", "▄", "ß", "中", "\x00"]


def static_problems(pattern: str) -> list[str]:
    """Why the pattern can backtrack catastrophically, judged from its structure alone."""
    if _parser is None:
        return []
    try:
        tree = _parser.parse(pattern)
    except Exception:  # regex-module syntax `re` does not know: the probe still runs
        return []
    out: list[str] = []
    _walk(list(tree), out, tail_can_fail=False)
    return list(dict.fromkeys(out))


def _flat(seq: list) -> list:
    """The sequence with groups opened up: (a)(b) backtracks like ab."""
    out = []
    for op, av in seq:
        if op == _c.SUBPATTERN:
            out.extend(_flat(list(av[-1])))
        else:
            out.append((op, av))
    return out


def _walk(seq: list, out: list[str], tail_can_fail: bool) -> None:
    """Check every repeat in seq; tail_can_fail: whether what comes after seq can still fail
    (once nothing can, no backtracking happens: the search has its match)."""
    seq = _flat(seq)
    fails = _suffix_can_fail(seq)
    for i, (op, av) in enumerate(seq):
        after_can_fail = tail_can_fail or fails[i + 1]
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            lo, hi, body = av
            body = list(body)
            if hi == _c.MAXREPEAT:
                _adjacent(seq, i, out, tail_can_fail, fails)
            if hi > 1 and not _possessive_body(body):
                _nested(body, out)
            _walk(body, out, after_can_fail)
        elif op in (_c.POSSESSIVE_REPEAT, _c.ATOMIC_GROUP):
            continue  # never gives back what it took: cannot backtrack
        elif op == _c.SUBPATTERN:
            _walk(list(av[-1]), out, after_can_fail)
        elif op == _c.BRANCH:
            for alt in av[1]:
                _walk(list(alt), out, after_can_fail)
        elif op in (_c.ASSERT, _c.ASSERT_NOT):
            _walk(list(av[1]), out, True)


def _suffix_can_fail(seq: list) -> list[bool]:
    """fails[i]: whether seq[i:] can fail, for every i, in one pass from the end (a slice and a
    walk per position would make a long literal quadratic)."""
    fails = [False] * (len(seq) + 1)
    for i in range(len(seq) - 1, -1, -1):
        fails[i] = fails[i + 1] or _can_fail(seq[i : i + 1])
    return fails


def _can_fail(seq: list) -> bool:
    """Whether matching seq can fail (anything but optional parts)."""
    for op, av in seq:
        if op in (_c.AT, _c.ASSERT, _c.ASSERT_NOT, _c.GROUPREF):
            return True
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
            if av[0] > 0 and _can_fail(list(av[2])):
                return True
        elif op == _c.SUBPATTERN:
            if _can_fail(list(av[-1])):
                return True
        elif op == _c.ATOMIC_GROUP:
            if _can_fail(list(av)):
                return True
        elif op == _c.BRANCH:
            if all(_can_fail(list(a)) for a in av[1]):
                return True
        else:
            return True
    return False


def _possessive_body(body: list) -> bool:
    return len(body) == 1 and body[0][0] in (_c.ATOMIC_GROUP, _c.POSSESSIVE_REPEAT)


def _nested(body: list, out: list[str]) -> None:
    """A repeated body that can match one text in several ways: exponential backtracking."""
    start, nullable = _first(body)
    if nullable:
        out.append("a repeated group can match the empty string (like (a*)*): exponential backtracking")
        return
    for inner, follow in _inner_repeats(body, start):
        if _chars(inner) & follow:
            out.append(
                "nested quantifiers: a repeated group holds an unbounded repeat that can also match "
                "what follows it (like (a+)+ or (\\w+\\s?)*): exponential backtracking"
            )
            return


def _inner_repeats(seq: list, wrap: frozenset) -> Iterator[tuple[list, frozenset]]:
    """(body of each unbounded repeat inside seq, the characters that can follow it)."""
    for i, (op, av) in enumerate(seq):
        follow, nullable = _first(seq, i + 1)
        if nullable:
            follow = follow | wrap
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            lo, hi, body = av
            if hi == _c.MAXREPEAT:
                yield list(body), follow
            yield from _inner_repeats(list(body), follow)
        elif op == _c.SUBPATTERN:
            yield from _inner_repeats(list(av[-1]), follow)
        elif op == _c.BRANCH:
            for alt in av[1]:
                yield from _inner_repeats(list(alt), follow)


def _adjacent(seq: list, i: int, out: list[str], tail_can_fail: bool, fails: list[bool]) -> None:
    """An unbounded repeat followed (past optional parts) by another that can take the same
    characters: every split of a run between them is tried when what follows fails, for each
    start (polynomial backtracking)."""
    last = _last(list(seq[i][1][2]))
    for j in range(i + 1, len(seq)):
        op, av = seq[j]
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT) and av[1] == _c.MAXREPEAT:
            if last & _first(list(av[2]))[0] and (tail_can_fail or fails[j + 1]):
                out.append(
                    "adjacent unbounded quantifiers over the same characters (like \\d+\\w* or "
                    ".*\\s*.*) followed by text that can fail: polynomial backtracking"
                )
            return
        if not _first([(op, av)])[1]:  # a part that must match separates the two
            return


def _last(seq: list) -> frozenset:
    """The characters a sequence can end with."""
    out: set[str] = set()
    for op, av in reversed(seq):
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
            out |= _last(list(av[2]))
            if av[0] > 0 and not _first(list(av[2]))[1]:
                return frozenset(out)
            continue
        if op == _c.SUBPATTERN:
            inner = list(av[-1])
        elif op == _c.ATOMIC_GROUP:
            inner = list(av)
        elif op == _c.BRANCH:
            for alt in av[1]:
                out |= _last(list(alt))
            if not any(_first(list(a))[1] for a in av[1]):
                return frozenset(out)
            continue
        elif op in (_c.AT, _c.ASSERT, _c.ASSERT_NOT):
            continue
        else:
            out |= _atom(op, av)
            return frozenset(out)
        out |= _last(inner)
        if not _first(inner)[1]:
            return frozenset(out)
    return frozenset(out)


def _chars(seq: list) -> frozenset:
    """The characters a repeated body can consume (from the sample alphabet)."""
    out: set[str] = set()
    for op, av in seq:
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
            out |= _chars(list(av[2]))
        elif op == _c.SUBPATTERN:
            out |= _chars(list(av[-1]))
        elif op == _c.ATOMIC_GROUP:
            out |= _chars(list(av))
        elif op == _c.BRANCH:
            for alt in av[1]:
                out |= _chars(list(alt))
        else:
            out |= _atom(op, av)
    return frozenset(out)


def _first(seq: list, start: int = 0) -> tuple[frozenset, bool]:
    """(characters seq[start:] can start with, whether it can match the empty string)."""
    out: set[str] = set()
    for k in range(start, len(seq)):
        op, av = seq[k]
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
            first, nullable = _first(list(av[2]))
            out |= first
            if av[0] > 0 and not nullable:
                return frozenset(out), False
            continue
        if op == _c.SUBPATTERN:
            first, nullable = _first(list(av[-1]))
        elif op == _c.ATOMIC_GROUP:
            first, nullable = _first(list(av))
        elif op == _c.BRANCH:
            first, nullable = frozenset(), False
            for alt in av[1]:
                f, n = _first(list(alt))
                first |= f
                nullable = nullable or n
        elif op in (_c.AT, _c.ASSERT, _c.ASSERT_NOT):
            continue
        elif op == _c.GROUPREF:
            first, nullable = frozenset(_ALPHABET), True
        else:
            first, nullable = frozenset(_atom(op, av)), False
        out |= first
        if not nullable:
            return frozenset(out), False
    return frozenset(out), True


def _atom(op, av) -> set[str]:
    if op == _c.LITERAL:
        return {chr(av)}
    if op == _c.NOT_LITERAL:
        return {ch for ch in _ALPHABET if ord(ch) != av}
    if op == _c.ANY:
        return {ch for ch in _ALPHABET if ch != "\n"}
    if op == _c.IN:
        return {ch for ch in _ALPHABET if _in(ch, av)}
    if op == _c.CATEGORY:
        return {ch for ch in _ALPHABET if _category(ch, av)}
    return set(_ALPHABET)  # anything unknown: assume the worst


def _in(ch: str, items) -> bool:
    negate = False
    hit = False
    for op, av in items:
        if op == _c.NEGATE:
            negate = True
        elif op == _c.LITERAL:
            hit = hit or ord(ch) == av
        elif op == _c.RANGE:
            hit = hit or av[0] <= ord(ch) <= av[1]
        elif op == _c.CATEGORY:
            hit = hit or _category(ch, av)
        else:
            hit = True
    return hit != negate


def _category(ch: str, cat) -> bool:
    name = str(cat)
    if "DIGIT" in name:
        v = ch.isdigit()
    elif "SPACE" in name:
        v = ch.isspace()
    elif "WORD" in name:
        v = ch.isalnum() or ch == "_"
    elif "LINEBREAK" in name:
        v = ch == "\n"
    else:
        return True
    return not v if "NOT" in name else v


def probe_lines(
    pattern: str, anchors: list[str], example: str | None, size: int = PROBE_SIZE, only: set[str] | None = None
) -> Iterator[tuple[str, str]]:
    """(what, line) pairs of `size` characters built to make the pattern backtrack (only the
    lines described in `only`, when given)."""
    for what, make in _recipes(pattern, anchors, example):
        if only is None or what in only:
            yield what, make(size)


def _recipes(pattern: str, anchors: list[str], example: str | None) -> Iterator[tuple[str, Callable[[int], str]]]:
    make: Callable[..., str]
    seeds = list(dict.fromkeys([*anchors, *_literal_heads(pattern)]))
    for a in seeds:
        make = lambda n, a=a: _fill(a + " ", n)  # noqa: E731  (typed through `make`)
        yield f"{a!r} repeated", make
        for c in FLOOD:
            make = lambda n, a=a, c=c: a + c * (n - len(a))  # noqa: E731
            yield f"{a!r} then {c!r} repeated", make
            make = lambda n, a=a, c=c: c * (n - len(a)) + a  # noqa: E731
            yield f"{c!r} repeated then {a!r}", make
    if example:
        cuts = {len(example) - 1, max(1, len(example) - 5), len(example) // 2}
        cuts |= set(range(6, len(example), max(6, len(example) // 10)))
        for k in sorted(cuts):
            head, c = example[:k], example[k]
            make = lambda n, h=head: _fill(h, n)  # noqa: E731
            yield f"the example cut at {k} repeated", make
            make = lambda n, h=head, c=c: h + c * (n - len(h))  # noqa: E731
            yield f"the example cut at {k} then {c!r} repeated", make
    for c in FLOOD[:6]:
        make = lambda n, c=c: c * n  # noqa: E731
        yield f"{c!r} repeated", make


def _fill(unit: str, size: int) -> str:
    return (unit * (size // max(1, len(unit)) + 1))[:size]


def _literal_heads(pattern: str) -> list[str]:
    """The literal text each top-level alternative of the pattern starts with."""
    if _parser is None:
        return []
    try:
        tree = list(_parser.parse(pattern))
    except Exception:
        return []
    alts = tree[0][1][1] if len(tree) == 1 and tree[0][0] == _c.BRANCH else [tree]
    out = []
    for alt in alts:
        text = []
        for op, av in alt:
            if op != _c.LITERAL:
                break
            text.append(chr(av))
        if len(text) >= 3:
            out.append("".join(text))
    return out


def timed_search(rx, line: str, limit: float) -> float:
    """Seconds one search takes (the regex timeout stops a runaway one, eventually)."""
    start = time.perf_counter()
    try:
        rx.search(line, timeout=limit)
    except TimeoutError:
        pass
    return time.perf_counter() - start


def worst_lines(
    rx, pattern: str, anchors: list[str], example: str | None, keep: int = 3, screen: int = 4 << 10
) -> list[str]:
    """The probe lines (by description) the pattern is slowest on, judged on short ones: a
    pattern that backtracks on a line is already slow on its first few KiB."""
    timed = [(timed_search(rx, line, 0.5), what) for what, line in probe_lines(pattern, anchors, example, screen)]
    timed.sort(reverse=True)
    return [what for _t, what in timed[:keep]]


def probe(
    rx, pattern: str, anchors: list[str], example: str | None, size: int = PROBE_SIZE, budget: float = PROBE_BUDGET
) -> tuple[str, float] | None:
    """The probe line of `size` characters the compiled pattern takes longer than `budget` on
    (with the time), or None. Every probe line is tried short; the slowest few at full size."""
    worst = set(worst_lines(rx, pattern, anchors, example))
    for what, line in probe_lines(pattern, anchors, example, size, only=worst):
        took = timed_search(rx, line, budget * 5)
        if took > budget:  # twice more: a busy machine slows one run, a backtracking pattern every run
            took = min(took, *(timed_search(rx, line, budget * 5) for _ in range(2)))
        if took > budget:
            return what, took
    return None
