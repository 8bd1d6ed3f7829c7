"""The report as a Markdown ticket: what failed, the fixes in order, the numbers, the evidence.

The plain flavor is the Markdown GitHub, GitLab and Jira's Markdown importers all render: headings,
lists, tables and fenced code blocks, no raw HTML; the github flavor folds each diagnosis's
evidence in a <details> block. Command lines and log lines are always in fenced code blocks.
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


def render(report: Report, redact: bool = True, flavor: str = "plain") -> str:
    """The ticket text; secrets masked unless redact=False (line for line, so nothing moves)."""
    if redact:  # the evidence first, each line beside its neighbours (a token a wrap cut); the text below
        from vllm_doctor.render.redact import report as masked

        report = masked(report)
    out = [f"## vllm-doctor: {headline(report)}", "", f"**Input:** {describe_input(report)}", ""]
    for w in report.warnings:
        out += [f"> Note: {w}", ""]
    lines = timeline(report)
    if lines:
        out += [f"**{lines[0]}**", ""] + [f"- {t}" for t in lines[1:]] + ([""] if lines[1:] else [])
    for title, body in earlier_lives(report):
        out += [f"### {title}", ""] + [f"- {b}" for b in body] + [""]
    cap = capacity_line(report)
    if not report.diagnoses:
        out += [nothing(report), ""]
    for i, d in enumerate(report.diagnoses):
        out += [f"### {d.severity.capitalize()}: {d.title}", ""]
        out += [f"`{d.category}` · rule `{d.rule}` · {d.confidence} confidence", "", d.summary, ""]
        if d.fixes:
            out.append("**Fixes, in order**")
            out.append("")
            for f in d.fixes:
                out.append(f"{f.rank}. **{f.action}** — {f.why}")
            out.append("")
        command = corrected_command(report, redact=False) if i == 0 else None  # the whole ticket is masked below
        if command:
            out += [f"**{command[0]}**", "", "```sh", command[1], "```", ""]
        numbers = described(d.numbers)
        if numbers:
            out += ["| number | value |", "|---|---|"]
            out += [f"| {_cell(meaning)} | {_cell(value)} |" for meaning, value in numbers]
            out.append("")
        lines = [f"{where(e, report, prefix='line ')}: {e.text}" for e in d.evidence]
        lines += [
            f"{where(e, report, prefix='line ')}: {e.text}   (wrapper error; the cause is above)" for e in d.context
        ]
        if lines and flavor == "github":
            out += [f"<details><summary>Evidence ({len(lines)} lines)</summary>", "", "```text", *lines, "```"]
            out += ["", "</details>", ""]
        elif lines:
            out += [f"**Evidence** ({len(lines)} line{'s' if len(lines) != 1 else ''})", "", "```text", *lines]
            out += ["```", ""]
    if cap:
        out += [f"**Capacity:** {cap}", ""]
    out += _markdown_work(report)
    text = "\n".join(out)
    if redact:
        from vllm_doctor.render.redact import redact as mask

        text = mask(text)
    return text


def _cell(text: str) -> str:
    """A table cell: a "|" in it would end the cell (GitHub, GitLab and Jira alike)."""
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown_work(report: Report) -> list[str]:
    out: list[str] = []
    line = model_line(report)
    if line:
        out += [f"**{line}**", ""]
    rows = work_rows(report)
    if rows:
        out += ["| step | work | value |", "|---|---|---|"]
        out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
        out.append("")
        explanation = (report.facts.get("capacity") or {}).get("explanation")
        if explanation:
            out += [f"Predicted vs logged: {explanation}", ""]
    out += [f"> {g}" for g in gpu_lines(report.facts.get("gpu"))]
    return out + [""] if out and out[-1] != "" else out
