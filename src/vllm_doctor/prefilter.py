"""Find the lines worth matching: one pass over raw bytes for every rule's literal anchors.

Logs can be gigabytes of request lines; the full rule patterns run only where an anchor occurs.
Hyperscan scans for hundreds of literals at memory speed; where it is not installed a single
compiled alternation does the same job, slower.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


class Prefilter:
    """Scans a byte buffer and returns the offsets where any anchor ends, with its index.

    `exact` is False for the fallback engine: an alternation reports one anchor where several
    overlap, so callers re-check which anchors a candidate line holds.
    """

    def __init__(self, anchors: Iterable[str]):
        self.anchors = list(dict.fromkeys(anchors))
        self._encoded = [a.encode("utf-8") for a in self.anchors]
        self.engine = "none"
        self.exact = True
        self._hs = None
        self._re = None
        if not self._encoded:
            return
        try:
            import hyperscan
        except ImportError:
            hyperscan = None
        if hyperscan is not None:
            db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            expressions = [re.escape(a).encode("utf-8") for a in self.anchors]
            db.compile(
                expressions=expressions,
                ids=list(range(len(expressions))),
                elements=len(expressions),
                flags=[0] * len(expressions),
            )
            self._hs = db
            self.engine = "hyperscan"
        else:
            alternation = b"|".join(re.escape(a) for a in sorted(self._encoded, key=len, reverse=True))
            self._re = re.compile(alternation)
            self._ids = {a: i for i, a in enumerate(self._encoded)}
            self.engine = "re"
            self.exact = False

    def scan(self, buf: bytes) -> list[tuple[int, int]]:
        """(end offset, anchor index) of every anchor occurrence, in offset order."""
        if self._hs is not None:
            hits: list[tuple[int, int]] = []

            def on_match(anchor_id, _start, end, _flags, _ctx):
                hits.append((end, anchor_id))

            self._hs.scan(buf, match_event_handler=on_match)
            hits.sort()
            return hits
        if self._re is not None:
            return [(m.end(), self._ids[m.group()]) for m in self._re.finditer(buf)]
        return []

    def anchors_in(self, line: bytes) -> list[int]:
        """Every anchor a line holds (the slow, exact answer the fallback needs)."""
        return [i for i, a in enumerate(self._encoded) if a in line]
