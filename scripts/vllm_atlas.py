#!/usr/bin/env python3
"""Build the atlas of vLLM's messages and config defaults, per release, from vLLM's own source.

For each VERSION: `pip download --no-deps vllm==VERSION` into a wheel cache (a wheel already there
is reused), read `vllm/**.py` straight out of the wheel (a zip) and walk every module's AST for

  - `raise X("...")` (and `raise X(...) from e`) whose message is a literal, an f-string, a
    `"..." % (...)`, a `"...".format(...)`, a concatenation of those, or a name assigned such a
    value earlier in the same function (`msg = f"..."; msg += "..."; raise ValueError(msg)`);
  - `logger.debug/info/warning/error/exception/critical(...)` (and the `*_once` and `warn`
    forms), with %-style arguments, f-strings or `.format`;
  - the defaults of CacheConfig, SchedulerConfig, ModelConfig, ParallelConfig and EngineArgs.

The results go into the package (src/vllm_doctor/atlas/): messages.json.gz (each template with
its RE2-safe regex, anchor, kind, exception or level, file, function and the spans of releases it
appears in) and defaults.json (per release, each default with where it was read). Running it for
one new version adds that release to the files; --rebuild starts over; --diff A B prints what
changed between two releases in the data. Nobody edits the data by hand.

    .venv/bin/python scripts/vllm_atlas.py 0.35.0
    .venv/bin/python scripts/vllm_atlas.py --diff 0.34.0 0.35.0
"""

from __future__ import annotations

import argparse
import ast
import difflib
import gzip
import json
import re
import string
import subprocess
import sys
import zipfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "vllm_doctor" / "atlas"
WHEELS = Path("/tmp/vllm-atlas-wheels")
SCHEMA = "vllm-doctor/atlas/1"
DEFAULTS_SCHEMA = "vllm-doctor/atlas-defaults/1"

# the level a logger method prints (logger.exception logs at ERROR, with the traceback after it)
LOG_LEVELS = {
    "debug": "DEBUG",
    "debug_once": "DEBUG",
    "info": "INFO",
    "info_once": "INFO",
    "warning": "WARNING",
    "warning_once": "WARNING",
    "warn": "WARNING",
    "error": "ERROR",
    "exception": "ERROR",
    "critical": "CRITICAL",
}
LOGGER = re.compile(r"(?:self\.)?_?(?:logger|LOGGER)")
# a placeholder's group: bounded (RE2 and the regex module alike stay linear), non-greedy
GROUP = ".{0,200}?"
GROUP_LAST = ".{0,200}"  # at the end of a template a non-greedy group would always capture ""
MAX_NAME = 40
# wrappers whose argument names the value better than the wrapper does
WRAPPERS = {"str", "repr", "int", "float", "round", "abs", "bool", "format_gib", "tuple", "list", "sorted", "set"}
METHOD_WRAPPERS = {"lower", "upper", "capitalize", "title", "strip", "lstrip", "rstrip", "item", "tolist", "hex"}
PRINTF = re.compile(r"%(?:\((\w+)\))?([#0\- +]*)(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([diouxXeEfFgGcrsa%])")
META = set("\\.^$|?*+()[]{}")


@dataclass(frozen=True)
class Ph:
    """A placeholder: the short name of the interpolated expression and its format spec."""

    name: str
    spec: str = ""


Parts = list[str | Ph]


# ---------------------------------------------------------------- placeholders and templates


def name_of(expr: ast.expr) -> str:
    """A short identifier for an interpolated expression: `self.model_config.max_model_len` ->
    `max_model_len`, `config["max_len"]` -> `max_len`, `str(e)` -> `e`, `len(xs)` -> `len_xs`."""
    raw = _raw_name(expr)
    name = re.sub(r"\W+", "_", raw).strip("_")[:MAX_NAME].strip("_")
    if not name:
        return "value"
    return name if (name[0].isalpha() or name[0] == "_") and name.isascii() else "v_" + name


