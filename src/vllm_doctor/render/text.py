"""The report for a person at a terminal; the first screen is the answer.

The verdict line first, then per diagnosis: its title, the one-sentence summary with the
numbers, the fixes in order (and the corrected command when there is one), then the evidence,
each line cut at the width with "…"; `check`'s report then a line per area of its checks
(checkscreen.py). Everything is wrapped to the console's width (rich's, which
honours COLUMNS), between words. Verbosity: -1 (-q) the verdict line only; 0 the answer (the
first fix's reason, two evidence lines, each message once); 1 (-v) every reason, every evidence
line in full, every number with its meaning and unit, the model's shape, the capacity
arithmetic, the GPUs.

On a terminal the default view fits its height: when it would be taller than the screen less two
rows (the typed command above, the prompt below), show() gives up the parts in DROPS, in order,
at the first step that fits, and ends with a line that -v shows everything. A pipe or a file (-o)
gets everything.

Uses rich; colour follows NO_COLOR and turns off by itself when stdout is not a terminal.
Secrets are masked (redact.report) unless redact=False: this text is what gets pasted into chat.
Control and bidi characters from the input are shown as escapes (visible.py); the only colour
codes are rich's own.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import textwrap
from typing import IO, Any

from vllm_doctor.data import Diagnosis, Report
from vllm_doctor.render import bars, checkscreen
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
from vllm_doctor.render.visible import visible_doc

_STYLE = {"blocker": "bold white on red", "warning": "bold black on yellow", "info": "bold white on blue"}
_STATUS = {"failed": "bold red", "degraded": "bold yellow", "healthy": "bold green", "unknown": "bold"}
EVIDENCE_SHOWN = 2  # evidence lines per diagnosis without -v
CUT = "…"
# What the default view gives up to fit a terminal's height, in order; each step keeps the ones
# before it. Never given up: the verdict, the first diagnosis's title, summary and first fix (with
# its reason), the corrected command.
DROPS = (
    "pictures",  # the memory bar and the sparklines
    "notes",  # info diagnoses after the first: counted on one "also:" line
    "evidence",  # one evidence line per diagnosis
    "reasons",  # the reason of every fix but the first diagnosis's first
    "later fixes",  # the fixes after the third of the diagnoses after the first
    "their evidence",  # the evidence of the diagnoses after the first
    "context",  # the input line, earlier starts' details, the capacity line, the model and GPUs
    "others brief",  # the diagnoses after the first: badge and title, one line each
    "first evidence",  # the first diagnosis's evidence
    "first later fixes",  # the first diagnosis's fixes after the third
    "others counted",  # the diagnoses after the first: counted on the "also:" line
    "first other fixes",  # the first diagnosis's fixes after the first (its corrected command stays)
    "timeline",  # the starts and how the shown one ended: one line each, cut with "…"
)
FIXES_KEPT = 3  # fixes a diagnosis keeps under "later fixes"
_KIND = {"blocker": "blocker", "warning": "warning", "info": "note"}
SHORTENED = "(shortened to fit the terminal: -v shows everything)"  # the last line when DROPS gave up a part


def render(report: Report, redact: bool = True, verbosity: int = 0) -> str:
    """The text as a string, without colour (for -o FILE and pipes)."""
    buf = io.StringIO()
    show(report, file=buf, redact=redact, verbosity=verbosity)
    return buf.getvalue()


def show(report: Report, file: IO[str] | None = None, redact: bool = True, verbosity: int = 0,
         more: str | None = None) -> None:  # fmt: skip
    """Print the report to a terminal (or `file`), in colour where the terminal takes it; `more`:
    the last line's pointer to the rest (serve's: the incident report), for -v's."""
    from rich.console import Console

    if redact:
        from vllm_doctor.render.redact import report as masked

        report = masked(report)
    report = visible_doc(report)  # after the masking (it reads colour codes): the screen gets escapes, not commands
    console = Console(file=file, highlight=False, soft_wrap=True, no_color="NO_COLOR" in os.environ, emoji=False)
    drop: tuple[str, ...] = ()
    if verbosity == 0 and _tty(console):  # the answer stays on the screen once the prompt returns
        room = console.height - 2  # the typed command above, the prompt below
        for n in range(len(DROPS) + 1):  # the last step is printed even when it does not fit
            drop = DROPS[:n]
            with console.capture() as drawn:
                _Screen(console, verbosity, drop, more).report(report)
            if drawn.get().count("\n") <= room:
                break
    _Screen(console, verbosity, drop, more).report(report)


