"""The report as a Markdown ticket: what failed, the fixes in order, the numbers, the evidence.

The plain flavor is the Markdown GitHub, GitLab and Jira's Markdown importers all render: headings,
lists, tables and fenced code blocks, no raw HTML; the github flavor folds each diagnosis's
evidence in a <details> block. Command lines and log lines are always in fenced code blocks
(a fence longer than any backtick run in them); every other word from the input is escaped
(visible.md) or in a code span, so a model path like `/m<img src=x onerror=...>` or
`![](http://...)` is text, never HTML or an image. Control characters are shown as escapes.
"""

from __future__ import annotations

from vllm_doctor.data import Report
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
from vllm_doctor.render.visible import cell, code, fence, md, visible


def render(report: Report, redact: bool = True, flavor: str = "plain") -> str:
    """The ticket text; secrets masked unless redact=False (in every string of the Report, before
    the escapes: an escape inside a secret would hide it from the masking)."""
    if redact:
        from vllm_doctor.render.redact import report as masked

        report = masked(report)
    out = [f"## vllm-doctor: {md(headline(report))}", "", f"**Input:** {md(describe_input(report))}", ""]
    for w in report.warnings:
        out += [f"> Note: {md(w)}", ""]
    lines = timeline(report)
    if lines:
        out += [f"**{md(lines[0])}**", ""] + [f"- {md(t)}" for t in lines[1:]] + ([""] if lines[1:] else [])
    for title, body in earlier_lives(report):
        out += [f"### {md(title)}", ""] + [f"- {md(b)}" for b in body] + [""]
    cap = capacity_line(report)
    if not report.diagnoses:
        out += [md(nothing(report)), ""]
    for i, d in enumerate(report.diagnoses):
        out += [f"### {d.severity.capitalize()}: {md(d.title)}", ""]
        out += [f"{code(d.category)} · rule {code(d.rule)} · {md(d.confidence)} confidence", "", md(d.summary), ""]
        if d.fixes:
            out.append("**Fixes, in order**")
            out.append("")
            for f in d.fixes:
                out.append(f"{f.rank}. **{md(f.action)}** — {md(f.why)}")
            out.append("")
        command = corrected_command(report, redact=False) if i == 0 else None  # the Report is masked already
        if command:
            out += [f"**{md(command[0])}**", "", *_block("sh", [command[1]]), ""]
        numbers = described(d.numbers)
        if numbers:
            out += ["| number | value |", "|---|---|"]
            out += [f"| {cell(meaning)} | {cell(value)} |" for meaning, value in numbers]
            out.append("")
        lines = [f"{where(e, report, prefix='line ')}: {e.text}" for e in d.evidence]
        lines += [
            f"{where(e, report, prefix='line ')}: {e.text}   (wrapper error; the cause is above)" for e in d.context
        ]
        if lines and flavor == "github":
            out += [f"<details><summary>Evidence ({len(lines)} lines)</summary>", "", *_block("text", lines)]
            out += ["", "</details>", ""]
        elif lines:
            out += [f"**Evidence** ({len(lines)} line{'s' if len(lines) != 1 else ''})", "", *_block("text", lines)]
            out += [""]
    if cap:
        out += [f"**Capacity:** {md(cap)}", ""]
    out += _markdown_work(report)
    return visible("\n".join(out))


def _block(info: str, lines: list[str]) -> list[str]:
    """A fenced code block: no line in it can close the fence."""
    ticks = fence(lines)
    return [f"{ticks}{info}", *lines, ticks]


def _markdown_work(report: Report) -> list[str]:
    out: list[str] = []
    line = model_line(report)
    if line:
        out += [f"**{md(line)}**", ""]
    rows = work_rows(report)
    if rows:
        out += ["| step | work | value |", "|---|---|---|"]
        out += [f"| {cell(a)} | {cell(b)} | {cell(c)} |" for a, b, c in rows]
        out.append("")
        explanation = (report.facts.get("capacity") or {}).get("explanation")
        if explanation:
            out += [f"Predicted vs logged: {md(explanation)}", ""]
    out += [f"> {md(g)}" for g in gpu_lines(report.facts.get("gpu"))]
    return out + [""] if out and out[-1] != "" else out