def _raw_name(expr: ast.expr) -> str:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return _raw_name(expr.value) if expr.attr.startswith("__") else expr.attr
    if isinstance(expr, ast.Subscript):
        key = expr.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value
        return _raw_name(expr.value)
    if isinstance(expr, ast.Call):
        func = expr.func.attr if isinstance(expr.func, ast.Attribute) else getattr(expr.func, "id", "")
        if expr.args and func in WRAPPERS:
            return _raw_name(expr.args[0])
        if expr.args and func == "len":
            return "len_" + _raw_name(expr.args[0])
        if func == "join" and expr.args:
            return _raw_name(expr.args[0])
        if not expr.args and func in METHOD_WRAPPERS and isinstance(expr.func, ast.Attribute):
            return _raw_name(expr.func.value)
        return func or "value"
    if isinstance(expr, ast.BinOp):
        return _raw_name(expr.left)
    if isinstance(expr, ast.IfExp):
        return _raw_name(expr.body)
    if isinstance(expr, ast.Starred):
        return _raw_name(expr.value)
    if isinstance(expr, ast.GeneratorExp | ast.ListComp):
        return _raw_name(expr.elt)
    return "value"


def _spec_text(spec: ast.expr | None) -> str:
    if not isinstance(spec, ast.JoinedStr):
        return ""
    if all(isinstance(v, ast.Constant) for v in spec.values):
        return "".join(str(v.value) for v in spec.values if isinstance(v, ast.Constant))
    return ""


class Scope:
    """The assignments of one function body (nested functions and classes left out), to resolve a
    message held in a variable: the last `name = ...` before the use, then every `name += ...`."""

    def __init__(self, body: list[ast.stmt], outer: Scope | None = None) -> None:
        self.outer = outer
        self.assigns: dict[str, list[tuple[tuple[int, int], str, ast.expr]]] = {}
        stack: list[ast.AST] = list(body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                continue
            target, op, value = None, "=", None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
                target, op, value = node.target, "+=", node.value
            if isinstance(node, ast.stmt) and isinstance(target, ast.Name) and value is not None:
                pos = (node.lineno, node.col_offset)
                self.assigns.setdefault(target.id, []).append((pos, op, value))
            stack.extend(ast.iter_child_nodes(node))
        for seq in self.assigns.values():
            seq.sort(key=lambda a: a[0])

    def lookup(self, name: str, pos: tuple[int, int]) -> list[tuple[tuple[int, int], ast.expr]] | None:
        """The expressions that make `name` at `pos`: its last assignment and the `+=` after it."""
        seq = [a for a in self.assigns.get(name, []) if a[0] < pos]
        starts = [i for i, a in enumerate(seq) if a[1] == "="]
        if not starts:
            if self.outer is not None and not seq:
                return self.outer.lookup(name, (10**9, 0))
            return None
        return [(p, v) for p, _, v in seq[starts[-1] :]]


class Builder:
    """Turns a message expression into template parts (literal text and placeholders)."""

    def __init__(self, scope: Scope | None) -> None:
        self.scope = scope

    def parts(self, expr: ast.expr, depth: int = 0) -> Parts | None:
        """The parts of a string-valued expression, or None when it is not one of the forms read."""
        if depth > 8:
            return None
        if isinstance(expr, ast.Constant):
            return [expr.value] if isinstance(expr.value, str) else None
        if isinstance(expr, ast.JoinedStr):
            return self._fstring(expr)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left, right = self.parts(expr.left, depth + 1), self.parts(expr.right, depth + 1)
            if left is None and right is None:
                return None
            return (left or [Ph(name_of(expr.left))]) + (right or [Ph(name_of(expr.right))])
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod):
            left = self.parts(expr.left, depth + 1)
            if left is None:
                return None
            rhs = expr.right
            args: list[ast.expr] | dict[str, ast.expr]
            if isinstance(rhs, ast.Tuple):
                args = list(rhs.elts)
            elif isinstance(rhs, ast.Dict):
                args = {
                    str(k.value): v for k, v in zip(rhs.keys, rhs.values, strict=True) if isinstance(k, ast.Constant)
                }
            else:
                args = [rhs]
            return printf(left, args)
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "format":
            base = self.parts(expr.func.value, depth + 1)
            return None if base is None else str_format(base, expr.args, expr.keywords)
        if isinstance(expr, ast.Name) and self.scope is not None:
            return self._variable(expr, depth)
        return None

    def _fstring(self, expr: ast.JoinedStr) -> Parts:
        out: Parts = []
        for v in expr.values:
            if isinstance(v, ast.Constant):
                out.append(str(v.value))
            elif isinstance(v, ast.FormattedValue):
                inner = v.value
                if isinstance(inner, ast.Constant) and isinstance(inner.value, str) and v.format_spec is None:
                    out.append(inner.value)
                else:
                    out.append(Ph(name_of(inner), _spec_text(v.format_spec)))
        return out

    def _variable(self, expr: ast.Name, depth: int) -> Parts | None:
        assert self.scope is not None
        chain = self.scope.lookup(expr.id, (expr.lineno, expr.col_offset))
        if not chain:
            return None
        out: Parts = []
        for i, (_, value) in enumerate(chain):
            got = self.parts(value, depth + 1)
            if got is None:
                if i == 0:
                    return None
                got = [Ph(name_of(value))]
            out.extend(got)
        return out


