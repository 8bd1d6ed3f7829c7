"""Benchmark `vllm-doctor explain` against ripgrep and GNU grep on the same large logs.

    python bench/run.py                       # 100 MiB and 1 GiB, 3 runs each, cold start
    python bench/run.py --sizes 100MiB --repeat 5
    python bench/run.py --fuzz 10000          # and the hostile-input run (bench/fuzz.py)
    python bench/run.py --check               # exit 1 when a target is missed

Needs ripgrep and GNU time: `apt-get install -y ripgrep time` (Debian/Ubuntu; `brew install
ripgrep gnu-time` on macOS). Logs are generated once into bench/out/ (gitignored, 1.1 GiB) by
bench/genlog.py and reused. Every tool reads the same file in the same run, from the page cache
(the file is read once first), and the runs of the three tools are interleaved, so a busy
machine slows them alike. Times are the median of the runs; peak RSS is /usr/bin/time -v's
"Maximum resident set size" (ripgrep's counts the pages of the file it maps).

Targets (issue 5): 1 GiB within 2x of ripgrep's time; explain's peak RSS at most 100 MB at any
size; a cold `explain` of a startup log at most 150 ms.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"
sys.path.insert(0, str(HERE))
import genlog  # noqa: E402

STARTUP_LOG = ROOT / "fixtures" / "lab" / "startup-port-in-use.log"
TARGET_RATIO = 2.0
TARGET_RSS_MB = 100
TARGET_COLD_MS = 150


def need(tool: str, how: str) -> str:
    path = shutil.which(tool)
    if not path:
        sys.exit(f"bench: {tool} not found; {how}")
    return path


@functools.cache
def doctor() -> list[str]:
    """The command, its package's bytecode compiled first: what a wheel install has, and an
    editable one under PYTHONDONTWRITEBYTECODE=1 lacks (each run would compile ~100 modules)."""
    import vllm_doctor

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    package = str(Path(vllm_doctor.__file__).parent)
    subprocess.run([sys.executable, "-m", "compileall", "-q", package], env=env, stdout=subprocess.DEVNULL, check=False)
    exe = Path(sys.executable).with_name("vllm-doctor")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "vllm_doctor"]


def anchors_file() -> Path:
    """The rules' literal anchors, one a line: what rg and grep look for."""
    from vllm_doctor.knowledge.checks import CHECKS
    from vllm_doctor.matching.loader import load

    anchors = sorted({a for r in load(checks=CHECKS) for a in r.anchors})
    path = OUT / "anchors.txt"
    path.write_text("\n".join(anchors) + "\n", encoding="utf-8")
    return path


