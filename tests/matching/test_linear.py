"""The linear-time subset --rules patterns compile in (matching/linear.py): what it refuses and
why, bounded by the pattern's structure (its length, its repetition counts, its RE2 program),
and the search interface the engine uses, with the same group names and groupdict() as the
regex module."""

from __future__ import annotations

import random
import sys

import pytest
import regex

from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.matching import linear
from vllm_doctor.matching.linear import MAX_CHARS, MAX_PROGRAM, MAX_REPEAT, NotLinear, compile_linear
from vllm_doctor.matching.loader import load

REFUSED = [  # (pattern, what the one line says)
    ("a{1000000000}", "a repetition count may be at most 1000"),  # RE2 alone would read this as literal text
    ("a{1001}", "a repetition count may be at most 1000"),
    ("x{2,99999999999999999999}", "a repetition count may be at most 1000"),
    ("(?:x{1,100}){1,100}y", "nested repeats multiply to 10,000 copies"),
    ("((a{10}){10}){11}", "nested repeats multiply to 1,100 copies"),
    ("(?:foo){e<=3}", "fuzzy matching"),
    ("(?:foo){i<=1,d<=1}", "fuzzy matching"),
    ("(?:foo){2<e<=3}", "fuzzy matching"),
    ("(?:foo){1i+1d<=3}", "fuzzy matching"),
    ("(?:foo){e}", "fuzzy matching"),
    ("(?:foo){e<3", "fuzzy matching"),  # unclosed
    ("a{,5}", "{,5} means {0,5} to the regex module but literal text to RE2"),
    ("(?<!x)abc", "negative lookbehind"),
    ("(?<=x)abc", "lookbehind"),
    ("abc(?=x)", "lookahead"),
    ("abc(?!x)", "negative lookahead"),
    ("(?>a+)b", "atomic group"),
    ("a++b", "possessive repeat"),
    (r"(a)\1", "backreference"),
    ("(?:abcdefghij){1000}", "compiles to 10,00"),  # 10,000 characters to match: over MAX_PROGRAM
    (r"\pL{1000}", "too large"),
    ("(unclosed", "missing )"),
    ("a" * (MAX_CHARS + 1), f"a pattern may have at most {MAX_CHARS:,}"),
]

ACCEPTED = [  # the other attacks, linear under RE2, and the common safe forms
    "(?:a|b|ab)+c",
    "(a+)+$",
    r"(\w+\s?)*$",
    r"(?:x{1,10}){1,10}y",
    "x{1000}",
    r"KV cache size: (?P<tokens>\d[\d,]*) tokens",
    r"non-default args: (?P<args>\{.*)",
    r"\{'model': '(?P<m>[^']+)'",  # an escaped brace
    "{'model': x}",  # a brace that is no repeat: literal text in both engines
    "a{}b{,}c",
    r"[{}]{2}",
    r"\x{41}{3}",
    "[[:alpha:]]{3,5}",
    r"\Q{e<=3}\E",
    "it happened(?# a comment){2}",
]


@pytest.mark.parametrize(("pattern", "reason"), REFUSED, ids=[p[:40] for p, _ in REFUSED])
def test_refused_with_one_line_saying_why(pattern, reason):
    with pytest.raises(NotLinear) as e:
        compile_linear(pattern)
    assert reason in str(e.value), e.value.problems
    assert len(e.value.problems) == 1 and "\n" not in str(e.value)


@pytest.mark.parametrize("pattern", ACCEPTED)
def test_accepted_and_bounded_by_its_program(pattern):
    rx = compile_linear(pattern)
    assert 0 < rx._rx.programsize <= MAX_PROGRAM


def test_counts_are_refused_before_anything_compiles(monkeypatch):
    """a{1000000000} cost 23.7 GB in the regex module; RE2 reads it as literal text. Neither
    is asked: the scan of the pattern refuses the count."""
    monkeypatch.setitem(sys.modules, "re2", None)  # an import of it now fails
    monkeypatch.setattr(regex, "compile", _never)
    for pattern in ("a{1000000000}", "(?:x{1,100}){1,100}y", "(?:foo){e<=3}"):
        assert "google-re2" not in str(linear.problems(pattern))


def test_a_megabyte_pattern_is_refused_before_any_scan(monkeypatch):
    monkeypatch.setattr(linear, "_scan", _never)
    [problem] = linear.problems("x" * (1 << 20))
    assert problem == f"is 1,048,576 characters long: a pattern may have at most {MAX_CHARS:,}"


