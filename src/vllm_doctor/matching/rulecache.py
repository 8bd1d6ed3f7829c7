"""The built-in rules kept parsed between runs (read/cache.py keeps the bytes).

Reading and checking the 229 built-in TOML files is a fifth of the cold start of `explain`, so
the parsed rules are kept while no rule file and no module of the package has changed name, size
or mtime and no check is added or removed. They are read back by an unpickler that builds
data.py's Rule, Pattern and Fix and nothing else: a planted cache cannot call anything.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from vllm_doctor import __version__
from vllm_doctor.data import Rule

NAME = "builtin-rules.pickle"
FORMAT = 2
_PARTS = frozenset({"Rule", "Pattern", "Fix"})  # what a built-in rule is made of (data.py)


def kept(directory: Path, files: list[Path], checks: Mapping, parse: Callable[[list[Path]], list[Rule]]) -> list[Rule]:
    """The rules parse(files) gives: kept from an earlier run, else parsed and kept."""
    from vllm_doctor.read import cache

    key = _stamp(directory, files, checks)
    if key is not None and (blob := cache.read(NAME)) is not None:
        try:
            stream = _Unpickler(io.BytesIO(blob))
            if stream.load() == key:
                rules = stream.load()
                if isinstance(rules, list) and all(isinstance(r, Rule) for r in rules):
                    return rules
        except Exception:  # a damaged or foreign cache is not used: the files are parsed instead
            pass
    rules = parse(files)
    if key is not None:
        out = io.BytesIO()
        pickler = pickle.Pickler(out, protocol=5)  # one stream, one memo: read back by one unpickler
        pickler.dump(key)
        pickler.dump(rules)
        cache.write(NAME, out.getvalue())
    return rules


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "vllm_doctor.data" and name in _PARTS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a rule")


def _stamp(directory: Path, files: list[Path], checks: Mapping) -> tuple | None:
    """What the parsed rules are made of: the rule files, the package's modules (how a rule is read
    and checked), the checks' names. None when a file cannot be stat'ed (no cache then)."""

    def modules(top: str) -> Iterable[tuple[str, int, int]]:
        for e in os.scandir(top):
            if e.name.endswith(".py"):
                st = e.stat()
                yield e.path, st.st_size, st.st_mtime_ns
            elif e.is_dir() and e.name != "__pycache__":
                yield from modules(e.path)

    try:
        rules = [(s, (st := os.stat(s)).st_size, st.st_mtime_ns) for s in map(str, files)]
        code = sorted(modules(os.path.dirname(os.path.dirname(__file__))))
    except OSError:
        return None
    return FORMAT, __version__, str(directory), rules, code, sorted(checks)
