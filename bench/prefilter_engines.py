"""Which multi-literal engine finds the rules' anchors fastest: hyperscan, pyahocorasick, or
the `re` alternation the prefilter falls back to.

    python bench/prefilter_engines.py                # on bench/out/bench-100m.log
    python bench/prefilter_engines.py --size 1GiB

pyahocorasick is not a dependency: `pip install pyahocorasick` to include it (it matches str,
so each block is decoded as latin-1 first, which keeps byte offsets). Every engine must report
the same (offset, anchor) hits; the build time matters for short logs, the scan for long ones.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import genlog  # noqa: E402

BLOCK = 16 << 20


def blocks(path: Path):
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(view)
            if not n:
                return
            yield view[:n]


def engines(anchors: list[str]):
    encoded = [a.encode() for a in anchors]

    def hyperscan_engine():
        import hyperscan

        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        exprs = [re.escape(a).encode() for a in anchors]
        db.compile(expressions=exprs, ids=list(range(len(exprs))), elements=len(exprs), flags=[0] * len(exprs))

        def scan(view):
            hits = []
            db.scan(view, match_event_handler=lambda i, _s, e, _f, _c: hits.append((e, i)))
            hits.sort()
            return hits

        return scan

    def ahocorasick_engine():
        import ahocorasick

        automaton = ahocorasick.Automaton()
        for i, a in enumerate(encoded):
            automaton.add_word(a.decode("latin-1"), i)
        automaton.make_automaton()
        return lambda view: sorted((end + 1, i) for end, i in automaton.iter(str(view, "latin-1")))

    def re_engine():
        ids = {a: i for i, a in enumerate(encoded)}
        rx = re.compile(b"|".join(re.escape(a) for a in sorted(encoded, key=len, reverse=True)))
        return lambda view: [(m.end(), ids[bytes(m.group())]) for m in rx.finditer(view)]

    return {"hyperscan": hyperscan_engine, "pyahocorasick": ahocorasick_engine, "re alternation": re_engine}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=genlog.parse_size, default=genlog.parse_size("100MiB"))
    ap.add_argument("--skip", default="", help="comma-separated engines to leave out")
    args = ap.parse_args(argv)
    from vllm_doctor.knowledge.checks import CHECKS
    from vllm_doctor.matching.loader import load

    anchors = sorted({a for r in load(checks=CHECKS) for a in r.anchors})
    log = HERE / "out" / f"bench-{args.size >> 20}m.log"
    genlog.ensure(log, args.size)
    for _view in blocks(log):  # into the page cache
        pass
    reference = None
    print(f"{len(anchors)} anchors, {log.name} ({log.stat().st_size / (1 << 20):.0f} MiB)")
    print("| engine | build | scan | throughput | hits |\n|---|---:|---:|---:|---:|")
    for name, make in engines(anchors).items():
        if name in args.skip.split(","):
            continue
        try:
            start = time.perf_counter()
            scan = make()
            built = time.perf_counter() - start
        except ImportError as e:
            print(f"| {name} | not installed ({e.name}) | | | |")
            continue
        hits = []
        took = 0.0
        offset = 0
        for view in blocks(log):
            start = time.perf_counter()
            found = scan(view)
            took += time.perf_counter() - start
            hits.extend((offset + end, i) for end, i in found)
            offset += len(view)
        if name == "re alternation":  # one hit where anchors overlap: compare the lines only
            same = reference is None or {e for e, _ in hits} <= {e for e, _ in reference}
        else:
            same = reference is None or hits == reference
        reference = reference or hits
        mib = log.stat().st_size / (1 << 20)
        print(
            f"| {name} | {built * 1000:.1f} ms | {took:.2f} s | {mib / took:.0f} MiB/s | {len(hits)}{'' if same else ' (DIFFERENT)'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