def printf(parts: Parts, args: list[ast.expr] | dict[str, ast.expr]) -> Parts:
    """%-formatting applied to the literal parts: each spec becomes a placeholder named after its
    argument (`%.2f` keeps `.2f` as the spec), `%%` becomes `%`."""
    out: Parts = []
    it = iter(args) if isinstance(args, list) else iter(())
    for part in parts:
        if isinstance(part, Ph):
            out.append(part)
            continue
        pos = 0
        for m in PRINTF.finditer(part):
            out.append(part[pos : m.start()])
            pos = m.end()
            key, flags, width, prec, conv = m.groups()
            if conv == "%":
                out.append("%")
                continue
            if key is not None and isinstance(args, dict):
                arg = args.get(key)
                name = key
            else:
                arg = next(it, None)
                name = name_of(arg) if arg is not None else "value"
            spec = flags + (width or "") + (f".{prec}" if prec else "")
            if spec or conv not in "sradiu":
                spec += conv
            out.append(Ph(name, spec))
        out.append(part[pos:])
    return out


def str_format(parts: Parts, args: list[ast.expr], keywords: list[ast.keyword]) -> Parts:
    """`"...".format(...)` applied to the literal parts: `{}`, `{0}` and `{name}` fields."""
    del keywords  # a `{name}` field is named by its keyword, whatever the value
    auto = 0
    out: Parts = []
    for part in parts:
        if isinstance(part, Ph):
            out.append(part)
            continue
        try:
            fields = list(string.Formatter().parse(part))
        except ValueError:
            out.append(part)
            continue
        for literal, field, spec, _conv in fields:
            out.append(literal)
            if field is None:
                continue
            base = re.split(r"[.\[]", field, maxsplit=1)[0]
            if base == "":
                arg = args[auto] if auto < len(args) else None
                auto += 1
                name = name_of(arg) if arg is not None else "value"
            elif base.isdigit():
                idx = int(base)
                name = name_of(args[idx]) if idx < len(args) else "value"
            else:
                name = name_of(ast.Name(base))
            out.append(Ph(name, spec if spec and "{" not in spec else ""))
    return out


def _merged(parts: Parts) -> Parts:
    out: Parts = []
    for p in parts:
        if isinstance(p, str):
            if not p:
                continue
            if out and isinstance(out[-1], str):
                out[-1] += p
                continue
        out.append(p)
    return out


def escape(text: str) -> str:
    """A literal for RE2 and Python's re alike: metacharacters escaped, control characters as \\n,
    \\t or \\xHH (never a raw newline in a pattern)."""
    out = []
    for ch in text:
        if ch in META:
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch < " " or ch == "\x7f":
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def render(parts: Parts) -> dict[str, Any] | None:
    """template, regex and anchor of the parts; None for a message without literal text."""
    parts = _merged(parts)
    if not any(isinstance(p, str) and p.strip() for p in parts):
        return None
    template, regex, used = [], [], set()
    for i, p in enumerate(parts):
        if isinstance(p, str):
            template.append(p.replace("{", "{{").replace("}", "}}"))
            regex.append(escape(p))
            continue
        template.append("{" + p.name + (":" + p.spec if p.spec else "") + "}")
        group, n = p.name, 1
        while group in used:
            n += 1
            group = f"{p.name}_{n}"
        used.add(group)
        regex.append(f"(?P<{group}>{GROUP_LAST if i == len(parts) - 1 else GROUP})")
    runs = [r.strip() for p in parts if isinstance(p, str) for r in p.split("\n")]
    anchor = max(runs, key=len)
    return {"template": "".join(template), "regex": "".join(regex), "anchor": anchor, "anchor_len": len(anchor)}


