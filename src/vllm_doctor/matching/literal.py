"""The literal text every match of a pattern contains: the engine's gate before it asks RE2.

A rule's anchors bring a line to the rule; its patterns are then tried on the line and on the
windows of its neighbours, a few hundred RE2 searches in a startup log, nearly all of which fail.
A search whose pattern needs "Maximum concurrency" in a text without it cannot match, so the
engine skips it, and a pattern no text ever reaches is never compiled (RE2's compile and the DFA
states its first searches build were a third of a cold `explain`). Read once, when the rule is
parsed (kept with the parsed rules), with Python's own regex parser: a pattern it reads
otherwise than RE2 does, or cannot read, needs nothing and is always searched.
"""

from __future__ import annotations

import warnings

MIN_CHARS = 3  # a shorter literal is in nearly every line: not worth a test

Needs = tuple[str, ...]  # every match contains at least one of these; () when nothing is known


def needs(regex: str) -> Needs:
    """The literals of which every match of `regex` contains one, as RE2 reads it; ()."""
    import re._constants as c  # type: ignore[import-not-found]  # (no stubs: Python's own regex parser)
    import re._parser as parser  # type: ignore[import-not-found]

    if "[:" in regex or "\\Q" in regex:  # RE2's [[:alpha:]] and \Q...\E are other things to Python
        return ()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a "possible nested set" and friends: read otherwise
            tree = parser.parse(regex)
    except Exception:  # RE2 syntax Python lacks (\pL, \x{41}, a name used twice): no gate
        return ()
    if tree.state.flags & c.SRE_FLAG_IGNORECASE:
        return ()
    return _best(_candidates(tree.data, c))


def _candidates(items: list, c) -> list[Needs]:
    """What a sequence of parsed items needs: each run of literal characters, and what each group,
    repeat of at least one and alternation in it needs."""
    out: list[Needs] = []
    run: list[str] = []
    for op, arg in items:
        if op is c.LITERAL:
            run.append(chr(arg))
            continue
        if run:
            out.append(("".join(run),))
            run = []
        if op is c.SUBPATTERN and not arg[1] & c.SRE_FLAG_IGNORECASE:  # (group, add flags, del flags, body)
            out += _candidates(arg[3].data, c)
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT) and arg[0] >= 1:  # (min, max, body)
            out += _candidates(arg[2].data, c)
        elif op is c.BRANCH:  # (None, [alternatives]): each alternative must need something
            each = [_best(_candidates(alternative.data, c)) for alternative in arg[1]]
            if all(each):
                out.append(tuple(sorted({s for alternative in each for s in alternative})))
    if run:
        out.append(("".join(run),))
    return out


def _best(candidates: list[Needs]) -> Needs:
    """The candidate whose shortest literal is longest (the rarest, roughly); () if none is long enough."""
    best = max(candidates, key=lambda n: min(map(len, n)), default=())
    return best if best and min(map(len, best)) >= MIN_CHARS else ()
