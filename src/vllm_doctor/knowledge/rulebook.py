"""The rules as knowledge runs them: matching's loader handed the named checks (CHECKS), so a
rule that names an unknown check, or a name no check of it returns, is refused on load; matching
itself knows rules, not the checks.

The built-in rules are loaded once per process: `serve` reads them for its preflight, its live
watch and its incident report, and every one of those shares the first load (the rules of a
kind are a filter of a larger load already made). Rules are not changed after loading.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from vllm_doctor.data import Rule

LOG_KINDS = frozenset({"diagnosis", "fact"})  # what reading a log or a scrape uses; `check` has its own
_BUILTIN: dict[frozenset[str] | None, list[Rule]] = {}  # kinds (None: all) -> the built-in rules


def load(
    dirs: Iterable[Path] | None = None, *, skip: Callable | None = None, kinds: Iterable[str] | None = None
) -> list[Rule]:
    """The built-in rules (of `kinds`, else all), then each directory's (matching/loader.py's load)."""
    from vllm_doctor.knowledge.checks import CHECKS
    from vllm_doctor.matching import loader

    if not dirs:
        return list(builtin(kinds))
    return loader.load(dirs, checks=CHECKS, skip=skip, kinds=None if kinds is None else set(kinds))


def builtin(kinds: Iterable[str] | None = None) -> list[Rule]:
    """The built-in rules of `kinds` (None: all), parsed once per process."""
    from vllm_doctor.knowledge.checks import CHECKS
    from vllm_doctor.matching import loader

    key = None if kinds is None else frozenset(kinds)
    if key not in _BUILTIN:
        full = _BUILTIN.get(None)
        if full is not None and key is not None:
            _BUILTIN[key] = [r for r in full if r.kind in key]
        else:
            _BUILTIN[key] = loader.load(checks=CHECKS, kinds=None if key is None else set(key))
    return _BUILTIN[key]
