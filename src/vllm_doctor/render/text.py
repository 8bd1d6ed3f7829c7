"""The report for a person at a terminal; the first screen is the answer.

The verdict line first, then per diagnosis: its title, the one-sentence summary with the
numbers, the fixes in order (and the corrected command when there is one), then the evidence,
each line cut at the width with "…". Everything is wrapped to the console's width (rich's, which
honours COLUMNS), between words. Verbosity: -1 (-q) the verdict line only; 0 the answer (the
first fix's reason, two evidence lines, each message once); 1 (-v) every reason, every evidence
line in full, every number with its meaning and unit, the model's shape, the capacity
arithmetic, the GPUs.

Uses rich; colour follows NO_COLOR and turns off by itself when stdout is not a terminal.
Secrets are masked (redact.report) unless redact=False: this text is what gets pasted into chat.
"""

from __future__ import annotations

import io
import os
import shlex
import textwrap
from typing import IO, Any

from vllm_doctor.data import Diagnosis, Report
from vllm_doctor.render import bars
from vllm_doctor.render.numbers import described
from vllm_doctor.render.summary import (
    capacity_line,
    corrected_command,
    describe_input,
    distinct_evidence,
    earlier_lives,
    gpu_lines,
    headline,
    message,
    model_line,
    timeline,
    where,
    work_rows,
)

_STYLE = {"blocker": "bold white on red", "warning": "bold black on yellow", "info": "bold white on blue"}
_STATUS = {"failed": "bold red", "degraded": "bold yellow", "healthy": "bold green", "unknown": "bold"}
EVIDENCE_SHOWN = 2  # evidence lines per diagnosis without -v
CUT = "…"


def render(report: Report, redact: bool = True, verbosity: int = 0) -> str:
    """The text as a string, without colour (for -o FILE and pipes)."""
    buf = io.StringIO()
    show(report, file=buf, redact=redact, verbosity=verbosity)
    return buf.getvalue()


def show(report: Report, file: IO[str] | None = None, redact: bool = True, verbosity: int = 0) -> None:
    """Print the report to a terminal (or `file`), in colour where the terminal takes it."""
    from rich.console import Console

    if redact:
        from vllm_doctor.render.redact import report as masked

        report = masked(report)
    console = Console(file=file, highlight=False, soft_wrap=True, no_color="NO_COLOR" in os.environ, emoji=False)
    pictures = True
    if console.is_terminal and verbosity == 0:  # the verdict must stay on the first screen: pictures go first
        with console.capture() as drawn:
            _Screen(console, verbosity).report(report)
        pictures = drawn.get().count("\n") <= console.height - 2  # the typed command above, the prompt below
    _Screen(console, verbosity, pictures).report(report)


