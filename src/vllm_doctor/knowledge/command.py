"""The corrected command: the log's `vllm serve` line with the top diagnosis's first fix applied.

Rebuilt from what the log states of the server's arguments: vLLM's own `non-default args: {...}`
(0.9+, whole: what it leaves out is at its default) or, failing that, the command line pasted
above the log (its backslash-continued lines too). A Namespace(...) dump or an engine config
line lists every argument, defaults included, so no command is rebuilt from those. Secrets stay
in the line: the renderers mask it (render/redact.py), as they mask everything they write.
"""

from __future__ import annotations

import json
import shlex

from vllm_doctor.data import Corrected, Diagnosis, FixOut
from vllm_doctor.facts import Facts

_POSITIONAL = ("model_tag", "model")  # the model: `vllm serve MODEL`, never a flag
_FLAG_FORMS = ("-",)  # a pasted command's flags
_DICT_FORMS = ("{",)  # non-default args (and a wrapper's printed config dict)


def arguments(facts: Facts) -> tuple[str | None, list[tuple[str, str | None]]] | None:
    """(model, [(flag, value or None for a switch)]) as the log states them; None when it does not."""
    dumps = [blob for _line, blob in facts.arg_dumps if blob.lstrip().startswith(_DICT_FORMS)]
    if dumps:
        parsed = _from_dict(dumps[-1])
        if parsed is not None:
            return parsed[0] or facts.get("model"), parsed[1]
    flags = [blob for _line, blob in facts.arg_dumps if blob.lstrip().startswith(_FLAG_FORMS)]
    if not flags:
        return None
    model, items = _from_flags(" ".join(flags))
    return model or facts.get("model"), items


def _from_dict(blob: str) -> tuple[str | None, list[tuple[str, str | None]]] | None:
    from vllm_doctor.serveargs import dump_dict

    parsed = dump_dict(blob)
    if parsed is None:
        return None
    model = next((str(parsed[k]) for k in _POSITIONAL if parsed.get(k)), None)
    items: list[tuple[str, str | None]] = []
    for key, value in parsed.items():
        if key in _POSITIONAL or value is None:
            continue
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            items.append((flag, None))
        elif value is False:
            items.append(("--no-" + flag[2:], None))
        elif isinstance(value, list | tuple) and all(isinstance(v, str | int | float) for v in value):
            items.append((flag, " ".join(shlex.quote(str(v)) for v in value) or None))
        elif isinstance(value, dict | list | tuple):
            items.append((flag, shlex.quote(json.dumps(value))))
        else:
            items.append((flag, shlex.quote(str(value))))
    return model, items


def _from_flags(text: str) -> tuple[str | None, list[tuple[str, str | None]]]:
    from vllm_doctor import serveargs

    try:
        words = shlex.split(text)
    except ValueError:  # an unclosed quote in a paste
        words = text.split()
    words = serveargs.server_words(words) or words  # from after `vllm serve`, where it was pasted whole
    positional, given = serveargs.items(words)
    model = next((v for name, v in given if name == "model" and v), None) or positional
    items = [("--" + name.replace("_", "-"), shlex.quote(v) if v else None) for name, v in given if name != "model"]
    return model, items


def _applicable(fix: FixOut) -> bool:
    flag = fix.flag or ""
    return flag.startswith("--") and (fix.value is not None or fix.direction == "enable")


def apply(items: list[tuple[str, str | None]], fix: FixOut) -> list[tuple[str, str | None]]:
    """The arguments with the fix's flag set to its value (a switch turned on), in place or appended."""
    value = shlex.quote(fix.value) if fix.value is not None else None
    flag = fix.flag or ""
    off = "--no-" + flag[2:]
    out = [(f, v) for f, v in items if f != off]
    for k, (f, _v) in enumerate(out):
        if f == flag:
            out[k] = (flag, value)
            return out
    return [*out, (flag, value)]


def corrected(facts: Facts, diagnoses: list[Diagnosis]) -> Corrected | None:
    """The serve line with the top diagnosis's first fix that names a flag and a value applied."""
    top = next((d for d in diagnoses if d.severity in ("blocker", "warning")), None)
    fix = next((f for f in top.fixes if _applicable(f)), None) if top else None
    if top is None or fix is None:
        return None
    known = arguments(facts)
    if known is None or not known[0]:
        return None
    model, items = known
    items = apply(items, fix)
    words = ["vllm", "serve", shlex.quote(str(model))]
    words += [f"{f} {v}" if v is not None else f for f, v in items]
    change = f"{fix.flag} {fix.value}" if fix.value is not None else str(fix.flag)
    return Corrected(" ".join(words), top.rule, fix.rank, change)