# ---------------------------------------------------------------- messages of one module


class Walker(ast.NodeVisitor):
    """Every raise and logger call of one module, with its qualified function."""

    def __init__(self, path: str, tree: ast.Module) -> None:
        self.path = path
        self.names: list[str] = []
        self.scopes: list[Scope] = [Scope(tree.body)]
        self.found: list[dict[str, Any]] = []

    def _enter(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.names.append(node.name)
        is_func = not isinstance(node, ast.ClassDef)
        if is_func:
            self.scopes.append(Scope(node.body, self.scopes[0]))
        self.generic_visit(node)
        if is_func:
            self.scopes.pop()
        self.names.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _enter

    def _add(self, parts: Parts | None, kind: str, key: str, value: str) -> None:
        out = render(parts) if parts is not None else None
        if out is not None:
            func = ".".join(self.names) or "<module>"
            self.found.append({**out, "kind": kind, key: value, "file": self.path, "func": func})

    def visit_Raise(self, node: ast.Raise) -> None:
        call = node.exc
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name | ast.Attribute):
            msg = call.args[0] if call.args else None
            for k in call.keywords:
                if msg is None and k.arg in ("msg", "message", "detail"):
                    msg = k.value
            if msg is not None and not isinstance(msg, ast.Starred):
                self._add(Builder(self.scopes[-1]).parts(msg), "raise", "exc", ast.unparse(call.func))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr in LOG_LEVELS
            and LOGGER.fullmatch(ast.unparse(f.value))
            and node.args
            and not isinstance(node.args[0], ast.Starred)
        ):
            parts = Builder(self.scopes[-1]).parts(node.args[0])
            if parts is not None and len(node.args) > 1:
                parts = printf(parts, list(node.args[1:]))
            self._add(parts, "log", "level", LOG_LEVELS[f.attr])
        self.generic_visit(node)


def messages(path: str, tree: ast.Module) -> list[dict[str, Any]]:
    """The templates of one module: every message raised or logged with literal text in it."""
    walker = Walker(path, tree)
    walker.visit(tree)
    return walker.found


# ---------------------------------------------------------------- config defaults

CLASSES = ("CacheConfig", "SchedulerConfig", "ModelConfig", "ParallelConfig", "EngineArgs")
# the defaults recorded: name -> (the config class that owns it, its field there)
WANTED = {
    "gpu_memory_utilization": ("CacheConfig", "gpu_memory_utilization"),
    "block_size": ("CacheConfig", "block_size"),
    "swap_space": ("CacheConfig", "swap_space"),
    "kv_cache_dtype": ("CacheConfig", "cache_dtype"),
    "enable_prefix_caching": ("CacheConfig", "enable_prefix_caching"),
    "enable_extensible_kv_cache": ("CacheConfig", "enable_extensible_kv_cache"),
    "max_num_seqs": ("SchedulerConfig", "max_num_seqs"),
    "max_num_batched_tokens": ("SchedulerConfig", "max_num_batched_tokens"),
    "enable_chunked_prefill": ("SchedulerConfig", "enable_chunked_prefill"),
    "max_model_len": ("ModelConfig", "max_model_len"),
    "enforce_eager": ("ModelConfig", "enforce_eager"),
    "tensor_parallel_size": ("ParallelConfig", "tensor_parallel_size"),
}
DEFAULT_CONST = re.compile(r"_?DEFAULT_[A-Z0-9_]+")
FIELD_CALLS = {"Field", "field"}