def _tty(console: Any) -> bool:
    """A terminal itself, not one FORCE_COLOR (--color always) makes of a pipe: a pipe gets everything."""
    try:
        return bool(console.file.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class _Screen:
    """Prints wrapped paragraphs: a styled head, then text wrapped under a hanging indent."""

    def __init__(self, console: Any, verbosity: int, drop: tuple[str, ...] = (), more: str | None = None):
        self.console = console
        self.more = more  # the last line's pointer to the rest, for -v's
        self.drop = frozenset(drop)  # the parts of DROPS given up to fit the terminal's height
        self.pictures = "pictures" not in self.drop  # the memory bar and sparklines (render/bars.py)
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
        context = "context" not in self.drop
        if context:
            self.say(describe_input(report), "dim")
        shown_below = checkscreen.folded(report)  # check: its could-not-run notes, one line after the areas
        for w in report.warnings:
            if w not in shown_below:
                self.say(w, indent=2, head="note:", head_style="yellow", lead=0, gap=1)
        for t in timeline(report):
            if "timeline" in self.drop:
                self.cut(t, "bold", 2, "", "")
            else:
                self.say(t, "bold", indent=2)
        for title, lines in earlier_lives(report):
            self.blank()
            self.say(title, "bold")
            for line in lines if context else []:
                self.say(line, indent=2)
        if report.all_lifetimes and len(report.lifetimes) > 1:
            self.blank()
            self.say(f"Start #{report.shown} (shown in full):", "bold")
        self.diagnoses(report)
        cap = capacity_line(report)
        if cap and context:
            self.blank()
            self.say(cap, indent=2, head="Capacity", head_style="bold", lead=0, gap=2)
        self.also(report)
        checkscreen.show(self, report)  # check: a line per area, what could not run
        if self.verbose:
            self.work(report)
        else:
            self.tail(report)

    def diagnoses(self, report: Report) -> None:
        """Each diagnosis in full, or (after the first, to fit the height) one line each, or counted."""
        brief = False
        for i, d in enumerate(report.diagnoses):
            if self.folded(i, d):
                continue
            if i and "others brief" in self.drop:
                if not brief:
                    self.blank()
                brief, self.hidden = True, True
                self.say(
                    d.title, "bold", indent=2, head=f" {d.severity.upper()} ", head_style=_STYLE[d.severity], gap=1
                )
                continue
            self.blank()
            command = corrected_command(report, redact=False) if i == 0 else None  # masked in show()
            self.diagnosis(d, report, command, first=i == 0)

    def folded(self, i: int, d: Diagnosis) -> bool:
        """A diagnosis after the first counted on the "also:" line instead of shown."""
        return i > 0 and ("others counted" in self.drop or ("notes" in self.drop and d.severity == "info"))

    def also(self, report: Report) -> None:
        """The diagnoses folded to fit the height, counted: "also: 1 warning, 2 notes, -v shows them"."""
        folded = [d for i, d in enumerate(report.diagnoses) if self.folded(i, d)]
        if not folded:
            return
        counts = [(kind, sum(d.severity == severity for d in folded)) for severity, kind in _KIND.items()]
        parts = [f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in counts if n]
        self.say(f"also: {', '.join(parts)}, -v shows {'it' if len(folded) == 1 else 'them'}", "dim")

    def tail(self, report: Report) -> None:
        """Without -v: a --model/--config that could not be read, this machine's GPUs when they
        inform the fixes (both context, given up to fit the height), and what -v adds."""
        gpu = report.facts.get("gpu") or {}
        shape = report.facts.get("model_shape") or {}
        ours = bool(gpu.get("available") and gpu.get("this_host"))  # this machine's GPUs inform the fixes
        if "context" not in self.drop:
            if shape.get("note") and shape.get("name") != report.facts.get("model"):  # --model/--config failed
                self.blank()
                self.say(model_line(report) or "", "dim", indent=2, lead=0)
            if ours:
                self.blank()
                for g in gpu_lines(gpu):
                    self.say(g, "dim", indent=2, lead=0)
        if self.drop:  # cut to fit the terminal: the last line says where the rest is
            hint: str | None = SHORTENED
        elif ours:
            hint = "(-v: every reason, number and evidence line, and the model)"
        elif self.hidden or model_line(report) or work_rows(report) or gpu:
            hint = "(-v: every reason, number and evidence line, the model and the GPUs)"
        else:
            hint = None
        if hint:
            self.say(self.more or hint, "dim")

    def diagnosis(self, d: Diagnosis, report: Report, command: tuple[str, str] | None, first: bool) -> None:
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
            kept = 1 if "first other fixes" in self.drop else None
            if kept is None and ("first later fixes" in self.drop or ("later fixes" in self.drop and not first)):
                kept = FIXES_KEPT
            self.hidden |= kept is not None and len(d.fixes) > kept
            for n, f in enumerate(d.fixes[:kept]):
                self.say(f.action, "bold", indent=7, head=f"{f.rank}. ")
                if self.verbose or (n == 0 and (first or "reasons" not in self.drop)):
                    self.say(f.why, "dim", indent=7)
                else:
                    self.hidden = True
        if command:
            self.say(command[0], "bold", indent=2)
            for line in _continued(command[1], self.width - 4):
                self.console.print("    " + line, markup=False)  # never cut: it must paste whole
        if self.pictures:
            bars.show(self.console, report, d)  # the memory bar, the queue's sparklines: nothing without numbers
        if "first evidence" not in self.drop and (first or "their evidence" not in self.drop):
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
        shown = lines if self.verbose else lines[: 1 if "evidence" in self.drop else EVIDENCE_SHOWN]
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
        quoted = f'"{w}"' if re.fullmatch(r"\$\{?[A-Za-z_]\w*\}?", w) else shlex.quote(w)  # "$VLLM_API_KEY" expands
        name, eq, value = w.partition("=")
        leading = all(re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", p) for p in parts)  # before `vllm serve`
        if leading and eq and re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
            quoted = f"{name}={shlex.quote(value)}"  # VAR=value is an assignment only while its name is unquoted
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
