"""Hostile input, at length: N seeded cases through the real `explain` command line.

    python bench/fuzz.py                 # 10,000 cases
    python bench/fuzz.py --cases 500 --seed 7
    python bench/fuzz.py --properties --examples 1000 --seed 3 --seconds 3600   # tests/properties/ at length

The cases (random bytes, invalid UTF-8, NULs, 10 MB single lines, truncated and damaged gzip,
directories, empty files, FIFOs, files that vanish mid-read, mixed CR/LF, absurd numbers in real
vLLM lines, and issue 10's attack shapes: CR-only logs, failures glued after progress bars,
dense anchor words, stats floods, NUL holes, megabyte lines with the failure at the end,
multi-member and damaged gzip) come from tests/hostile/test_hostile_input.py and
tests/hostile/shapes.py; the suite runs a few hundred of them. The contract: a report (exit 0,
1 or 4), or exit 2 with one line on stderr; never a traceback; and every attack shape, which
hides a blocker, comes out failed with it. Exits 1 if any case breaks it, printing the first
failure of each kind.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cases_module():
    sys.path.insert(0, str(ROOT / "tests"))  # the cases module imports the suite's conftest
    sys.path.insert(0, str(ROOT / "tests" / "hostile"))  # ... and the attack shapes beside it
    spec = importlib.util.spec_from_file_location("hostile_cases", ROOT / "tests" / "hostile" / "test_hostile_input.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run(cases: int, seed: int = 0, heavy_every: int = 50, quiet: bool = False) -> dict:
    """Run the cases; returns counts, the distinct failures and the slowest cases."""
    h = _cases_module()
    rng = random.Random(seed)
    kinds: collections.Counter = collections.Counter()
    failures: dict[str, tuple[str, str]] = {}
    failed = tracebacks = missed = 0
    slowest: list[tuple[float, str]] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vllm-doctor-fuzz-") as tmp, h.memory_limit():
        for i in range(cases):
            case_dir = Path(tmp) / f"{i // 500}"
            case_dir.mkdir(exist_ok=True)
            case = h.make_case(rng, case_dir, i, heavy=i % heavy_every == 0)
            kinds[case.name] += 1
            problem, took = h.run_case(case)
            slowest = sorted([*slowest, (took, f"#{i} {case.name}")])[-5:]
            if problem:
                failed += 1
                tracebacks += problem.startswith("traceback")
                missed += problem.startswith("missed blocker")
                key = next((ln for ln in reversed(problem.splitlines()) if ln and not ln.startswith(" ")), problem)[
                    :200
                ]
                failures.setdefault(key, (case.name, problem))
            if not quiet and (i + 1) % 1000 == 0:
                print(f"  fuzz: {i + 1}/{cases} cases, {failed} broke the contract", file=sys.stderr)
    result = {
        "cases": cases,
        "seed": seed,
        "seconds": round(time.perf_counter() - start, 1),
        "tracebacks": tracebacks,
        "missed_blockers": missed,
        "attack_shapes": sum(v for k, v in kinds.items() if k.split("+")[0] in h.shapes.SHAPES),
        "failed": failed,
        "kinds": dict(kinds),
        "distinct_failures": {k: v[0] for k, v in failures.items()},
        "slowest": [(round(t, 2), what) for t, what in reversed(slowest)],
    }
    if not quiet:
        for key, (name, problem) in failures.items():
            print(f"--- {name}: {key}\n{problem[-3000:]}", file=sys.stderr)
    return result


def properties(examples: int, seed: int, seconds: float) -> int:
    """The property-based tests (tests/properties/) at length: `examples` a property from `seed`,
    in a pytest of their own that must end within `seconds` (a search that hangs fails too)."""
    import os
    import subprocess

    env = {**os.environ, "VLLM_DOCTOR_HYPOTHESIS": "long", "VLLM_DOCTOR_HYPOTHESIS_EXAMPLES": str(examples)}
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "tests" / "properties"), "-q", "-p", "no:cacheprovider",
           f"--hypothesis-seed={seed}", "--hypothesis-show-statistics"]  # fmt: skip
    start = time.perf_counter()
    try:
        code = subprocess.run(cmd, cwd=ROOT, env=env, timeout=seconds).returncode
    except subprocess.TimeoutExpired:
        print(f"fuzz --properties: not done within {seconds:.0f} s ({examples} examples, seed {seed})")
        return 1
    took = time.perf_counter() - start
    print(f"fuzz --properties: {examples} examples a property (seed {seed}) in {took:.0f} s: exit {code}")
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--properties", action="store_true", help="run tests/properties/ at length instead")
    ap.add_argument("--examples", type=int, default=1000, help="--properties: examples a property")
    ap.add_argument("--seconds", type=float, default=3600, help="--properties: the time bound")
    args = ap.parse_args(argv)
    if args.properties:
        return properties(args.examples, args.seed, args.seconds)
    result = run(args.cases, args.seed)
    print(
        f"fuzz: {result['cases']} cases (seed {result['seed']}) in {result['seconds']} s: "
        f"{result['failed']} broke the contract ({result['tracebacks']} tracebacks, "
        f"{result['missed_blockers']} missed blockers of {result['attack_shapes']} attack shapes, "
        f"{len(result['distinct_failures'])} distinct); "
        f"slowest {result['slowest'][:3]}"
    )
    print("kinds: " + ", ".join(f"{k} {v}" for k, v in sorted(result["kinds"].items())))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