@dataclass
class ClassInfo:
    """One config class: its fields' default expressions and its constants, and its module's."""

    name: str
    path: str
    fields: dict[str, tuple[ast.expr, str]]
    consts: dict[str, ast.expr]
    module_consts: dict[str, ast.expr]


def _is_classvar(annotation: ast.expr) -> bool:
    return "ClassVar" in ast.unparse(annotation)


def class_info(path: str, node: ast.ClassDef, module: ast.Module) -> ClassInfo:
    """The fields of a dataclass / pydantic class (`x: T = default`), or of a plain class its
    `__init__` keyword defaults; class constants (ClassVar, unannotated) apart."""
    fields: dict[str, tuple[ast.expr, str]] = {}
    consts: dict[str, ast.expr] = {}
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            if _is_classvar(stmt.annotation):
                consts[stmt.target.id] = stmt.value
            else:
                fields[stmt.target.id] = (stmt.value, f"{node.name}.{stmt.target.id}")
        elif isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                if isinstance(t, ast.Name):
                    consts[t.id] = stmt.value
    for stmt in node.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            a = stmt.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults) :], a.defaults, strict=True))
            pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
            for arg, d in pairs:
                fields.setdefault(arg.arg, (d, f"{node.name}.__init__.{arg.arg}"))
    module_consts: dict[str, ast.expr] = {}
    for stmt in module.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            module_consts[stmt.targets[0].id] = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            module_consts[stmt.target.id] = stmt.value
    return ClassInfo(node.name, path, fields, consts, module_consts)


def find_classes(trees: dict[str, ast.Module]) -> dict[str, ClassInfo]:
    """Where each config class lives in this release: vllm/config.py, vllm/config/*.py or
    vllm/engine/arg_utils.py first, else the first module (by path) that defines it."""
    found: dict[str, ClassInfo] = {}
    preferred = ("vllm/config.py", "vllm/config/", "vllm/engine/arg_utils.py")
    for path in sorted(trees, key=lambda p: (not p.startswith(preferred), p)):
        tree = trees[path]
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name in CLASSES and node.name not in found:
                found[node.name] = class_info(path, node, tree)
    return found


