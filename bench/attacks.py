"""Peak RSS and time of `vllm-doctor explain` on each attack shape of issue 10, at full size.

    python bench/attacks.py                  # every shape; the table and PASS/MISS per target
    python bench/attacks.py --shapes stats-lines,megabyte-line --check

The shapes (tests/hostile/shapes.py) each hide a blocker where a reader that cuts corners loses
it: CR-only line ends, a failure glued after progress-bar redraws, 60,000 lines of common anchor
words, 1,000,000 stats lines, an 8 MiB copytruncate hole, NUL holes, 1 MiB and 64 MiB lines with
the failure at the end, multi-member and damaged gzip. Each log is written once into bench/out/
(gitignored) and explained under /usr/bin/time -v. Targets: the blocker found (exit 1, the
blocker's numbers read) and peak RSS at most 100 MB, for every shape.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "hostile"))
import shapes  # noqa: E402
from run import TARGET_RSS_MB, doctor, need, timed  # noqa: E402

# name -> (what, how to make it): the sizes the attacks used
FULL = {
    "cr-only": ("100,000 lines ended by CR alone", lambda: shapes.cr_only(100_000)),
    "tqdm-glued": ("the failure after 200 progress-bar redraws", lambda: shapes.tqdm_glued(200)),
    "tqdm-glued-long": ("... after 100,000 redraws (an 8.8 MiB line)", lambda: shapes.tqdm_glued(100_000)),
    "dense-anchors": ("60,000 lines of common anchor words", lambda: shapes.dense(60_000)),
    "stats-lines": ("1,000,000 stats lines", lambda: shapes.stats(1_000_000)),
    "nul-lead": ("1,000 leading NULs", lambda: shapes.nul_lead(1000)),
    "nul-copytruncate": ("an 8 MiB copytruncate hole", lambda: shapes.nul_lead(8 << 20)),
    "nul-holes": ("12 NUL holes of up to 64 KiB", lambda: shapes.nul_holes(12, 64 << 10)),
    "megabyte-line": ("a 1 MiB line of anchors, the failure at its end", lambda: shapes.megaline(1 << 20)),
    "64-megabyte-line": ("a 64 MiB line of anchors, the failure at its end", lambda: shapes.megaline(64 << 20)),
    "multi-member-gzip": ("8 gzip members, the failure in the last", lambda: shapes.multi_member_gzip(8)),
    "gzip-damaged-tail": ("500,000 lines of gzip, its end lost", lambda: shapes.damaged_gzip(500_000)),
}


def found(out: bytes) -> bool:
    try:
        report = json.loads(out)
    except ValueError:
        return False
    return any(d["severity"] == "blocker" and d["numbers"].get("alloc") == 2.0 for d in report["diagnoses"])


def bench(name: str) -> dict:
    what, make = FULL[name]
    path = OUT / f"attack-{name}.log{'.gz' if 'gzip' in name else ''}"
    if not path.exists():
        path.write_bytes(make())
    wall, rss, rc, out = timed([*doctor(), "explain", str(path), "--format", "json", "--no-gpu"], stdout=-1)
    return {"shape": name, "what": what, "bytes": path.stat().st_size, "seconds": round(wall, 2),
            "peak_rss_mb": round(rss, 1), "exit": rc, "blocker_found": rc == 1 and found(out)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(FULL), help=f"comma-separated, of: {', '.join(FULL)}")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args(argv)
    need("/usr/bin/time", "apt-get install -y time")
    OUT.mkdir(exist_ok=True)
    results = []
    for name in args.shapes.split(","):
        r = bench(name)
        results.append(r)
        print(f"  {name:20} {r['seconds']:7.2f} s {r['peak_rss_mb']:7.1f} MB  exit {r['exit']}", file=sys.stderr)
    (OUT / "attacks.json").write_text(json.dumps(results, indent=1) + "\n")
    print("| shape | input | size | time | peak RSS | blocker |\n|---|---|---:|---:|---:|---|")
    for r in results:
        print(f"| {r['shape']} | {r['what']} | {r['bytes'] / (1 << 20):.1f} MiB | {r['seconds']:.1f} s | "
              f"{r['peak_rss_mb']:.0f} MB | {'found' if r['blocker_found'] else 'MISSED'} |")  # fmt: skip
    ok = True
    for r in results:
        passed = r["blocker_found"] and r["peak_rss_mb"] <= TARGET_RSS_MB
        ok &= passed
        print(f"{'PASS' if passed else 'MISS'} {r['shape']}: blocker {'found' if r['blocker_found'] else 'missed'}, "
              f"peak RSS {r['peak_rss_mb']:.0f} MB <= {TARGET_RSS_MB} MB")  # fmt: skip
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