def test_the_limits_are_re2s_own():
    assert MAX_REPEAT == 1000  # RE2 refuses more (kMaxRepeat), counts nested ones multiplied
    with pytest.raises(NotLinear, match="nested repeats"):
        compile_linear("(?:(?:x{1,10}){1,10}){1,11}")


def _never(*a, **k):
    raise AssertionError("reached")


def test_without_google_re2_a_pattern_is_refused_with_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "re2", None)
    assert linear.problems("it happened") == [
        "needs the google-re2 package to compile in linear time (pip install google-re2)"
    ]


CASES = [  # (pattern, texts): groupdict() must come out as the regex module's
    (r"it happened (?P<n>\d+)(?: of (?P<total>\d+))?", ["it happened 3", "it happened 3 of 4", "nothing"]),
    (r"(?P<a>x)|(?P<a>y)", ["x", "y", "z"]),
    (r"(?P<a>x)(?P<a>y)", ["xy"]),
    (r"(?P<a>x)?(?P<a>y)", ["xy", "y"]),
    (r"(?P<a>x)(?P<a>y)?", ["x"]),
    (r"(?P<a__2>q)?(?P<a>x)|(?P<a>y)", ["qx", "y"]),  # a user's own name like the internal one
    (r"(?<short>\d+) tokens(?# wrap fallback)", ["512 tokens", "tokens"]),
    (r"(?i)cuda (?P<what>out of memory)", ["CUDA Out Of Memory"]),
    (r"é(?P<w>\w+)", ["éabc"]),
]


@pytest.mark.parametrize(("pattern", "texts"), CASES)
def test_groups_come_out_as_the_regex_module_gives_them(pattern, texts):
    rx, ref = compile_linear(pattern), regex.compile(pattern, regex.VERSION0)
    assert rx.groupindex.keys() == ref.groupindex.keys()
    for text in texts:
        got, want = rx.search(text), ref.search(text)
        assert (got is None) == (want is None), text
        if got is not None:
            assert got.groupdict() == want.groupdict(), text
            assert got.group(0) == want.group(0) and got.span() == want.span()
        assert [m.groupdict() for m in rx.finditer(text + " " + text)] == [
            m.groupdict() for m in ref.finditer(text + " " + text)
        ]


TOKENS = ["a", "é", "\\", "\\d", "\\Q", "\\E", "\\x{41}", "[", "]", "^", "[:alpha:]", "(", ")", "(?:", "(?#", "(?P<n>",
          "(?<m>", "(?=", "|", "*", "+", "?", "{", "}", ",", "3", "1000", "{2,5}", "{e<=1}", "{,4}", "-"]  # fmt: skip


def test_any_pattern_text_gets_an_answer_and_what_is_accepted_is_bounded():
    """Seeded random pattern text: the scan always ends (each step moves on), never raises but
    NotLinear, and whatever it accepts compiles within the program limit."""
    rng = random.Random(10)
    accepted = 0
    for _ in range(3000):
        text = "".join(rng.choice(TOKENS) for _ in range(rng.randint(1, 30)))
        found = linear.problems(text)
        assert all(isinstance(p, str) and "\n" not in p for p in found)
        if not found:
            accepted += 1
            assert compile_linear(text)._rx.programsize <= MAX_PROGRAM
    assert accepted > 100


def test_text_that_utf8_cannot_hold_is_searched_not_raised():
    rx = compile_linear(r"it happened (?P<n>\d+)")
    assert rx.search("\udcff it happened 3").groupdict() == {"n": "3"}


def test_the_builtin_patterns_are_in_the_subset_and_agree_with_the_regex_module():
    """Every built-in pattern compiles in RE2 (the engine runs no other dialect), and on its
    examples and counter-examples finds the groups the regex module finds for the same text."""
    rules = load(checks=CHECKS)
    agree = 0
    for r in rules:
        for p in r.patterns:
            rx = compile_linear(p.regex)
            ref = regex.compile(p.regex, regex.VERSION0)
            for text in [p.example or "", *p.counter_examples]:
                got, want = rx.search(text), ref.search(text)
                assert (got and got.groupdict()) == (want and want.groupdict()), (r.id, text)
                agree += 1
    assert agree > 300
