"""Find the lines worth matching: one pass over raw bytes for every rule's literal anchors.

Logs can be gigabytes of request lines; the full rule patterns run only where an anchor occurs.
Hyperscan scans for hundreds of literals at near memory speed (about 0.5 s a GiB for 400
anchors here; pyahocorasick, the other C engine, about 20 s; one `re` alternation, minutes:
bench/prefilter_engines.py). Hyperscan only has wheels for x86-64 Linux: elsewhere
pyahocorasick is used when installed, else the alternation.

Building an engine costs more (0.1 s to compile the hyperscan database, so it is cached) than
scanning a startup log with one `bytes.find` per anchor, so small buffers are scanned that way
and the engine is built on the first large one: `explain` of a short log starts faster.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

SMALL = 256 << 10  # buffers up to this size are scanned with bytes.find, one anchor at a time


class Prefilter:
    """Scans a byte buffer and returns the offsets where any anchor ends, with its index.

    `exact` is False for the fallback engine: an alternation reports one anchor where several
    overlap, so callers re-check which anchors a candidate line holds.
    """

    def __init__(self, anchors: Iterable[str]):
        self.anchors = list(dict.fromkeys(anchors))
        self._encoded = [a.encode("utf-8") for a in self.anchors]
        self.lengths = [len(a) for a in self._encoded]  # in bytes: an anchor starts at its end minus this
        self._hs: Any = None
        self._aho: Any = None
        self._re: re.Pattern[bytes] | None = None
        self._ids: dict[bytes, int] = {}
        self._built = False
        self.exact = True  # bytes.find, until a large buffer builds the engine
        self.engine = "find" if self._encoded else "none"
        # Hit lines that hold only these anchors are offered to take(line bytes, anchor ids) first
        # (matching/engine.py's bulk families); what it returns stands for the line (logread.Bulk).
        self.bulk_ids: frozenset[int] = frozenset()
        self.take: Callable[[bytes, set[int]], Any] | None = None
        self.families: list = []  # read/bulk.py's Family: the lines read a region at a time
        self._general: Prefilter | None = None
        self._general_ids: list[int] = []
        self._cache_name = _CACHE_NAME

    def _build(self) -> None:
        self._built = True
        if not self._encoded:
            return
        try:
            import hyperscan
        except ImportError:
            hyperscan = None  # type: ignore[assignment]
        if hyperscan is not None:
            self._hs = _hyperscan_db(hyperscan, self.anchors, self._cache_name)
            self.engine = "hyperscan"
            return
        try:  # 20x faster than the alternation where hyperscan has no wheel (arm64, macOS)
            import ahocorasick
        except ImportError:
            ahocorasick = None
        if ahocorasick is not None:
            automaton = ahocorasick.Automaton()
            for i, a in enumerate(self._encoded):
                automaton.add_word(a.decode("latin-1"), i)  # latin-1: one char per byte, offsets kept
            automaton.make_automaton()
            self._aho = automaton
            self.engine = "pyahocorasick"
        else:
            alternation = b"|".join(re.escape(a) for a in sorted(self._encoded, key=len, reverse=True))
            self._re = re.compile(alternation)
            self._ids = {a: i for i, a in enumerate(self._encoded)}
            self.engine, self.exact = "re", False

    def scan(self, buf) -> list[tuple[int, int]]:
        """(end offset, anchor index) of every anchor occurrence, in offset order.

        `buf` is bytes, a bytearray or a memoryview of one.
        """
        if not self._encoded:
            return []
        if not self._built and len(buf) <= SMALL:
            return find_each(self._encoded, bytes(buf) if isinstance(buf, memoryview) else buf)
        if not self._built:
            self._build()
        if self._aho is not None:
            return sorted((end + 1, i) for end, i in self._aho.iter(str(buf, "latin-1")))
        if self._hs is not None:
            hits: list[tuple[int, int]] = []

            def on_match(anchor_id, _start, end, _flags, _ctx):
                hits.append((end, anchor_id))

            self._hs.scan(buf, match_event_handler=on_match)
            hits.sort()
            return hits
        assert self._re is not None  # built above: no hyperscan, no pyahocorasick
        return [(m.end(), self._ids[bytes(m.group())]) for m in self._re.finditer(buf)]

    def scan_general(self, buf) -> list[tuple[int, int]]:
        """scan() for every anchor but the bulk families' (read/bulk.py reads their lines)."""
        if self._general is None:
            self._general_ids = [i for i in range(len(self.anchors)) if i not in self.bulk_ids]
            self._general = Prefilter(self.anchors[i] for i in self._general_ids)
            self._general._cache_name = _CACHE_NAME + ".general"  # both databases stay cached
        ids = self._general_ids
        return [(end, ids[i]) for end, i in self._general.scan(buf)]

    def anchors_in(self, line: bytes) -> list[int]:
        """Every anchor a line holds (the slow, exact answer the fallback needs)."""
        return [i for i, a in enumerate(self._encoded) if a in line]


def find_each(literals: list[bytes] | tuple[bytes, ...], buf: bytes | bytearray) -> list[tuple[int, int]]:
    """(end offset, literal index) of every occurrence of every literal, in offset order
    (overlapping ones too, as hyperscan reports them): a byte search each."""
    hits = []
    for i, a in enumerate(literals):
        at = buf.find(a)
        while at >= 0:
            hits.append((at + len(a), i))
            at = buf.find(a, at + 1)
    hits.sort()
    return hits


def _hyperscan_db(hyperscan, anchors: list[str], name: str):
    """The compiled database of the anchors; compiling 400 literals can take 0.1 s, so the last
    one is cached (cache.py), under a key of the anchors, the hyperscan version and the machine."""
    import hashlib
    import platform

    from vllm_doctor.read import cache

    text = "\0".join([getattr(hyperscan, "__version__", "?"), platform.machine(), *anchors])
    key = hashlib.sha256(text.encode("utf-8")).hexdigest().encode() + b"\n"
    blob = cache.read(name)
    if blob and blob.startswith(key):
        try:
            db = hyperscan.loadb(blob[len(key) :], hyperscan.HS_MODE_BLOCK)
            db.scratch = hyperscan.Scratch(db)  # compile() makes one; a loaded database needs its own
            return db
        except Exception:  # another CPU, a damaged file: compile anew
            pass
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    expressions = [re.escape(a).encode("utf-8") for a in anchors]
    db.compile(
        expressions=expressions,
        ids=list(range(len(expressions))),
        elements=len(expressions),
        flags=[0] * len(expressions),
    )
    try:
        cache.write(name, key + hyperscan.dumpb(db))
    except Exception:
        pass
    return db


_CACHE_NAME = "prefilter.hsdb"
