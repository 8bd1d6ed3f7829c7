"""The problems of one rule file: RuleError (one line naming the file and the key) and the
collector the loader fills, so that `rules check` can list every problem of a file at once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vllm_doctor.errors import DoctorError
from vllm_doctor.matching import expr


class RuleError(DoctorError):
    """A rule file that cannot be used; str() is one line naming the file and the key."""

    def __init__(self, path: str | Path, key: str | None, message: str):
        self.path, self.key, self.message = str(path), key, message
        self.problems: list[RuleError] = [self]  # every problem of the file, this one first
        where = f"{path}: key '{key}'" if key else str(path)
        super().__init__(f"{where}: {message}")


class Problems:
    """Every problem of one rule file, collected so that `rules check` can list them all."""

    def __init__(self, path: Path):
        self.path = path
        self.items: list[RuleError] = []

    def add(self, key: str | None, message: str) -> None:
        self.items.append(RuleError(self.path, key, message))

    def need(self, data: dict, key: str, kind: type, required: bool = True, prefix: str = "") -> Any:
        """data[key] when it has the kind; None (and a problem) when it is missing or wrong."""
        if key not in data:
            if required:
                self.add(prefix + key, "is missing")
            return None
        value = data[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            self.add(prefix + key, f"must be a {kind.__name__}")
            return None
        return value

    def strings(self, data: dict, key: str, *, empty_ok: bool = False, prefix: str = "") -> list[str] | None:
        """A string or a list of strings (non-empty ones unless `empty_ok`); None when it is neither."""
        value = data.get(key, [])
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and (empty_ok or v.strip()) for v in value):
            self.add(prefix + key, "must be a string or a list of strings" + ("" if empty_ok else " (non-empty)"))
            return None
        return value

    def tables(self, data: dict, name: str, allowed: set[str], what: str) -> Iterator[tuple[str, dict]]:
        """The tables of an array like [[patterns]], each with its key ("patterns[0]"); a
        non-array, a non-table and an unknown key inside one are problems."""
        raw = data.get(name, [])
        if not isinstance(raw, list):
            self.add(name, f"must be an array of tables ([[{name}]])")
            return
        for i, table in enumerate(raw):
            key = f"{name}[{i}]"
            if not isinstance(table, dict):
                self.add(key, "must be a table")
                continue
            self.unknown_keys(table, allowed, f"{key}.", what)
            yield key, table

    def unknown_keys(self, table: dict, allowed: set[str], prefix: str, what: str) -> None:
        for k in sorted(set(table) - allowed):
            self.add(f"{prefix}{k}", f"is not {what}" + (" (typo?)" if not prefix else ""))

    def templates(self, text: str, key: str) -> None:
        bad = expr.bad_placeholders(text)
        if bad:
            self.add(key, f"{bad[0]} is not a placeholder: use {{name}}, {{name:,}} or {{name:.2f}}")

    def condition(self, text: str | None, key: str) -> None:
        if text is None:
            return
        try:
            expr.Condition(text)
        except expr.ExprError as e:
            self.add(key, f"bad condition: {e}")
