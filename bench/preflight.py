"""Time `vllm-doctor check` end to end (a fresh process each run, as a CI job or an init container
runs it) over every replayed lab start in fixtures/preflight/, with the network off (HF_HUB_OFFLINE).

    python bench/preflight.py              # 3 runs per case: the median and the slowest
    python bench/preflight.py --check      # exit 1 when any run takes 2 s or more (issue 13's target)
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted((ROOT / "fixtures" / "preflight").glob("*.toml"))
TARGET_S = 2.0


def argv(case: dict) -> list[str]:
    model = "/nonexistent/model" if case["model"] == "missing" else str(ROOT / "fixtures" / "configs" / case["model"])
    return shlex.split(case["command"].replace("<model-dir>", model))[2:]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--check", action="store_true")
    opts = p.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}
    slowest = 0.0
    for path in CASES:
        case = tomllib.loads(path.read_text())
        times = []
        for _ in range(opts.repeat):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "vllm_doctor", "check", "--", *argv(case)],
                           env={**env, **case.get("env", {})}, capture_output=True, check=False)  # fmt: skip
            times.append(time.perf_counter() - t0)
        slowest = max(slowest, max(times))
        print(f"{path.stem:40} median {statistics.median(times):.2f} s   max {max(times):.2f} s")
    print(f"slowest run: {slowest:.2f} s (target under {TARGET_S:g} s)")
    return 1 if opts.check and slowest >= TARGET_S else 0


if __name__ == "__main__":
    sys.exit(main())
