"""`vllm-doctor check` on the terminal, after its findings: a line per area of the checks (vLLM,
model, parallel, fit, GPUs, host) marked ✓ passed, ! a warning, ✗ a blocker or - could not run
(`ok`, `!`, `x`, `-` under NO_COLOR or a terminal that is not UTF-8), then the checks that could
not run counted on one line, each one's reason under -v. The report's warnings keep a line per
check that could not run (json, markdown); text shows them only here."""

from __future__ import annotations

import os
from typing import Any

from vllm_doctor.data import Report

# an area's state (preflight/run.py: the worst of its checks') -> (mark, ASCII mark, style)
MARKS = {
    "blocker": ("✗", "x", "bold red"),
    "warning": ("!", "!", "bold yellow"),
    "passed": ("✓", "ok", "bold green"),
    "skipped": ("-", "-", "dim"),
}
WORDS = {"blocker": "blocker", "warning": "warning", "passed": "passed", "skipped": "could not run"}
AREA_WIDTH = 8  # "parallel"


def plain(console: Any) -> bool:
    """ASCII marks: NO_COLOR asks for a plain screen, and a terminal that is not UTF-8 cannot draw ✓."""
    return "NO_COLOR" in os.environ or "utf" not in str(getattr(console, "encoding", "") or "").lower()


def skipped(report: Report) -> dict[str, str]:
    """The checks that could not run, and why (facts.preflight.skipped)."""
    pre = report.facts.get("preflight")
    return dict(pre.get("skipped") or {}) if isinstance(pre, dict) else {}


def folded(report: Report) -> set[str]:
    """The report's warnings this screen folds into its one could-not-run line."""
    if not report.areas:
        return set()
    return {f"check {name} could not run: {why}" for name, why in skipped(report).items()}


def mark(state: str, ascii_only: bool) -> tuple[str, str]:
    glyph, letters, style = MARKS[state]
    return (letters if ascii_only else glyph), style


def area_line(checks: list[dict[str, str]]) -> str:
    """What each of an area's checks did: "warning: tokenizer; passed: shm; could not run: disk"."""
    parts = []
    for state, word in WORDS.items():
        names = [c["check"] for c in checks if c["state"] == state]
        if names:
            parts.append(f"{word}: {', '.join(names)}")
    return "; ".join(parts)


def show(screen: Any, report: Report) -> None:
    """The area lines and the folded could-not-run line, on `screen` (text.py's _Screen)."""
    if not report.areas:
        return
    ascii_only = plain(screen.console)
    width = max(len(mark(s, ascii_only)[0]) for s in MARKS)
    screen.blank()
    screen.say("Checks", "bold")
    for area in report.areas:
        body = area_line(area["checks"])
        glyph, style = mark(area["state"], ascii_only)
        head = f"{glyph:<{width}} "
        screen.say(f"{area['area']:<{AREA_WIDTH}}  {body}", indent=2 + len(head) + AREA_WIDTH + 2,
                   head=head, head_style=style, lead=2)  # fmt: skip
    why = skipped(report)
    if not why:
        return
    count = f"{len(why)} check{'s' if len(why) > 1 else ''} could not run"
    if not screen.verbose:
        screen.say(f"{count} (-v: why)", "dim", indent=2)
        return
    screen.say(f"{count}:", "dim", indent=2)
    w = max(len(name) for name in why)
    for name, reason in why.items():
        screen.say(reason, "dim", indent=4 + w + 2, head=f"{name:<{w}}", lead=4, gap=2)