def _json_literal(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else {"expr": repr(value)}
    if isinstance(value, list | tuple):
        return [_json_literal(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_literal(v) for k, v in value.items()}
    raise ValueError("not JSON")


class Resolver:
    """A default expression as a JSON value: literals as they are; a constant, a `Class.field`
    reference, `get_field(Class, "field")` and `Field(default=...)` / `field(default=...)`
    followed to the literal they name; anything else as {"expr": its source}."""

    def __init__(self, classes: dict[str, ClassInfo]) -> None:
        self.classes = classes

    def value(self, expr: ast.expr, info: ClassInfo, depth: int = 0) -> tuple[Any, str | None]:
        """(value, where a reference led) of a default expression read in `info`'s class."""
        try:
            return _json_literal(ast.literal_eval(expr)), None
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
        if depth < 6:
            got = self._follow(expr, info, depth)
            if got is not None:
                return got
        return {"expr": ast.unparse(expr)}, None

    def _follow(self, expr: ast.expr, info: ClassInfo, depth: int) -> tuple[Any, str | None] | None:
        if isinstance(expr, ast.Name):
            for table in (info.consts, info.module_consts):
                if expr.id in table and table[expr.id] is not expr:
                    return self.value(table[expr.id], info, depth + 1)
            return None
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            return self._member(expr.value.id, expr.attr, depth)
        if not isinstance(expr, ast.Call):
            return None
        func = expr.func.attr if isinstance(expr.func, ast.Attribute) else getattr(expr.func, "id", "")
        if func == "get_field" and len(expr.args) == 2:
            cls, attr = expr.args
            if isinstance(cls, ast.Name) and isinstance(attr, ast.Constant) and isinstance(attr.value, str):
                return self._member(cls.id, attr.value, depth)
        if func in FIELD_CALLS:
            kw = {k.arg: k.value for k in expr.keywords if k.arg}
            default = kw.get("default", expr.args[0] if expr.args and func == "Field" else None)
            if default is not None and not (isinstance(default, ast.Constant) and default.value is Ellipsis):
                return self.value(default, info, depth + 1)
            if "default_factory" in kw:
                return {"expr": ast.unparse(kw["default_factory"]) + "()"}, None
        return None

    def _member(self, cls: str, attr: str, depth: int) -> tuple[Any, str | None] | None:
        other = self.classes.get(cls)
        if other is None:
            return None
        if attr in other.fields:
            expr, where = other.fields[attr]
            value, via = self.value(expr, other, depth + 1)
            return value, via or f"{other.path}:{where}"
        if attr in other.consts:
            value, via = self.value(other.consts[attr], other, depth + 1)
            return value, via or f"{other.path}:{other.name}.{attr}"
        return None


def _entry(resolver: Resolver, info: ClassInfo, field_name: str) -> dict[str, Any] | None:
    if field_name not in info.fields:
        return None
    expr, where = info.fields[field_name]
    value, via = resolver.value(expr, info)
    out = {"value": value, "at": f"{info.path}:{where}"}
    if via:
        out["via"] = via
    return out


def config_defaults(trees: dict[str, ast.Module]) -> dict[str, dict[str, Any]]:
    """The release's defaults: each WANTED name from the config class that owns it (EngineArgs'
    value where that class has none, as CacheConfig's positional __init__ in old releases), every
    EngineArgs value of those names as `EngineArgs.<name>`, and the classes' DEFAULT_* constants."""
    classes = find_classes(trees)
    resolver = Resolver(classes)
    out: dict[str, dict[str, Any]] = {}
    engine = classes.get("EngineArgs")
    for name, (cls, field_name) in WANTED.items():
        owner = classes.get(cls)
        got = _entry(resolver, owner, field_name) if owner else None
        from_engine = _entry(resolver, engine, name) if engine else None
        if got is None:
            got = from_engine
        if got is not None:
            out[name] = got
        if from_engine is not None:
            out["EngineArgs." + name] = from_engine
    for cls in CLASSES:
        info = classes.get(cls)
        if info is None:
            continue
        for const in sorted(info.consts):
            if DEFAULT_CONST.fullmatch(const):
                value, via = resolver.value(info.consts[const], info)
                entry = {"value": value, "at": f"{info.path}:{cls}.{const}"}
                key = const if const not in out or out[const]["value"] == value else f"{cls}.{const}"
                out.setdefault(key, entry)
    return dict(sorted(out.items()))


# ---------------------------------------------------------------- one release


def vkey(version: str) -> tuple[int, ...]:
    """A release's order: "0.6.6.post1" -> (0, 6, 6, 0, 1), after 0.6.6 and before 0.6.7."""
    main, _, post = version.partition(".post")
    nums = [int(p) for p in re.findall(r"\d+", main)]
    return (*nums, *([0] * (4 - len(nums))), int(post or -1))


def fetch(version: str, wheels: Path) -> Path:
    """The release's wheel in the cache, downloaded when it is not there yet."""

    def cached() -> list[Path]:
        return sorted(wheels.glob(f"vllm-{version}-*.whl"))

    if not cached():
        wheels.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"vllm=={version}", "-d", str(wheels)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip download failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    if not cached():
        raise RuntimeError("no wheel (pip fetched something else: an sdist?)")
    return cached()[0]


def read_release(version: str, wheels: Path, delete: bool = False) -> dict[str, Any]:
    """Templates and defaults of one release, read from its wheel without extracting it."""
    wheel = fetch(version, wheels)
    trees: dict[str, ast.Module] = {}
    unparsed: list[str] = []
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            if name.startswith("vllm/") and name.endswith(".py"):
                try:
                    trees[name] = ast.parse(z.read(name), filename=name)
                except (SyntaxError, ValueError) as e:
                    unparsed.append(f"{name}: {type(e).__name__}")
    if delete:
        wheel.unlink()
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    for path, tree in trees.items():
        for rec in messages(path, tree):
            found.setdefault(key_of(rec), rec)  # by path, then position: the first site
    return {
        "version": version,
        "templates": [found[k] for k in sorted(found)],
        "defaults": config_defaults(trees),
        "modules": len(trees),
        "unparsed": unparsed,
    }


def key_of(rec: dict[str, Any]) -> tuple[str, str, str]:
    """What makes a template the same across releases: its text, kind and exception or level."""
    return rec["template"], rec["kind"], rec.get("exc") or rec.get("level") or ""


# ---------------------------------------------------------------- the data files


def load(out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The atlas as it is on disk, or empty."""
    msgs: dict[str, Any] = {"schema": SCHEMA, "releases": [], "templates": []}
    defs: dict[str, Any] = {"schema": DEFAULTS_SCHEMA, "releases": {}}
    if (out / "messages.json.gz").exists():
        msgs = json.loads(gzip.decompress((out / "messages.json.gz").read_bytes()))
    if (out / "defaults.json").exists():
        defs = json.loads((out / "defaults.json").read_text(encoding="utf-8"))
    return msgs, defs


def spans(indexes: list[int]) -> list[list[int]]:
    """Sorted indexes as inclusive runs: [0, 1, 2, 5] -> [[0, 2], [5, 5]]."""
    out: list[list[int]] = []
    for i in indexes:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def merge(msgs: dict[str, Any], read: list[dict[str, Any]]) -> dict[str, Any]:
    """The messages data with the releases read added (a release read again replaces its old
    reading); each template's file and function from the latest release it appears in."""
    new = {r["version"] for r in read}
    releases = sorted(set(msgs["releases"]) | new, key=vkey)
    seen: dict[tuple[str, str, str], tuple[set[str], dict[str, Any]]] = {}
    for t in msgs["templates"]:
        versions = {msgs["releases"][k] for i, j in t["spans"] for k in range(i, j + 1)} - new
        if versions:
            seen[key_of(t)] = (versions, {k: v for k, v in t.items() if k != "spans"})
    for r in sorted(read, key=lambda r: vkey(r["version"])):
        for t in r["templates"]:
            versions, rec = seen.setdefault(key_of(t), (set(), t))
            if not versions or vkey(r["version"]) >= max(vkey(v) for v in versions):
                seen[key_of(t)] = (versions, t)
            versions.add(r["version"])
    index = {v: i for i, v in enumerate(releases)}
    templates = []
    for key in sorted(seen):
        versions, rec = seen[key]
        templates.append({**rec, "spans": spans(sorted(index[v] for v in versions))})
    return {"schema": SCHEMA, "releases": releases, "templates": templates}


def merge_defaults(defs: dict[str, Any], read: list[dict[str, Any]]) -> dict[str, Any]:
    """The defaults data with the releases read added, in release order."""
    got = dict(defs["releases"]) | {r["version"]: r["defaults"] for r in read}
    return {"schema": DEFAULTS_SCHEMA, "releases": {v: got[v] for v in sorted(got, key=vkey)}}


def write(out: Path, msgs: dict[str, Any], defs: dict[str, Any]) -> None:
    """Both files, byte for byte the same for the same data (sorted, gzip mtime 0)."""
    out.mkdir(parents=True, exist_ok=True)
    blob = json.dumps(msgs, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()
    (out / "messages.json.gz").write_bytes(gzip.compress(blob, compresslevel=9, mtime=0))
    (out / "defaults.json").write_text(defaults_text(defs), encoding="utf-8")


def defaults_text(defs: dict[str, Any]) -> str:
    """defaults.json as a reviewer diffs it: a release per block, a default per line (its value and
    where it was read); the owning classes' names first, then DEFAULT_* and EngineArgs' own."""

    def order(name: str) -> tuple[int, str]:
        return (1 if DEFAULT_CONST.fullmatch(name.split(".")[-1]) else 2 if name.startswith("EngineArgs.") else 0, name)

    lines = ["{", f' "schema": {json.dumps(defs["schema"])},', ' "releases": {']
    for n, (version, values) in enumerate(defs["releases"].items()):
        lines.append(f"  {json.dumps(version)}: {{")
        names = sorted(values, key=order)
        for k, name in enumerate(names):
            entry = json.dumps(values[name], ensure_ascii=False, sort_keys=False)
            lines.append(f"   {json.dumps(name)}: {entry}" + ("," if k < len(names) - 1 else ""))
        lines.append("  }" + ("," if n < len(defs["releases"]) - 1 else ""))
    return "\n".join([*lines, " }", "}"]) + "\n"


# ---------------------------------------------------------------- --diff


def diff(msgs: dict[str, Any], defs: dict[str, Any], a: str, b: str) -> list[str]:
    """What changed from release A to B: templates removed, new and changed (a removed and a new
    one in the same file and function, paired by likeness), and defaults that differ."""
    for v in (a, b):
        if v not in msgs["releases"]:
            raise SystemExit(f"{v} is not in the atlas (releases: {' '.join(msgs['releases'])})")
    ia, ib = msgs["releases"].index(a), msgs["releases"].index(b)

    def has(t: dict[str, Any], k: int) -> bool:
        return any(i <= k <= j for i, j in t["spans"])

    removed = [t for t in msgs["templates"] if has(t, ia) and not has(t, ib)]
    added = [t for t in msgs["templates"] if has(t, ib) and not has(t, ia)]
    changed = []
    for old in list(removed):
        peers = [t for t in added if (t["file"], t["func"]) == (old["file"], old["func"])]
        if peers:
            new = max(peers, key=lambda t: difflib.SequenceMatcher(None, old["template"], t["template"]).ratio())
            changed.append((old, new))
            removed.remove(old)
            added.remove(new)

    def line(t: dict[str, Any]) -> str:
        return f"  [{t['kind']} {t.get('exc') or t.get('level')}] {t['file']}:{t['func']}: {t['template']!r}"

    out = [f"templates only in {a} (removed): {len(removed)}", *map(line, removed)]
    out += [f"templates only in {b} (new): {len(added)}", *map(line, added)]
    out.append(f"templates changed (same file and function): {len(changed)}")
    for old, new in changed:
        out += [line(old), "   -> " + line(new).strip()]
    da, db = defs["releases"].get(a, {}), defs["releases"].get(b, {})
    absent = {"value": "(absent)"}  # a default a release lacks differs from one that is None
    moved = [k for k in sorted(set(da) | set(db)) if da.get(k, absent)["value"] != db.get(k, absent)["value"]]
    out.append(f"defaults that differ: {len(moved)}")
    for k in moved:
        va, vb = (d[k]["value"] if k in d else "(absent)" for d in (da, db))
        out.append(f"  {k}: {json.dumps(va)} -> {json.dumps(vb)}  ({db.get(k, da.get(k, {})).get('at', '')})")
    return out


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="*", metavar="VERSION", help="vLLM releases to read (e.g. 0.34.0)")
    ap.add_argument("--wheels", type=Path, default=WHEELS, help=f"wheel cache (default {WHEELS})")
    ap.add_argument("--out", type=Path, default=OUT, help="where the data files go (default: the package)")
    ap.add_argument("--rebuild", action="store_true", help="start over instead of adding to the data")
    ap.add_argument("--delete-wheels", action="store_true", help="delete each wheel once read")
    ap.add_argument("--jobs", type=int, default=2, help="releases read at once (default 2)")
    ap.add_argument("--diff", nargs=2, metavar=("A", "B"), help="print what changed between two releases")
    args = ap.parse_args(argv)
    msgs, defs = load(args.out)
    if args.rebuild:
        msgs, defs = load(Path("/nonexistent"))
    read, failed = [], []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {v: pool.submit(read_release, v, args.wheels, args.delete_wheels) for v in args.versions}
        for v, fut in futures.items():
            try:
                r = fut.result()
            except Exception as e:  # a release that cannot be fetched or read is listed, not fatal
                failed.append(f"{v}: {e}")
                continue
            read.append(r)
            bad = f", {len(r['unparsed'])} modules unparsed" if r["unparsed"] else ""
            print(f"{v}: {r['modules']} modules, {len(r['templates'])} templates{bad}", file=sys.stderr)
    if read:
        msgs, defs = merge(msgs, read), merge_defaults(defs, read)
        write(args.out, msgs, defs)
    if args.diff:
        print("\n".join(diff(msgs, defs, *args.diff)))
    for f in failed:
        print(f"not read: {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
