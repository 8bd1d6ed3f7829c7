"""The linear-time subset every rule pattern compiles in, built in or from `--rules DIR`: RE2 (google-re2).

RE2 matches without backtracking: a search costs at most (program size) steps per character of
the text, whatever the text holds. With the pattern's length, every repetition count and the
compiled program bounded here, `rules check` promises a pattern runs in linear time and
fixed memory from its structure alone, and times nothing. What RE2 cannot run (lookarounds,
backreferences, atomic groups, possessive repeats, fuzzy matching) is refused with one line.

Limits, the first two checked before anything compiles (one pass over the pattern text):
- MAX_CHARS characters of pattern text;
- MAX_REPEAT for each repetition count, and for the counts of nested repeats multiplied
  (`(?:x{1,100}){1,100}` is 10,000 copies of x: refused; RE2's own limit is the same 1000,
  but RE2 reads a count it cannot parse, like {1000000000}, as literal text);
- MAX_PROGRAM instructions in the compiled program (the constant of the linear bound), and
  RE2's memory budget (MAX_MEM) for the program and its DFA cache while compiling and matching.

Two forms of the regex module's syntax are accepted and rewritten: `(?#...)` comments are
dropped, and a group name used twice (`(?P<n>a)|(?P<n>b)`) gives one name in groupdict(), as
the regex module gives it. `{,5}` (the regex module's {0,5}, RE2's literal text) is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

MAX_CHARS = 4096
MAX_REPEAT = 1000
MAX_PROGRAM = 8192
MAX_MEM = 8 << 20  # RE2's default budget per pattern: the compiled program and its DFA cache

_NAMED = re.compile(r"\(\?P?<([A-Za-z_][A-Za-z0-9_]*)>")
_COUNTED = re.compile(r"\{(\d*)(,?)(\d*)\}")
# the regex module's fuzzy constraints: {e<=3}, {i<=1,d<=1}, {2<e<=3}, {1i+1d<=3}, {e}, {e<=3:[a-z]}
_FUZZY = re.compile(r"\{\s*(?:\d+\s*<=?\s*)?[eids]\s*(?:<=?|[,}:])|\{\s*\d+[eids](?:\s*\+\s*\d+[eids])*\s*<=?")
_HINTS = (  # RE2's error, the part of the regex module's syntax it means
    ("(?=", "lookahead (?=...)"),
    ("(?!", "negative lookahead (?!...)"),
    ("(?<=", "lookbehind (?<=...)"),
    ("(?<!", "negative lookbehind (?<!...)"),
    ("(?>", "atomic group (?>...)"),
    ("++", "possessive repeat"),
    ("*+", "possessive repeat"),
    ("?+", "possessive repeat"),
    ("}+", "possessive repeat"),
    ("invalid escape sequence: \\1", "backreference"),
)


class NotLinear(ValueError):
    """A pattern outside the linear-time subset; str() is the first reason, `.problems` all."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(problems[0])


def problems(text: str) -> list[str]:
    """Why the pattern is outside the linear-time subset, one line each; [] when it is inside."""
    try:
        compile_linear(text)
    except NotLinear as e:
        return e.problems
    return []


def compile_linear(text: str) -> LinearPattern:
    """The pattern compiled by RE2 behind the search interface the engine uses; NotLinear when
    it is outside the subset (or google-re2 is not installed)."""
    too_long = length_problem(text)
    if too_long:
        raise NotLinear([too_long])
    rewritten, names, found = _scan(text)
    if found:
        raise NotLinear(found)
    try:
        import re2
    except ImportError:
        raise NotLinear(["needs the google-re2 package to compile in linear time (pip install google-re2)"]) from None
    options = re2.Options()
    options.log_errors = False  # RE2 would print each error on stderr too
    options.max_mem = MAX_MEM
    try:
        rx = re2.compile(rewritten, options)
    except re2.error as e:
        raise NotLinear([_reason(e)]) from None
    if rx.programsize > MAX_PROGRAM:
        raise NotLinear(
            [
                f"compiles to {rx.programsize:,} RE2 instructions (at most {MAX_PROGRAM:,}): shorten it, "
                "lower its repetition counts, or split its alternatives into several [[patterns]]"
            ]
        )
    return LinearPattern(text, rx, names)