def timed(cmd: list[str], stdout=subprocess.DEVNULL) -> tuple[float, float, int, bytes]:
    """(wall seconds, peak RSS in MB, exit status, stdout) of one run under /usr/bin/time -v."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True)
    wall = time.perf_counter() - start
    m = re.search(rb"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    rss = int(m.group(1)) / 1000 if m else float("nan")
    return wall, rss, proc.returncode, proc.stdout


def check_report(out: bytes, expect: dict) -> str | None:
    """Why explain's report of a generated log is wrong, or None: the benchmark times a run
    that found the failure, with the original line numbers."""
    report = json.loads(out)
    if report["input"]["lines"] != expect["lines"]:
        return f"read {report['input']['lines']} lines, the log has {expect['lines']}"
    found = [d for d in report["diagnoses"] if d["category"] == expect["category"]]
    if not found:
        return f"no {expect['category']} diagnosis"
    lines = [e["line"] for e in found[0]["evidence"]]
    if not lines or not set(lines) <= set(expect["saturated_lines"]):
        return f"evidence lines {lines} are not the saturated stats lines {expect['saturated_lines'][:4]}..."
    return None


def bench_size(size: int, repeat: int, anchors: Path) -> dict:
    log = OUT / f"bench-{size >> 20}m.log"
    print(f"  generating / checking {log.name} ...", file=sys.stderr)
    expect = genlog.ensure(log, size)
    with open(log, "rb") as f:  # into the page cache
        while f.read(16 << 20):
            pass
    tools = {
        "vllm-doctor explain": [*doctor(), "explain", str(log), "--format", "json"],
        "rg -c -F -f": [need("rg", "apt-get install -y ripgrep"), "-c", "-F", "-f", str(anchors), str(log)],
        "grep -c -F -f": [need("grep", "apt-get install -y grep"), "-c", "-F", "-f", str(anchors), str(log)],
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in tools}
    for i in range(repeat):
        for name, cmd in tools.items():
            wall, rss, rc, out = timed(cmd, stdout=subprocess.PIPE)
            if name.startswith("vllm-doctor"):
                if rc not in (0, 1):
                    sys.exit(f"bench: explain exited {rc} on {log}")
                problem = check_report(out, expect)
                if problem:
                    sys.exit(f"bench: explain got {log.name} wrong: {problem}")
            runs[name].append((wall, rss))
            print(f"  {log.name} run {i + 1}: {name:22} {wall:6.3f} s {rss:8.1f} MB", file=sys.stderr)
    real = log.stat().st_size
    result = {"size": size, "bytes": real, "lines": expect["lines"], "tools": {}}
    for name, xs in runs.items():
        walls = [w for w, _ in xs]
        result["tools"][name] = {
            "median_s": statistics.median(walls),
            "min_s": min(walls),
            "mib_per_s": real / (1 << 20) / statistics.median(walls),
            "peak_rss_mb": max(r for _, r in xs),
        }
    rg = result["tools"]["rg -c -F -f"]["median_s"]
    for t in result["tools"].values():
        t["ratio_to_rg"] = t["median_s"] / rg
    return result


def cold_start(runs: int) -> dict:
    def median_ms(cmd: list[str]) -> tuple[float, float]:
        xs = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            xs.append((time.perf_counter() - start) * 1000)
        return statistics.median(xs), min(xs)

    subprocess.run([*doctor(), "explain", str(STARTUP_LOG)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    explain = median_ms([*doctor(), "explain", str(STARTUP_LOG), "--format", "json"])
    python = median_ms([sys.executable, "-c", "pass"])
    return {"log": str(STARTUP_LOG.relative_to(ROOT)), "runs": runs, "explain_ms": explain[0], "explain_min_ms": explain[1],
            "python_pass_ms": python[0], "python_pass_min_ms": python[1]}  # fmt: skip


def machine() -> dict:
    cpu = "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = "?"
    try:
        kb = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal")))
        mem = f"{kb / (1 << 20):.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass

    def version(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0]
        except (OSError, IndexError):
            return "?"

    try:
        import hyperscan

        hs = getattr(hyperscan, "__version__", "?")
    except ImportError:
        hs = "not installed (regex fallback)"
    return {
        "cpu": cpu, "cores": os.cpu_count(), "memory": mem, "os": platform.platform(),
        "python": platform.python_version(), "ripgrep": version(["rg", "--version"]),
        "grep": version(["grep", "--version"]), "hyperscan": hs, "load_before": os.getloadavg(),
    }  # fmt: skip


def table(results: list[dict], cold: dict | None) -> str:
    rows = ["| log | tool | time (median) | throughput | peak RSS | vs rg |", "|---|---|---:|---:|---:|---:|"]
    for r in results:
        size = f"{r['size'] / (1 << 20):.0f} MiB" if r["size"] < 1 << 30 else f"{r['size'] / (1 << 30):.0f} GiB"
        for name, t in r["tools"].items():
            rows.append(
                f"| {size} | `{name}` | {t['median_s']:.2f} s | {t['mib_per_s']:.0f} MiB/s | "
                f"{t['peak_rss_mb']:.0f} MB | {t['ratio_to_rg']:.2f}x |"
            )
    if cold:
        rows.append("")
        rows.append(
            f"Cold start, `explain --format json {cold['log']}`: {cold['explain_ms']:.0f} ms median "
            f"({cold['explain_min_ms']:.0f} ms best) of {cold['runs']} runs; `python -c pass`: "
            f"{cold['python_pass_ms']:.0f} ms."
        )
    return "\n".join(rows)


def targets(results: list[dict], cold: dict | None) -> list[tuple[str, bool]]:
    out = []
    for r in results:
        t = r["tools"]["vllm-doctor explain"]
        if r["size"] >= 1 << 30:
            out.append(
                (f"1 GiB within {TARGET_RATIO}x of rg: {t['ratio_to_rg']:.2f}x", t["ratio_to_rg"] <= TARGET_RATIO)
            )
        out.append(
            (
                f"peak RSS at {r['size'] >> 20} MiB <= {TARGET_RSS_MB} MB: {t['peak_rss_mb']:.0f} MB",
                t["peak_rss_mb"] <= TARGET_RSS_MB,
            )
        )
    if cold:
        out.append(
            (f"cold explain <= {TARGET_COLD_MS} ms: {cold['explain_ms']:.0f} ms", cold["explain_ms"] <= TARGET_COLD_MS)
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100MiB,1GiB", help="comma-separated log sizes (default 100MiB,1GiB)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each tool per size (default 3)")
    ap.add_argument("--cold-runs", type=int, default=20, help="runs for the cold start (0: skip)")
    ap.add_argument("--fuzz", type=int, default=0, metavar="N", help="also run N hostile-input cases")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args(argv)
    need("/usr/bin/time", "apt-get install -y time")
    OUT.mkdir(exist_ok=True)
    info = machine()
    print(
        f"machine: {info['cpu']}, {info['cores']} cores, {info['memory']}; load {info['load_before']}", file=sys.stderr
    )
    anchors = anchors_file()
    results = [bench_size(genlog.parse_size(s), args.repeat, anchors) for s in args.sizes.split(",") if s]
    cold = cold_start(args.cold_runs) if args.cold_runs else None
    info["load_after"] = os.getloadavg()
    fuzz = None
    if args.fuzz:
        import fuzz as fuzz_mod

        fuzz = fuzz_mod.run(args.fuzz, seed=0)
    (OUT / "results.json").write_text(
        json.dumps({"machine": info, "results": results, "cold": cold, "fuzz": fuzz}, indent=1)
    )
    print(table(results, cold))
    print(f"\nmachine: {info['cpu']}, {info['cores']} cores, {info['memory']}, {info['os']}, Python {info['python']}, "
          f"{info['ripgrep']}, {info['grep']}, hyperscan {info['hyperscan']}; load {info['load_before']} -> {info['load_after']}")  # fmt: skip
    ok = True
    for text, passed in targets(results, cold):
        print(f"{'PASS' if passed else 'MISS'} {text}")
        ok &= passed
    if fuzz:
        print(
            f"{'PASS' if not fuzz['tracebacks'] else 'MISS'} fuzz: {fuzz['cases']} cases, {fuzz['tracebacks']} tracebacks"
        )
        ok &= not fuzz["tracebacks"]
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
