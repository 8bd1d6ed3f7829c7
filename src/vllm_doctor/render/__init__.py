"""render/ owns the output formats: one RENDERERS map of format -> render(doc, redact) -> str,
used by every command (explain, watch, explain --metrics, plan, serve's incident report).

text (rich), markdown (the ticket), json (the contract vllm-doctor/report/1 and plan/1); the
lines they share are in summary.py, secret masking in redact.py. May import data, errors,
matching.expr (number formatting) and capacity (for plans); nothing imports render but the
pipeline's callers (cli, serve). A new format is one module with a `render` function and one
entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_doctor.data import Report


def _text(doc: Report, redact: bool = True) -> str:
    from vllm_doctor.render import text

    return text.render(doc, redact)


def _markdown(doc: Report, redact: bool = True) -> str:
    from vllm_doctor.render import markdown

    return markdown.render(doc, redact)


def _json(doc: Report, redact: bool = True) -> str:
    from vllm_doctor.render import json

    return json.render(doc, redact)


# modules load on first use: the CLI's cold start stays free of rich unless text is asked for
RENDERERS: dict[str, Callable[[Any, bool], str]] = {"text": _text, "markdown": _markdown, "json": _json}
FORMATS = tuple(RENDERERS)


def render(doc: Report, fmt: str, redact: bool = True) -> str:
    return RENDERERS[fmt](doc, redact)