def length_problem(text: str) -> str | None:
    """The first check of any pattern that is not built in, before anything reads it further."""
    if len(text) > MAX_CHARS:
        return f"is {len(text):,} characters long: a pattern may have at most {MAX_CHARS:,}"
    return None


def _reason(error: Exception) -> str:
    raw = error.args[0] if error.args else ""
    message = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    for needle, what in _HINTS:
        if needle in message:
            return f"uses a {what}, which is not in the linear-time subset (RE2): {message}"
    if "pattern too large" in message:
        return f"is too large for RE2's {MAX_MEM >> 20} MiB budget: {message}"
    return f"does not compile in RE2, the linear-time subset: {message}"


def _scan(text: str) -> tuple[str, dict[str, list[str]], list[str]]:
    """One pass over the pattern: (the text RE2 compiles, each group name -> RE2's names for
    it, the problems). Tracks groups to multiply the counts of nested repeats."""
    out: list[str] = []
    found: list[str] = []
    taken = set(_NAMED.findall(text))
    names: dict[str, list[str]] = {}
    stack = [1]  # per open group: the largest product of nested counts inside it
    last: int | None = None  # what a repeat here multiplies: 1 for an atom, a group's product
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            j, last = _escape_end(text, i), 1
        elif c == "[":
            j, last = _class_end(text, i), 1
        elif c == "(" and text.startswith("(?#", i):
            end = text.find(")", i)
            i = n if end < 0 else end + 1  # a comment: RE2 has none, and it matches nothing
            continue
        elif c == "(":
            stack.append(1)
            m, last = _NAMED.match(text, i), None
            if m:
                out.append(f"(?P<{_internal(m.group(1), names, taken)}>")
                i = m.end()
                continue
            j = i + 1
        elif c == ")":
            last = stack.pop() if len(stack) > 1 else 1
            stack[-1] = max(stack[-1], last)
            j = i + 1
        elif c == "|":
            j, last = i + 1, None
        elif c == "{":
            j, last = _braces(text, i, last, stack, found)
        else:
            j = i + 1
            if c not in "*+?":
                last = 1
        out.append(text[i:j])
        i = j
    return "".join(out), names, list(dict.fromkeys(found))


def _internal(name: str, names: dict[str, list[str]], taken: set[str]) -> str:
    """RE2's name for this group: the name itself the first time, then a fresh one that no
    group of the pattern has (`taken` holds them all)."""
    seen = names.setdefault(name, [])
    internal, k = name, len(seen)
    while seen and internal in taken:
        internal = f"{name}__{k}"
        k += 1
    taken.add(internal)
    seen.append(internal)
    return internal


def _braces(text: str, i: int, last: int | None, stack: list[int], found: list[str]) -> tuple[int, int | None]:
    """A `{` outside a class: a counted repeat (checked), fuzzy matching or `{,m}` (refused),
    or literal text. Returns where it ends and what a repeat after it would multiply."""
    m = _COUNTED.match(text, i)
    if m and m.group(1):
        lo = _count(m.group(1))
        hi = lo if not m.group(2) else (_count(m.group(3)) if m.group(3) else None)
        if max(lo, hi or 0) > MAX_REPEAT:
            found.append(f"repeats {m.group(0)[:40]}: a repetition count may be at most {MAX_REPEAT}")
            return m.end(), last
        product = (last or 1) * (hi if hi is not None else lo)
        if product > MAX_REPEAT:
            found.append(
                f"nested repeats multiply to {product:,} copies (at {m.group(0)}): "
                f"the counts of nested repeats may multiply to at most {MAX_REPEAT}"
            )
        stack[-1] = max(stack[-1], product)
        return m.end(), product
    if m and m.group(2) and m.group(3):
        found.append(f"{m.group(0)} means {{0,{m.group(3)}}} to the regex module but literal text to RE2: write it so")
        return m.end(), 1
    if _FUZZY.match(text, i):
        found.append("uses fuzzy matching ({e<=N}), which is not in the linear-time subset")
        end = text.find("}", i)
        return (len(text) if end < 0 else end + 1), 1
    return i + 1, 1  # a brace that is no repeat: literal text, to RE2 as to the regex module


