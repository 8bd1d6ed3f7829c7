"""The report as one self-contained HTML page: the pictures (inline SVG from svg.py) and the
Markdown ticket's text, escaped, in a <pre>. No script, no font, no request: a Content-Security-
Policy of default-src 'none' says so to the browser, and the page is the same offline.

Also what serve's incident directory gets beside report.md (attachments): memory.svg, queue.svg
and report.html, and the Markdown lines that link the SVGs; and the pictures `explain -o
report.md` writes beside its file (beside).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from html import escape
from pathlib import Path
from urllib.parse import quote

from vllm_doctor.data import Report
from vllm_doctor.render import svg
from vllm_doctor.render.summary import describe_input, headline

_CSS = """
body{margin:0;font:15px/1.45 system-ui,sans-serif;color:#222;background:#fff}
main{max-width:960px;margin:0 auto;padding:16px}
h1{font-size:1.3em;margin:.2em 0}h2{font-size:1.1em;margin:1.4em 0 .4em}
.input{color:#555;overflow-wrap:anywhere}
figure{margin:0;padding:8px;border:1px solid #ddd;border-radius:6px}
svg{display:block;max-width:100%;height:auto}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f6f6;padding:12px;border-radius:6px;font:13px/1.4 ui-monospace,monospace}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:right}
.failed{color:#b00}.degraded{color:#a60}.healthy{color:#070}
"""
_CSP = "default-src 'none'; style-src 'unsafe-inline'"
_FILES = (("memory.svg", svg.memory), ("queue.svg", svg.queue))
_XML = '<?xml version="1.0" encoding="UTF-8"?>\n'
_CHARTS = (  # the restarts first: they say which start the rest is about
    ("restarts", "Restarts", svg.restarts),
    ("memory", "Memory", svg.memory),
    ("queue", "Queue over time", svg.queue),
)


def render(report: Report, redact: bool = True) -> str:
    """The page for `explain --format html`; secrets masked as in the Markdown unless redact=False."""
    from vllm_doctor.render.markdown import render as to_markdown
    from vllm_doctor.render.redact import redact as masked

    mask = masked if redact else None
    return page(report, to_markdown(report, redact), mask)


def page(report: Report, markdown: str, mask: Callable[[str], str] | None = None) -> str:
    """The page around `markdown` (the ticket's text, already masked); `mask` masks the rest."""
    title = f"vllm-doctor: {headline(report)}"
    parts = [
        f'<h1 class="{escape(report.status)}">{escape(title)}</h1>',
        f'<p class="input">{escape(describe_input(report))}</p>',
    ]
    for key, heading, draw in _CHARTS:
        picture = draw(report)
        if picture is not None:
            table = _samples(report) if key == "queue" else ""
            parts.append(f'<section id="{key}"><h2>{heading}</h2><figure>{picture}</figure>{table}</section>')
    head = "".join(parts)
    return document(title, mask(head) if mask else head, markdown)


def document(title: str, head: str, text: str) -> str:
    """A whole page: `head` (HTML) and `text` (the ticket's, escaped into a <pre>)."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body><main>{head}"
        f'<section id="report"><h2>Report</h2><pre>{escape(text)}</pre></section></main></body></html>\n'
    )


def _samples(report: Report) -> str:
    """The samples the queue chart draws, as vLLM printed them (every number of the chart)."""
    rows = "".join(
        f"<tr><td>{p['line']}</td><td>{escape(p['time'] or '')}</td>"
        + "".join(f"<td>{'' if p.get(k) is None else p[k]}</td>" for k in ("running", "waiting", "kv_usage_pct"))
        + "</tr>"
        for p in report.series
    )
    head = "<tr><th>line</th><th>time</th><th>running</th><th>waiting</th><th>KV usage %</th></tr>"
    return f"<details><summary>The {len(report.series)} samples drawn</summary><table>{head}{rows}</table></details>"


def attachments(
    report: Report | None, markdown: Callable[[], str], mask: Callable[[str], str] | None = None
) -> list[tuple[str, Callable[[], str]]]:
    """serve's incident files beside report.md: (name, make) for memory.svg and queue.svg when
    there is something to draw, and report.html around report.md's text (masked by `mask` before
    it is escaped, so a secret with a & in it is still found)."""
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
    out.append(("report.html", lambda: page(report, mask(markdown()) if mask else markdown(), mask)))
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
            files.append((path.with_name(f"{path.stem}.{key}.svg"), _XML + (masked(picture) if redact else picture)))
    if not files:
        return markdown, []
    lines = ["### Pictures", "", *(f"![{p.name.split('.')[-2]}]({quote(p.name)})" for p, _ in files), ""]
    return markdown.rstrip("\n") + "\n\n" + "\n".join(lines), files
