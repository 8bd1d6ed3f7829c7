"""The corrected command: the log's `vllm serve` line with the top diagnosis's first fix applied.

Rebuilt from what the log states of the server's arguments: vLLM's own `non-default args: {...}`
(0.9+, whole: what it leaves out is at its default) or, failing that, the command line pasted
above the log (its backslash-continued lines too). A Namespace(...) dump or an engine config
line lists every argument, defaults included, so no command is rebuilt from those.

It runs as pasted: leading VAR=value words carry the environment the start needs (the CPU
backend's KV space the log shows, the fix's own variable, a bind string for CPU ranks), and a
secret's value is a variable reference (`--api-key "$VLLM_API_KEY"`), never the value or a mask.
With the model's config, the command with the fix applied is asked again (capacity/start.py): one
that still does not start is not offered.
"""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING

from vllm_doctor.data import Corrected, Diagnosis, FixOut
from vllm_doctor.facts import Facts

if TYPE_CHECKING:
    from vllm_doctor.capacity.shape import ModelShape

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


_SECRET_ENDS = ("key", "token", "secret", "password")
_SECRET_VARS = {"--api-key": "VLLM_API_KEY", "--hf-token": "HF_TOKEN"}  # the variables vLLM / the Hub read


def _applicable(fix: FixOut) -> bool:
    from vllm_doctor.knowledge.startask import START_ENV

    flag = fix.flag or ""
    if flag in START_ENV:
        return bool(fix.value)
    return flag.startswith("--") and (fix.value is not None or fix.direction == "enable")


def _secret(flag: str, value: str | None) -> str | None:
    """A secret flag's value as a reference to the variable that holds it."""
    if value is None or flag.rsplit("-", 1)[-1].lower() not in _SECRET_ENDS:
        return value
    name = _SECRET_VARS.get(flag) or flag.lstrip("-").replace("-", "_").upper()
    return f'"${name}"'


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


def corrected(facts: Facts, diagnoses: list[Diagnosis], shape: ModelShape | None = None) -> Corrected | None:
    """The serve line with the top diagnosis's first fix that names a flag (or a variable of the
    start) and a value applied, its environment in front."""
    from vllm_doctor.knowledge import startask

    top = next((d for d in diagnoses if d.severity in ("blocker", "warning")), None)
    fix = next((f for f in top.fixes if _applicable(f)), None) if top else None
    if top is None or fix is None:
        return None
    known = arguments(facts)
    if known is None or not known[0]:
        return None
    model, items = known
    flag = str(fix.flag)
    if flag.startswith("--"):
        items = apply(items, fix)
    get = _getter(facts, items)
    world = (startask.as_int(get("tensor_parallel_size")) or 1) * (startask.as_int(get("pipeline_parallel_size")) or 1)
    env = startask.fix_env(get, startask.log_env(get), flag, fix.value, world)
    if shape is not None and _refused(get, shape, env):
        return None
    words = [f"{k}={shlex.quote(v)}" for k, v in env.items()] + ["vllm", "serve", shlex.quote(str(model))]
    words += [f"{f} {_secret(f, v)}" if v is not None else f for f, v in items]
    change = f"{flag} {fix.value}" if fix.value is not None else flag
    if flag in startask.START_ENV:
        change = f"{flag}={fix.value}"
    note = startask.bind_note(get, env, world) if flag != startask.BIND else None
    return Corrected(" ".join(words), top.rule, fix.rank, f"{change}; {note}" if note else change)


def _getter(facts: Facts, items: list[tuple[str, str | None]]):
    """The facts, with the corrected command's own flags over them."""
    given = {f[2:].replace("-", "_"): (shlex.split(v)[0] if v else True) for f, v in items if f.startswith("--")}

    def get(*names: str):
        for n in names:
            value = given.get(n) if n in given else facts.get(n)
            if value is not None:
                return value
        return None

    return get


def _refused(get, shape: ModelShape, env: dict[str, str]) -> bool:
    """Whether the capacity model says the corrected command still does not start."""
    from dataclasses import replace

    from vllm_doctor.capacity.start import ask
    from vllm_doctor.knowledge.startask import query

    q = query(get, shape)
    return q is not None and ask(replace(q, env={**q.env, **env})).starts is False