def _count(digits: str) -> int:
    return MAX_REPEAT + 1 if len(digits) > 9 else int(digits)


def _escape_end(text: str, i: int) -> int:
    """The end of the escape at text[i] (a backslash): \\x, \\x{...}, \\p{...}, \\Q...\\E."""
    if i + 1 >= len(text):
        return len(text)
    c = text[i + 1]
    if c == "Q":
        end = text.find("\\E", i + 2)
        return len(text) if end < 0 else end + 2
    if c in "pPxN" and text.startswith("{", i + 2):
        end = text.find("}", i + 3)
        return len(text) if end < 0 else end + 1
    return i + 2


def _class_end(text: str, i: int) -> int:
    """The end of the character class that starts at text[i] ('[')."""
    k, n = i + 1, len(text)
    if k < n and text[k] == "^":
        k += 1
    if k < n and text[k] == "]":  # a ']' first is literal
        k += 1
    while k < n:
        c = text[k]
        if c == "\\":
            k += 2
        elif c == "[" and text.startswith("[:", k):
            end = text.find(":]", k + 2)
            k = k + 1 if end < 0 else end + 2
        elif c == "]":
            return k + 1
        else:
            k += 1
    return n


class LinearPattern:
    """An RE2 pattern behind the regex module's interface the engine and `rules check` use:
    search and finditer, groupindex, and
    matches whose groupdict() has the pattern's own group names."""

    __slots__ = ("_index", "_rx", "pattern")

    def __init__(self, pattern: str, rx: Any, names: dict[str, list[str]]):
        self.pattern, self._rx = pattern, rx
        index = rx.groupindex  # (google-re2 builds this dict anew on each ask, and on each group by name)
        self._index = {name: tuple(index[i] for i in internal) for name, internal in names.items()}

    @property
    def groupindex(self) -> dict[str, int]:
        return {name: groups[0] for name, groups in self._index.items()}

    def search(self, string: str, pos: int | None = None, endpos: int | None = None):
        m = self._rx.search(encodable(string), pos, endpos)
        return None if m is None else LinearMatch(m, self._index)

    def finditer(self, string: str, pos: int | None = None, endpos: int | None = None) -> Iterator[LinearMatch]:
        for m in self._rx.finditer(encodable(string), pos, endpos):
            yield LinearMatch(m, self._index)


def encodable(text: str) -> str:
    """The text with lone surrogates (which UTF-8 cannot hold, nor RE2 read) as '?': same length."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


class LinearMatch:
    """An RE2 match with the groups under the pattern's own names: a name used twice has the
    value of the last such group that took part (as in the regex module)."""

    __slots__ = ("_m", "_index")

    def __init__(self, m: Any, index: dict[str, tuple[int, ...]]):
        self._m, self._index = m, index  # name -> the numbers of its RE2 groups

    def group(self, *groups: int | str):
        if len(groups) > 1:
            return tuple(self.group(g) for g in groups)
        g = groups[0] if groups else 0
        if isinstance(g, str):
            if g not in self._index:
                raise IndexError("no such group")
            values = [self._m[i] for i in self._index[g]]
            return next((v for v in reversed(values) if v is not None), None)
        return self._m.group(g)

    __getitem__ = group

    def groupdict(self, default=None) -> dict[str, Any]:
        m, out = self._m, {}
        for name, index in self._index.items():
            v = m[index[0]] if len(index) == 1 else self.group(name)
            out[name] = default if v is None else v
        return out

    def start(self, group: int = 0) -> int:
        return self._m.start(group)

    def end(self, group: int = 0) -> int:
        return self._m.end(group)

    def span(self, group: int = 0) -> tuple[int, int]:
        return self._m.span(group)

    @property
    def string(self) -> str:
        return self._m.string
