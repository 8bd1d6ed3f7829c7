"""vLLM version strings as comparable tuples: "0.6.3.post1" -> (0, 6, 3), "v0.11.0rc2" -> (0, 11, 0)."""

from __future__ import annotations


def version_tuple(text: str | None, unknown: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Up to three numeric parts; `unknown` when the text has none (callers choose what an
    unknown version means: the oldest rules, or the current ones)."""
    parts = []
    for p in str(text or "").lstrip("v").split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or unknown
