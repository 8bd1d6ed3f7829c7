"""render/ owns the output formats: one RENDERERS map of format -> render(doc, redact) -> str,
used by every command (explain, watch, explain --metrics, plan, serve's incident report).

text (rich), markdown (the ticket), json (the contract vllm-doctor/report/1), html (the ticket
with its pictures: html.py, svg.py; bars.py holds the pictures' numbers and the terminal's bar
and sparklines); plan.py renders a Plan in the first three (plan/1); the lines reports share are
in summary.py, secret masking in redact.py, the escapes that keep the input's control
characters and Markdown from acting (visible.py). May import data, errors,
matching.expr (number formatting) and capacity (for plans); nothing imports render but the
pipeline's callers (cli, serve; preflight's gate for visible.py). A new format is one module with a `render` function and one
entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm_doctor.data import Report  # dataclasses only: cheap

if TYPE_CHECKING:
    from vllm_doctor.capacity.plan import Plan


def _text(doc: Report | Plan, redact: bool = True, verbosity: int = 0, **_: Any) -> str:
    if isinstance(doc, Report):
        from vllm_doctor.render import text

        return text.render(doc, redact, verbosity)
    from vllm_doctor.render import plan

    return plan.text(doc)


def _markdown(doc: Report | Plan, redact: bool = True, flavor: str = "plain", **_: Any) -> str:
    if isinstance(doc, Report):
        from vllm_doctor.render import markdown

        return markdown.render(doc, redact, flavor)
    from vllm_doctor.render import plan

    return plan.markdown(doc)


def _json(doc: Report | Plan, redact: bool = True, **_: Any) -> str:
    if isinstance(doc, Report):
        from vllm_doctor.render import json

        return json.render(doc, redact)
    from vllm_doctor.render import plan

    return plan.json(doc)


def _html(doc: Report | Plan, redact: bool = True, **_: Any) -> str:
    from vllm_doctor.render import html

    if isinstance(doc, Report):
        return html.render(doc, redact)
    from vllm_doctor.render import plan

    return html.document("vllm-doctor plan", plan.markdown(doc))


# modules load on first use: the CLI's cold start stays free of rich unless text is asked for,
# and of render.plan (capacity.plan, the arithmetic, kvcache) unless a Plan is rendered.
# Each takes (doc, redact) and the options of its own format by keyword: text's verbosity
# (-1 -q, 0, 1 -v), markdown's flavor ("plain" renders in GitHub, GitLab and Jira; "github"
# folds the evidence in <details>); a format ignores the others'.
# A new format is one entry here: its renderer, the other names `-o` takes for it, and the file
# suffixes that choose it; RENDERERS, FORMATS, FORMAT_NAMES and SUFFIXES follow from it, and a
# test holds the --format choices (cli/options.py's Format) to FORMATS.
FORMAT_TABLE: dict[str, tuple[Callable[..., str], tuple[str, ...], tuple[str, ...]]] = {
    "text": (_text, ("txt",), (".txt",)),
    "markdown": (_markdown, ("md",), (".md", ".markdown")),
    "json": (_json, (), (".json",)),
    "html": (_html, (), (".html", ".htm")),
}
RENDERERS: dict[str, Callable[..., str]] = {name: entry[0] for name, entry in FORMAT_TABLE.items()}
FORMATS = tuple(RENDERERS)
FORMAT_NAMES = {alias: name for name, (_, aliases, _s) in FORMAT_TABLE.items() for alias in (name, *aliases)}
SUFFIXES = {suffix: name for name, (_, _a, suffixes) in FORMAT_TABLE.items() for suffix in suffixes}


def render(doc: Report | Plan, fmt: str, redact: bool = True, verbosity: int = 0, flavor: str = "plain") -> str:
    """`doc` in format `fmt`: a Report (explain, watch, serve) or a Plan; plans hold no secrets."""
    return RENDERERS[fmt](doc, redact, verbosity=verbosity, flavor=flavor)
