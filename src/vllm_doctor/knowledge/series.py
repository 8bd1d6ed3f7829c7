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
# vLLM's own time after the level ("INFO 11-30 01:58:49"), or a collector's ISO time
_TIME = re.compile(r"(?<!\d)(?:\d{4}-)?(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?!\d)")


def point(sample: dict[str, Any], line: int, source: int, text: str) -> dict[str, Any]:
    """One stats sample as a point: its line, its time ("11-30 01:58:49", None without one), the
    fields drawn."""
    t = _TIME.search(text, 0, 240)
    out: dict[str, Any] = {"line": line, "source": source, "time": f"{t[1]}-{t[2]} {t[3]}:{t[4]}:{t[5]}" if t else None}
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
