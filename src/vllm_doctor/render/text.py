"""The report for a person at a terminal: what failed, the evidence, the numbers, the fixes.

Uses rich; colour follows NO_COLOR and turns off by itself when stdout is not a terminal.
Not masked for secrets yet: the terminal text is the operator's own screen.
"""

from __future__ import annotations

import io
import os
from typing import IO

from vllm_doctor.data import Report
from vllm_doctor.matching.expr import fmt
from vllm_doctor.render import bars
from vllm_doctor.render.summary import (
    capacity_line,
    describe_input,
    earlier_lives,
    gpu_lines,
    headline,
    model_line,
    timeline,
    where,
    work_rows,
)

_STYLE = {"blocker": "bold white on red", "warning": "bold black on yellow", "info": "bold white on blue"}
_STATUS = {"failed": "bold red", "degraded": "bold yellow", "healthy": "bold green", "unknown": "bold"}


def render(report: Report, redact: bool = True) -> str:
    """The text as a string, without colour (for -o FILE and pipes)."""
    buf = io.StringIO()
    show(report, file=buf)
    return buf.getvalue()


def show(report: Report, file: IO[str] | None = None) -> None:
    """Print the report to a terminal (or `file`), in colour where the terminal takes it."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(file=file, highlight=False, soft_wrap=True, no_color="NO_COLOR" in os.environ)
    print_ = console.print
    print_(f"[{_STATUS.get(report.status, 'bold')}]vllm-doctor: {escape(headline(report))}[/]")
    if report.empty:
        return  # one line: there is nothing else to say
    print_(f"[dim]{escape(describe_input(report))}[/]")
    for w in report.warnings:
        print_(f"[yellow]note:[/] {escape(w)}")
    for t in timeline(report):
        print_(f"[bold]{escape(t)}[/]")
    for title, lines in earlier_lives(report):
        print_()
        print_(f"[bold]{escape(title)}[/]")
        for line in lines:
            print_(f"  {escape(line)}")
    if report.all_lifetimes and len(report.lifetimes) > 1:
        print_()
        print_(f"[bold]Start #{report.shown} (shown in full):[/]")
    for d in report.diagnoses:
        print_()
        print_(
            f"[{_STYLE[d.severity]}] {d.severity.upper()} [/] [bold]{escape(d.title)}[/]"
            f"  [dim]{d.category} · {d.rule} · {d.confidence} confidence[/]"
        )
        print_(f"  {escape(d.summary)}")
        if d.evidence:
            print_("  [bold]Evidence[/]")
            for e in d.evidence:
                print_(f"    [cyan]{where(e, report):>6}[/]  {escape(e.text)}")
            for e in d.context:
                print_(f"    [dim]{e.line:>6}  {escape(e.text)}  (wrapper; the cause is above)[/]")
        if d.numbers:
            nums = "   ".join(f"{k} [bold]{escape(fmt(v))}[/]" for k, v in d.numbers.items())
            print_(f"  [bold]Numbers[/]  {nums}")
        bars.show(console, report, d)
        if d.fixes:
            print_("  [bold]Fixes, in order[/]")
            for f in d.fixes:
                print_(f"    {f.rank}. [bold]{escape(f.action)}[/]")
                print_(f"       [dim]{escape(f.why)}[/]")
    cap = capacity_line(report)
    if cap:
        print_()
        print_(f"[bold]Capacity[/]  {escape(cap)}")
    _work(report, print_, escape)


def _work(report: Report, print_, escape) -> None:
    """The model's shape, the arithmetic behind the predicted KV tokens, and this machine's GPUs."""
    line = model_line(report)
    rows = work_rows(report)
    gpus = gpu_lines(report.facts.get("gpu"))
    if line or rows or gpus:
        print_()
    if line:
        print_(f"[bold]{escape(line)}[/]")
    if rows:
        w0 = max(len(r[0]) for r in rows)
        w2 = max(len(r[2]) for r in rows)
        for name, work, value in rows:
            print_(f"  {escape(name):<{w0}}  [bold]{escape(value):>{w2}}[/]   [dim]{escape(work)}[/]")
        explanation = (report.facts.get("capacity") or {}).get("explanation")
        if explanation:
            print_(f"  [bold]Predicted vs logged[/]  {escape(explanation)}")
    for g in gpus:
        print_(f"[dim]{escape(g)}[/]")
