"""The two small languages rule files use: `when` conditions and `{name}` templates.

Both only read values by name; neither can call anything, so a rule file stays data.

    when = "gpu_memory_utilization < 0.9 and not fit_max_model_len"
    when = "queue_kind == 'cache-full' or stats.preemptions > 0"
    action = "Lower --max-model-len to {fit_max_model_len}"
"""

from __future__ import annotations

import re
from typing import Any

_TOKEN = re.compile(
    r"\s*(?:(?P<num>-?\d+(?:\.\d+)?)|(?P<str>'[^']*'|\"[^\"]*\")|(?P<op>==|!=|<=|>=|<|>)"
    r"|(?P<word>[A-Za-z_][\w.]*))"
)
# {name}, {name:,} or {name:.2f}: no widths, so a rule file cannot ask for a gigabyte of padding
_TEMPLATE = re.compile(r"\{([A-Za-z_][\w.]*)(?::([,_]?(?:\.\d)?[fd%]?))?\}")
_BRACES = re.compile(r"\{[A-Za-z_][^{}]*\}")  # a literal {"json": 1} is not a placeholder


class ExprError(ValueError):
    pass


def _tokens(text: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExprError(f"cannot read {text[pos:]!r}")
        pos = m.end()
        if m["num"] is not None:
            out.append(("value", float(m["num"]) if "." in m["num"] else int(m["num"])))
        elif m["str"] is not None:
            out.append(("value", m["str"][1:-1]))
        elif m["op"] is not None:
            out.append(("op", m["op"]))
        elif m["word"] in ("and", "or", "not"):
            out.append((m["word"], None))
        elif m["word"] in ("true", "false"):
            out.append(("value", m["word"] == "true"))
        else:
            out.append(("name", m["word"]))
    return out


class Condition:
    """A parsed `when`: clauses joined by `or`, each a chain of `and`ed comparisons.

    A name that is unknown (None) makes any comparison with it false; alone it is false.
    """

    def __init__(self, text: str):
        self.text = text
        self.names: set[str] = set()
        self._any: list[list[tuple[bool, Any]]] = []
        clause: list[tuple[bool, Any]] = []
        toks = _tokens(text)
        if not toks:
            raise ExprError("empty condition")
        i = 0
        while i < len(toks):
            negate = False
            while i < len(toks) and toks[i][0] == "not":
                negate = not negate
                i += 1
            if i >= len(toks) or toks[i][0] not in ("name", "value"):
                raise ExprError(f"expected a name or value in {text!r}")
            left = toks[i]
            i += 1
            if i < len(toks) and toks[i][0] == "op":
                op = toks[i][1]
                if i + 1 >= len(toks) or toks[i + 1][0] not in ("name", "value"):
                    raise ExprError(f"expected a value after {op!r} in {text!r}")
                term: tuple[Any, Any, Any] = (left, op, toks[i + 1])
                i += 2
            else:
                term = (left, None, None)
            for tok in (term[0], term[2]):
                if tok and tok[0] == "name":
                    self.names.add(tok[1])
            clause.append((negate, term))
            if i < len(toks):
                kind = toks[i][0]
                if kind == "and":
                    i += 1
                elif kind == "or":
                    self._any.append(clause)
                    clause = []
                    i += 1
                else:
                    raise ExprError(f"expected 'and' or 'or' in {text!r}")
                if i >= len(toks):
                    raise ExprError(f"{text!r} ends with an operator")
        self._any.append(clause)

    def __call__(self, values: dict[str, Any]) -> bool:
        return any(all(neg != _term(term, values) for neg, term in clause) for clause in self._any)


def _value(tok, values):
    return values.get(tok[1]) if tok[0] == "name" else tok[1]


def _term(term, values) -> bool:
    left, op, right = term
    a = _value(left, values)
    if op is None:
        return a is not None and a is not False and a != 0 and a != "" and a != []
    b = _value(right, values)
    if a is None or b is None:
        return False
    try:
        if op == "==":
            return a == b
        if op == "!=":
            return a != b
        if op == "<":
            return a < b
        if op == "<=":
            return a <= b
        if op == ">":
            return a > b
        return a >= b
    except TypeError:
        return False


def bad_placeholders(text: str) -> list[str]:
    """Placeholders a template may not use (attribute access, widths, ...)."""
    return [m.group() for m in _BRACES.finditer(text) if not _TEMPLATE.fullmatch(m.group())]


def template_names(text: str) -> set[str]:
    return {m.group(1) for m in _TEMPLATE.finditer(text)}


def fmt(value: Any, spec: str = "") -> str:
    """How numbers read in summaries and fixes: 8192 -> '8192', 0.9000 -> '0.9', lists joined."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v) for v in value)
    if isinstance(value, (int, float)) and spec:
        return format(value, spec)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):  # a hostile log's 1e999 or nan
            return str(value)
        return f"{value:.4f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    return str(value)


def render(text: str, values: dict[str, Any]) -> str | None:
    """Fill `{name}` / `{name:,}` from values; None when a name is unknown."""
    missing = False

    def sub(m: re.Match) -> str:
        nonlocal missing
        value = values.get(m.group(1))
        if value is None:
            missing = True
            return ""
        try:
            return fmt(value, m.group(2) or "")
        except (ValueError, TypeError):
            return fmt(value)

    out = _TEMPLATE.sub(sub, text)
    return None if missing else out
