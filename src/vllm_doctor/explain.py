"""The explain pipeline as a library call: paths in, a Report out."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from . import logread, rules as rules_mod
from .checks import DEFAULT_BLOCK_SIZE, CheckInput, Options, concurrency_budget
from .data import Report, Rule
from .diagnose import diagnose
from .engine import Engine
from .facts import Facts


def load_rules(extra_dirs: Iterable[Path] = ()) -> list[Rule]:
    return rules_mod.load(list(extra_dirs))


def explain(paths: list[str], rules: list[Rule] | None = None, options: Options | None = None) -> Report:
    """Read the logs, match the rules, and diagnose. Raises logread.ReadError for unreadable input."""
    rules = rules if rules is not None else load_rules()
    options = options or Options()
    engine = Engine(rules)
    stats = logread.ReadStats()
    facts = Facts()
    matches = engine.run(logread.read(paths, engine.prefilter, stats), facts)
    _derive(facts)
    diagnoses = diagnose(rules, matches, facts, options)
    report_facts = facts.to_json()
    budget = concurrency_budget(CheckInput(facts.flat(), facts, None, options))
    if budget:
        report_facts["concurrency"] = budget
    warnings = list(stats.warnings)
    if engine.timeouts:
        warnings.append(f"{engine.timeouts} pattern match(es) gave up after the regex time limit")
    return Report(
        paths=list(paths),
        lines=stats.lines,
        status=_status(diagnoses, facts, matches),
        diagnoses=diagnoses,
        facts=report_facts,
        warnings=warnings,
    )


def _derive(facts: Facts) -> None:
    """Facts that follow from others: KV tokens from blocks when vLLM printed only blocks
    (V0), at vLLM's default block size when the log does not give one."""
    blocks = facts.get("kv_cache.gpu_blocks")
    if facts.get("kv_cache.tokens") is None and blocks is not None:
        size = facts.get("kv_cache.block_size")
        where = facts.where.get("kv_cache.gpu_blocks", 0)
        facts.set("kv_cache.tokens", blocks * (size or DEFAULT_BLOCK_SIZE), where)
        facts.set("kv_cache.tokens_from", "blocks x block_size" if size else "blocks x default block_size 16", where)
    elif facts.get("kv_cache.tokens") is not None:
        facts.set("kv_cache.tokens_from", "log")


def _status(diagnoses, facts: Facts, matches) -> str:
    severities = {d.severity for d in diagnoses}
    if "blocker" in severities:
        return "failed"
    if "warning" in severities:
        return "degraded"
    if facts.values or facts.stats.samples or matches:
        return "healthy"
    return "unknown"
