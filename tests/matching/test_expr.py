from __future__ import annotations

import pytest

from vllm_doctor.matching.expr import Condition, ExprError, render


@pytest.mark.parametrize(
    ("text", "values", "expected"),
    [
        ("x", {"x": 3}, True),
        ("x", {"x": 0}, False),
        ("not x", {}, True),
        ("x > 1", {"x": 2}, True),
        ("x > 1", {}, False),  # unknown compares false
        ("not x > 1", {}, True),
        ("a == 'cache-full'", {"a": "cache-full"}, True),
        ("a and b", {"a": 1, "b": 0}, False),
        ("a or b", {"a": 0, "b": 1}, True),
        ("a and b or c", {"a": 0, "b": 1, "c": 1}, True),
        ("kv_cache.tokens >= 8192", {"kv_cache.tokens": 8192}, True),
        ("x == false", {"x": False}, True),
    ],
)
def test_condition(text, values, expected):
    assert Condition(text)(values) is expected


@pytest.mark.parametrize("text", ["", "x >", "and x", "x y", "x == __import__('os')", "x()"])
def test_bad_condition(text):
    with pytest.raises(ExprError):
        Condition(text)


def test_render():
    assert render("Lower to {n}", {"n": 8064}) == "Lower to 8064"
    assert render("{n:,} tokens", {"n": 8192}) == "8,192 tokens"
    assert render("{f}", {"f": 0.9000}) == "0.9"
    assert render("sizes {s}", {"s": [1, 2, 4]}) == "sizes 1, 2, 4"
    assert render("Lower to {n}", {}) is None
    assert render("{n.__class__}", {"n": 1}) is None  # no attribute access: unknown name


def test_placeholders_cannot_ask_for_widths_or_attributes():
    from vllm_doctor.matching.expr import bad_placeholders

    assert bad_placeholders("{n:>999999999}") == ["{n:>999999999}"]
    assert bad_placeholders("{n!r}") == ["{n!r}"]
    assert bad_placeholders("{n} {n:,} {x:.2f} -O '{\"level\": 0}'") == []
