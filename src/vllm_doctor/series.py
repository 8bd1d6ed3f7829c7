"""The stats series as points a picture can draw: each kept point is one stats sample as vLLM
printed it (its line, its time, running, waiting, KV usage, preemptions), never an average.

Bounded however long the log is: past KEPT points, neighbours are paired and the busier of each
pair stays (the one with more waiting, then more KV usage), so a queue's peak survives thinning;
the latest sample always stays, since the failure is at the end.
"""

from __future__ import annotations

import re
from typing import Any

KEPT = 240
FIELDS = ("running", "waiting", "kv_usage_pct", "preemptions")
# a line's time: vLLM's own, after the level ("INFO 11-30 01:58:49"), preferred to a collector's
# timestamp at the head of the line; knowledge/lifetimes.py dates lifetimes by the same rule
TIME = re.compile(r"(?<!\d)(?:\d{4}-)?(?P<mo>\d\d)-(?P<d>\d\d)[T ](?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?!\d)")
_VLLM_TIME = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<mo>\d\d)-(?P<d>\d\d) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)"
)


def line_time(raw: str) -> tuple[str | None, bool]:
    """("11-30 01:58:49" or None, whether it is vLLM's own time rather than a collector's)."""
    t = _VLLM_TIME.search(raw, 0, 240)
    own = t is not None
    t = t or TIME.search(raw, 0, 200)
    return (f"{t['mo']}-{t['d']} {t['h']}:{t['m']}:{t['s']}" if t else None), own


def point(sample: dict[str, Any], line: int, source: int, text: str) -> dict[str, Any]:
    """One stats sample as a point: its line, its time ("11-30 01:58:49", None without one), the
    fields drawn."""
    out: dict[str, Any] = {"line": line, "source": source, "time": line_time(text)[0]}
    out.update({k: sample.get(k) for k in FIELDS})
    return out


def keep(points: list[dict[str, Any]], new: dict[str, Any]) -> None:
    """Append `new`; past KEPT, halve the list pair by pair (the last point is never paired away)."""
    points.append(new)
    if len(points) <= KEPT:
        return
    last = points.pop()
    thinned = [max(points[i : i + 2], key=_busy) for i in range(0, len(points), 2)]
    points[:] = [*thinned, last]


def _busy(p: dict[str, Any]) -> tuple[float, float]:
    return (p.get("waiting") or 0, p.get("kv_usage_pct") or 0.0)
