"""Draw the README's pictures (docs/pictures/) from the lab's real recordings: the memory bar of a
cache OOM, the queue of a saturated server, the restarts of one log holding three starts, the
terminal's bar and sparklines (printed), and the HTML report as a Chromium screenshot.

    .venv/bin/python scripts/docs_pictures.py     # needs chromium for report.png (scripts/ci-deps.sh)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from vllm_doctor.knowledge.checks import Options  # noqa: E402
from vllm_doctor.pipeline import explain  # noqa: E402
from vllm_doctor.render import bars, html, svg  # noqa: E402

LAB = ROOT / "fixtures" / "lab"
OUT = ROOT / "docs" / "pictures"
RESTARTS = ("startup-port-in-use.log", "cache-oom.log", "queue-saturation.log")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="vllm-doctor-pictures-"))
    os.chdir(tmp)  # the report names the joined log "server.log", not a temporary path
    joined = Path("server.log")
    joined.write_bytes(b"".join((LAB / n).read_bytes() for n in RESTARTS))
    reports = {
        name: explain([str(LAB / f"{name}.log")], options=Options()) for name in ("cache-oom", "queue-saturation")
    }
    reports["restarts"] = explain(["server.log"], options=Options())
    for name, draw, report in (
        ("memory.svg", svg.memory, reports["cache-oom"]),
        ("queue.svg", svg.queue, reports["queue-saturation"]),
        ("restarts.svg", svg.restarts, reports["restarts"]),
    ):
        (OUT / name).write_text('<?xml version="1.0" encoding="UTF-8"?>\n' + (draw(report) or ""), encoding="utf-8")
    oom, queue = reports["cache-oom"], reports["queue-saturation"]
    lines = [t.plain for bar in bars.all_bars(oom) for t in bars.bar_lines(bar, colour=False)]
    print("\n".join(lines + bars.queue_lines(queue, colour=False)))  # the README's terminal picture
    page = tmp / "report.html"
    page.write_text(html.render(reports["restarts"]), encoding="utf-8")
    chromium = shutil.which("chromium")
    if chromium:
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={tmp / 'profile'}", f"--screenshot={OUT / 'report.png'}", "--window-size=760,980",
             page.as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"pictures in {OUT}")


if __name__ == "__main__":
    main()
