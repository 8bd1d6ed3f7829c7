"""Time a TAB: `vllm-doctor` as a shell's completion calls it (a fresh process each time) for a
few words in bash and zsh, the cached tree warm (vllm_doctor/complete.py), against typer's own
completion (vllm_doctor.cli.main) for the same words.

    python bench/completion.py            # 7 runs per case: the median and the fastest
    python bench/completion.py --check    # exit 1 when a case's median is 150 ms or more (issue 24)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 150.0
WORDS = ["vllm-doctor ex", "vllm-doctor explain --f", "vllm-doctor rules show queue", "vllm-doctor alerts --format "]
FAST = "from vllm_doctor.complete import main; main()"
TYPER = "from vllm_doctor.cli import main; main()"


def env(shell: str, words: str, cache: str) -> dict[str, str]:
    out = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "XDG_CACHE_HOME": cache,
        "_VLLM_DOCTOR_COMPLETE": f"complete_{shell}",
    }
    if shell == "bash":
        out.update({"COMP_WORDS": words, "COMP_CWORD": str(len(words.split(" ")) - 1)})
    else:
        out["_TYPER_COMPLETE_ARGS"] = words
    return out


def timed(code: str, e: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, check=True, timeout=60)
    return (time.perf_counter() - t) * 1000


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--check", action="store_true")
    opts = p.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory() as cache:
        timed(FAST, env("bash", WORDS[0], cache))  # the first TAB writes the tree
        for shell in ("bash", "zsh"):
            for words in WORDS:
                e = env(shell, words, cache)
                fast = [timed(FAST, e) for _ in range(opts.repeat)]
                typer = [timed(TYPER, e) for _ in range(3)]
                median = statistics.median(fast)
                worst = max(worst, median)
                print(
                    f"{shell:4} {words!r:36} {median:6.0f} ms (fastest {min(fast):.0f}); typer's {statistics.median(typer):.0f} ms"
                )
    print(f"slowest median {worst:.0f} ms (target < {TARGET_MS:.0f} ms)")
    return 1 if opts.check and worst >= TARGET_MS else 0


if __name__ == "__main__":
    sys.exit(main())
