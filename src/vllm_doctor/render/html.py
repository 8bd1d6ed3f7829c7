"""The report as one self-contained HTML page, built from the Report (not from the Markdown
text): the verdict, each diagnosis's summary, its fixes as an ordered list, its numbers as a
table, the corrected command and the evidence (with line numbers) as code, the pictures inline
(svg.py) and the starts' timeline. The page is a jinja2 template (templates/, shipped in the
wheel) with autoescaping on: every value from the log is text unless it is markupsafe.Markup,
which only svg.py's pictures are (escaped with the same markupsafe.escape). No script, no font,
no request: a Content-Security-Policy of default-src 'none' says so to the browser, and the page
is the same offline. Control and bidi characters are shown as escapes (visible.py), after the masking.

Also what serve's incident directory gets beside report.md (attachments): memory.svg, queue.svg
and report.html, and the Markdown lines that link the SVGs; and the pictures `explain -o
report.md` writes beside its file (beside).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from markupsafe import Markup

from vllm_doctor.data import Report
from vllm_doctor.render import svg
from vllm_doctor.render.numbers import described
from vllm_doctor.render.summary import (
    capacity_line,
    corrected_command,
    describe_input,
    earlier_lives,
    gpu_lines,
    headline,
    model_line,
    nothing,
    timeline,
    where,
    work_rows,
)
from vllm_doctor.render.visible import visible

if TYPE_CHECKING:
    from jinja2 import Environment

    from vllm_doctor.render.redact import Redactor

_FILES = (("memory.svg", svg.memory), ("queue.svg", svg.queue))
_XML = '<?xml version="1.0" encoding="UTF-8"?>\n'
_CHARTS = (  # the restarts first: they say which start the rest is about
    ("restarts", "Restarts", svg.restarts),
    ("memory", "Memory", svg.memory),
    ("queue", "Queue over time", svg.queue),
)


@cache
def _env() -> Environment:
    from jinja2 import Environment, PackageLoader, StrictUndefined

    # autoescape for every template, whatever its name: nothing reaches the page unescaped by accident
    return Environment(
        loader=PackageLoader("vllm_doctor.render", "templates"), autoescape=True, undefined=StrictUndefined
    )


def render(
    report: Report, redact: bool = True, redactor: Redactor | None = None, ended: dict[str, Any] | None = None
) -> str:
    """The page for `explain --format html`: secrets masked in every string of the Report (by
    `redactor`, else the pattern forms) unless redact=False. serve adds `ended`: how the server
    ended (incident.ended), masked by the same redactor."""
    if redact:
        from vllm_doctor.render import redact as masking

        report = masking.report(report, redactor)
        ended = masking.report(ended, redactor) if ended else ended
    return visible(_env().get_template("report.html.j2").render(_context(report), ended=ended))


def _context(report: Report) -> dict[str, Any]:
    """What the template shows, in the words the other formats use (summary.py)."""
    charts = []
    for key, heading, draw in _CHARTS:
        picture = draw(report)
        if picture is not None:
            charts.append({"key": key, "heading": heading, "svg": Markup(picture)})
    diagnoses = []
    for i, d in enumerate(report.diagnoses):
        wrapper = [(e, "wrapper error; the cause is above") for e in d.context]
        evidence = [
            (where(e, report, prefix="line ") + ":", e.text, note)
            for e, note in [(e, "") for e in d.evidence] + wrapper
        ]
        diagnoses.append({
            "heading": f"{d.severity.capitalize()}: {d.title}", "severity": d.severity, "category": d.category,
            "rule": d.rule, "confidence": d.confidence, "summary": d.summary, "fixes": d.fixes,
            "command": corrected_command(report, redact=False) if i == 0 else None,  # the Report is masked already
            "numbers": described(d.numbers), "evidence": evidence,
        })  # fmt: skip
    return {
        "title": f"vllm-doctor: {headline(report)}", "status": report.status, "input": describe_input(report),
        "warnings": report.warnings, "timeline": timeline(report), "earlier": earlier_lives(report),
        "diagnoses": diagnoses, "nothing": nothing(report), "capacity": capacity_line(report), "charts": charts,
        "samples": report.series, "model": model_line(report), "work": work_rows(report),
        "explanation": (report.facts.get("capacity") or {}).get("explanation"),
        "gpu": gpu_lines(report.facts.get("gpu")),
    }  # fmt: skip


def document(title: str, text: str) -> str:
    """A page whose content is `text` as written, in a <pre> (a plan's Markdown)."""
    return visible(_env().get_template("text.html.j2").render(title=title, text=text))


def attachments(
    report: Report | None, redactor: Redactor | None = None, ended: Callable[[], dict[str, Any]] | None = None
) -> list[tuple[str, Callable[[], str]]]:
    """serve's incident files beside report.md: (name, make) for memory.svg and queue.svg when
    there is something to draw, and report.html, with how the server ended (`ended`), masked by
    `redactor` (None: not masked: serve's --no-redact)."""
    if report is None:
        return []
    out: list[tuple[str, Callable[[], str]]] = []
    for name, draw in _FILES:
        try:
            picture = draw(report)
        except Exception as e:  # serve records it as that file's error; the other files are written
            out.append((name, partial(_fail, e)))
            continue
        if picture is not None:
            out.append((name, partial(str.__add__, _XML, picture)))
    out.append(("report.html", lambda: render(report, redactor is not None, redactor, ended() if ended else None)))
    return out


def links(report: Report | None) -> list[str]:
    """report.md's lines that show the SVGs written beside it (a ticket system shows attachments)."""
    try:
        out = [f"![{name[:-4]}]({name})" for name, draw in _FILES if report is not None and draw(report)]
    except Exception:  # the picture's own error is reported with its file (attachments)
        out = []
    return ["", "### Pictures", "", *out, "", "The whole report with its pictures: `report.html`."] if out else []


def _fail(e: Exception) -> str:
    raise e


def beside(report: Report, path: Path, markdown: str, redact: bool = True) -> tuple[str, list[tuple[Path, str]]]:
    """`explain -o report.md`: the Markdown with a Pictures section that links the SVGs, and those
    files (path, text), each drawn only when there is something to draw. Named after the report
    (report.memory.svg, report.queue.svg, report.restarts.svg), so two reports in one directory
    keep their own; masked as the Markdown is."""
    from vllm_doctor.render.redact import redact as masked

    files = []
    for key, _, draw in _CHARTS:
        picture = draw(report)
        if picture is not None:
            files.append(
                (path.with_name(f"{path.stem}.{key}.svg"), _XML + visible(masked(picture) if redact else picture))
            )
    if not files:
        return markdown, []
    lines = ["### Pictures", "", *(f"![{p.name.split('.')[-2]}]({quote(p.name)})" for p, _ in files), ""]
    return markdown.rstrip("\n") + "\n\n" + "\n".join(lines), files