class _Screen:
    """Prints wrapped paragraphs: a styled head, then text wrapped under a hanging indent."""

    def __init__(self, console: Any, verbosity: int, pictures: bool = True):
        self.console = console
        self.pictures = pictures  # the memory bar and sparklines (render/bars.py)
        self.width = max(console.width, 20)
        self.verbose = verbosity > 0
        self.quiet = verbosity < 0
        self.hidden = False  # something was left out that -v shows

    def say(
        self, body: str, style: str = "", indent: int = 0, head: str = "", head_style: str = "",
        lead: int | None = None, gap: int = 0,
    ) -> None:  # fmt: skip
        """`head` (then `gap` spaces) then `body`, wrapped at the width between words; the first
        line starts at `lead` (by default where the head ends at `indent`), the others at `indent`."""
        from rich.text import Text

        if lead is None:
            lead = max(indent - len(head) - gap, 0)
        first = lead + len(head) + gap
        lines = textwrap.wrap(
            body, self.width, initial_indent=" " * first, subsequent_indent=" " * indent, break_on_hyphens=False
        ) or [" " * first]  # fmt: skip
        for i, line in enumerate(lines):
            if i == 0:
                text = Text(" " * lead)
                text.append(head, style=head_style)
                text.append(" " * gap)
                text.append(line[first:], style=style)
            else:
                text = Text(" " * indent)
                text.append(line[indent:], style=style)
            self.console.print(text)

    def cut(self, body: str, style: str, indent: int, head: str, head_style: str) -> None:
        """One line, cut at the width with "…" (evidence: a log line is not wrapped)."""
        from rich.text import Text

        room = self.width - indent - len(head)
        if len(body) > room:
            body = body[: max(room - 1, 0)].rstrip() + CUT
        text = Text(" " * indent)
        text.append(head, style=head_style)
        text.append(body, style=style)
        self.console.print(text)

    def blank(self) -> None:
        self.console.print()

    def report(self, report: Report) -> None:
        verdict = f"vllm-doctor: {headline(report)}"
        if self.quiet:  # one line for scripts and prompts: never wrapped
            self.console.print(verdict, style=_STATUS.get(report.status, "bold"), markup=False)
            return
        self.say(verdict, _STATUS.get(report.status, "bold"))
        if report.empty:
            return  # one line: the verdict (or there is nothing else to say)
        self.say(describe_input(report), "dim")
        for w in report.warnings:
            self.say(w, indent=2, head="note:", head_style="yellow", lead=0, gap=1)
        for t in timeline(report):
            self.say(t, "bold", indent=2)
        for title, lines in earlier_lives(report):
            self.blank()
            self.say(title, "bold")
            for line in lines:
                self.say(line, indent=2)
        if report.all_lifetimes and len(report.lifetimes) > 1:
            self.blank()
            self.say(f"Start #{report.shown} (shown in full):", "bold")
        for i, d in enumerate(report.diagnoses):
            self.blank()
            self.diagnosis(
                d, report, command=corrected_command(report, redact=False) if i == 0 else None
            )  # masked above
        cap = capacity_line(report)
        if cap:
            self.blank()
            self.say(cap, indent=2, head="Capacity", head_style="bold", lead=0, gap=2)
        if self.verbose:
            self.work(report)
        else:
            self.tail(report)

    def tail(self, report: Report) -> None:
        """Without -v: a --model/--config that could not be read, this machine's GPUs when they
        inform the fixes, and what -v adds."""
        gpu = report.facts.get("gpu") or {}
        shape = report.facts.get("model_shape") or {}
        if shape.get("note") and shape.get("name") != report.facts.get("model"):  # --model/--config failed
            self.blank()
            self.say(model_line(report) or "", "dim", indent=2, lead=0)
        if gpu.get("available") and gpu.get("this_host"):  # this machine's GPUs inform the fixes
            self.blank()
            for g in gpu_lines(gpu):
                self.say(g, "dim", indent=2, lead=0)
            self.say("(-v: every reason, number and evidence line, and the model)", "dim")
        elif self.hidden or model_line(report) or work_rows(report) or gpu:
            self.say("(-v: every reason, number and evidence line, the model and the GPUs)", "dim")

    def diagnosis(self, d: Diagnosis, report: Report, command: tuple[str, str] | None) -> None:
        if d.severity == "info" and not self.verbose and not d.fixes and not command:
            self.say(d.summary, indent=2, head=" INFO ", head_style=_STYLE["info"], gap=1)  # a note: one paragraph
            if self.pictures:
                bars.show(self.console, report, d)
            self.hidden = True
            return
        badge, meta = f" {d.severity.upper()} ", f"{d.category} · rule {d.rule} · {d.confidence} confidence"
        wide = len(badge) + 1 + len(d.title) + 3 + len(meta) <= self.width  # the rule beside its title
        if wide:
            from rich.text import Text

            self.console.print(Text.assemble((badge, _STYLE[d.severity]), " ", (d.title, "bold"), "   ", (meta, "dim")))
        else:
            self.say(d.title, "bold", indent=2, head=badge, head_style=_STYLE[d.severity], gap=1)
        self.say(d.summary, indent=2)
        if d.fixes:
            self.say("Fixes, in order", "bold", indent=2)
            for n, f in enumerate(d.fixes):
                self.say(f.action, "bold", indent=7, head=f"{f.rank}. ")
                if self.verbose or n == 0:
                    self.say(f.why, "dim", indent=7)
                else:
                    self.hidden = True
        if command:
            self.say(command[0], "bold", indent=2)
            for line in _continued(command[1], self.width - 4):
                self.console.print("    " + line, markup=False)  # never cut: it must paste whole
        if self.pictures:
            bars.show(self.console, report, d)  # the memory bar, the queue's sparklines: nothing without numbers
        self.evidence(d, report)
        if self.verbose and d.numbers:
            self.say("Numbers", "bold", indent=2)
            for meaning, value in described(d.numbers):
                self.say(f"{meaning}: {value}", indent=6, lead=4)
        if not wide:
            self.say(meta, "dim", indent=2)

    def evidence(self, d: Diagnosis, report: Report) -> None:
        lines = d.evidence if self.verbose else distinct_evidence(d.evidence)
        if not lines:
            return
        self.say("Evidence", "bold", indent=2)
        shown = lines if self.verbose else lines[:EVIDENCE_SHOWN]
        self.hidden |= len(shown) < len(d.evidence) or bool(d.context)
        context = d.context if self.verbose else []
        w = max(len(where(e, report)) for e in [*shown, *context])
        for e in shown:
            head = f"{where(e, report):>{w}}  "
            if self.verbose:
                self.say(e.text, indent=4 + len(head), head=head, head_style="cyan", lead=4)
            else:
                self.cut(message(e.text), "", 4, head, "cyan")
        for e in context:
            head = f"{where(e, report):>{w}}  "
            self.say(f"{e.text}  (wrapper; the cause is above)", "dim", indent=4 + len(head), head=head, lead=4)

    def work(self, report: Report) -> None:
        """The model's shape, the arithmetic behind the predicted KV tokens, and this machine's GPUs."""
        line = model_line(report)
        rows = work_rows(report)
        gpus = gpu_lines(report.facts.get("gpu"))
        if line or rows or gpus:
            self.blank()
        if line:
            self.say(line, "bold", indent=2, lead=0)
        for name, work, value in rows:
            self.say(work, "dim", indent=4, head=f"{name} {value}", head_style="bold", lead=2, gap=2)
        explanation = (report.facts.get("capacity") or {}).get("explanation")
        if rows and explanation:
            self.say(explanation, indent=4, head="Predicted vs logged", head_style="bold", lead=2, gap=2)
        for g in gpus:
            self.say(g, "dim", indent=2, lead=0)


def _continued(command: str, width: int) -> list[str]:
    """A command line in shell continuation lines (`\\` at each end), broken between arguments,
    an option kept with its value: it pastes back into a shell as one command."""
    try:
        words = shlex.split(command)
    except ValueError:
        return [command]
    parts: list[str] = []
    for w in words:
        quoted = shlex.quote(w)
        if parts and parts[-1].startswith("-") and " " not in parts[-1] and not w.startswith("-"):
            parts[-1] += " " + quoted
        else:
            parts.append(quoted)
    lines, cur = [], ""
    for p in parts:
        if cur and len(cur) + 1 + len(p) + 2 > width:
            lines.append(cur + " \\")
            cur = "  " + p
        else:
            cur = f"{cur} {p}" if cur else p
    return lines + [cur]
