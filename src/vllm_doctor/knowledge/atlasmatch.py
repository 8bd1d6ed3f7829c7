"""A failure no hand rule names, named by vLLM itself: the atlas (src/vllm_doctor/atlas/, read from
each release's wheel) holds every message vLLM raises, with the file and function that raise it and
the releases that print it. The exception a failed start ended with is looked up there: its
template, raise site, releases, area and the advice the message itself gives ("Please use
bfloat16", "try cudagraph_mode=PIECEWISE") become the report's words.

A template whose literal text is too short to tell it apart (`f"{x}"`, `f"Invalid {a}: {b}"`) is
never matched alone; a match must hold the template's longest literal and its whole regex (or, in
a message cut at 400 characters, the first 40 characters of one of its literal runs). A terse one
with some literal text (`f"{name} must be positive"`, "Unsupported OS") is named only with its
exception type: the exception line is `ValueError: ...` and the message is the whole template. This runs
once per diagnosed failure, on one message, never on the log's lines: the engine stays linear.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from vllm_doctor.versions import version_tuple

MIN_ANCHOR = 12  # the longest literal run of a template named alone
MIN_LITERAL = 20  # ... and all its literal text
MIN_TYPED = 10  # the literal text of a terse template named with its exception type ("cancelled", a
# shutdown's echo of a dead worker, is not)
MESSAGE_CHARS = 2000  # of a message, the part compared
PLACEHOLDER = re.compile(r"\{[^{}]*\}")  # a template's interpolated value
CUT_AT, CUT_ANCHOR = 400, 40  # a message this long was cut: a literal run this long names it alone

# where in vLLM's tree a message comes from, as an operator names the step (first match wins)
AREAS = (
    ("vllm/engine/arg_utils", "engine arguments"),
    ("vllm/config", "config validation"),
    ("vllm/entrypoints/openai/cli_args", "engine arguments"),
    ("vllm/entrypoints", "API server"),
    ("vllm/v1/core/kv_cache", "KV cache planning"),
    ("vllm/v1/core", "scheduler and KV cache"),
    ("vllm/v1/worker", "worker and memory"),
    ("vllm/worker", "worker and memory"),
    ("vllm/distributed", "parallel setup"),
    ("vllm/executor", "parallel setup"),
    ("vllm/v1/executor", "parallel setup"),
    ("vllm/model_executor/model_loader", "model loading"),
    ("vllm/model_executor/layers/quantization", "quantization"),
    ("vllm/model_executor/models", "model code"),
    ("vllm/transformers_utils", "model config and tokenizer"),
    ("vllm/tokenizers", "tokenizer and chat template"),
    ("vllm/platforms", "platform"),
    ("vllm/attention", "attention backend"),
    ("vllm/v1/attention", "attention backend"),
    ("vllm/lora", "LoRA"),
    ("vllm/multimodal", "multimodal inputs"),
    ("vllm/compilation", "compilation and CUDA graphs"),
)
# a sentence of the message that tells the user what to do
_ADVICE = re.compile(
    r"(?:^|(?<=[.!;:]\s))((?:Please|Try|Consider|Use|Set|Pass|Increase|Decrease|Reduce|Lower|Raise|Make sure|"
    r"You (?:can|may|should|need)|Install|Upgrade|Enable|Disable|Specify|Remove|Add|Either|Instead)\b[^.!\n]{3,300}[.!]?)"
)


@dataclass(frozen=True)
class Named:
    template: str
    site: str  # file:function
    releases: str  # "0.20.2-0.34.0"
    area: str
    advice: str | None  # the message's own sentence of what to do


def name(exc_type: str | None, message: str, version: str | None = None) -> Named | None:
    """The atlas' template of `message` (raised as `exc_type`, by `version` when known), or None."""
    text = message[:MESSAGE_CHARS].strip()
    best: tuple[tuple, dict[str, Any]] | None = None
    want = version_tuple(version)
    releases = _releases()
    cut = len(text) >= CUT_AT  # the log's reading keeps 400 characters of a message
    alone = _candidates() if len(text) >= MIN_LITERAL else []
    for t in [*alone, *_typed().get(exc_type or "", [])]:
        if t["alone"]:
            whole = t["anchor"].strip("'\"") in text and bool(_regex(t["regex"]).search(text))
            if not whole and not (cut and any(run[:CUT_ANCHOR] in text for run in t["runs"])):
                continue
        elif not _regex(t["regex"], whole=True).search(text):
            continue
        else:
            whole = True
        spans = t["spans"]
        printed = bool(want) and any(
            version_tuple(releases[a]) <= want <= version_tuple(releases[b]) for a, b in spans
        )  # fmt: skip
        score = (whole, t.get("exc") == exc_type, printed, t["kind"] == "raise", t["literal"])
        if best is None or score > best[0]:
            best = (score, t)
    if best is None:
        return None
    t = best[1]
    said = ", ".join(releases[a] if a == b else f"{releases[a]}-{releases[b]}" for a, b in t["spans"])
    advice = _ADVICE.search(text)
    return Named(
        t["template"], f"{t['file']}:{t['func']}", said, area(t["file"]), advice[1].strip() if advice else None
    )


def told_apart(t: dict[str, Any]) -> bool:
    """Whether a template has literal text enough to be named alone (else kept for coverage only)."""
    return t["anchor_len"] >= MIN_ANCHOR and len(PLACEHOLDER.sub("", t["template"])) >= MIN_LITERAL


def told_apart_typed(t: dict[str, Any]) -> bool:
    """Whether a terse template is named with its exception type (the whole message, that type)."""
    return bool(t.get("exc")) and len(PLACEHOLDER.sub("", t["template"]).strip()) >= MIN_TYPED


def area(path: str) -> str:
    return next((what for prefix, what in AREAS if path.startswith(prefix)), "vLLM")


@functools.cache
def _candidates() -> list[dict[str, Any]]:
    """The templates that can be told apart: a long enough literal (kept for coverage otherwise)."""
    from vllm_doctor.atlas import templates

    out = []
    for t in templates():
        if told_apart(t):
            runs = [
                r
                for r in PLACEHOLDER.split(t["template"].replace("{{", "{").replace("}}", "}"))
                if len(r) >= CUT_ANCHOR
            ]
            out.append({**t, "literal": len(PLACEHOLDER.sub("", t["template"])), "runs": runs, "alone": True})
    return out


@functools.cache
def _typed() -> dict[str, list[dict[str, Any]]]:
    """The terse templates named with their exception type, by that type."""
    from vllm_doctor.atlas import templates

    out: dict[str, list[dict[str, Any]]] = {}
    for t in templates():
        if not told_apart(t) and told_apart_typed(t):
            literal = len(PLACEHOLDER.sub("", t["template"]))
            out.setdefault(t["exc"], []).append({**t, "literal": literal, "alone": False})
    return out


@functools.cache
def _releases() -> list[str]:
    from vllm_doctor.atlas import message_releases

    return message_releases()


@functools.cache
def _regex(pattern: str, whole: bool = False) -> Any:
    """RE2 (matching/linear.py), kept compiled: linear in the message whatever the template's groups.
    A quote at either end is optional: the message read from the log lost its end quotes (a text fact).
    `whole`: the message is the template, start to end."""
    from vllm_doctor.matching.loader import compile_regex

    if pattern[:1] in ("'", '"'):
        pattern = "['\"]?" + pattern[1:]
    if pattern[-1:] in ("'", '"') and pattern[-2:-1] != "\\":
        pattern = pattern[:-1] + "['\"]?"
    return compile_regex(f"(?s)^(?:{pattern})$" if whole else "(?s)" + pattern)
