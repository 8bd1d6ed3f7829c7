"""A value the log holds fills the fix (issue 40): no shown summary, fix action or fix why keeps a
`<placeholder>` while the report's facts hold the value it stands for.

Every fixture log and lab recording is explained in-process; a rule whose text says `lsof -i :<port>`
or `huggingface-cli download <repo>` must render `{port}` / `{model}` when the log said them, and keep
the placeholder only as the fallback variant for a log that did not.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import FIXTURES, LAB


# a placeholder's name -> the fact (dotted, as in the report's facts) that holds its value, and which
# of its values stand for it: the model is a repo only as `org/name`, a directory only as a path
def _repo(model: str) -> bool:
    return re.fullmatch(r"[\w.\-]+/[\w.\-]+", model) is not None and not model.endswith(".gguf")


def _path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~"))


PLACEHOLDER_FACTS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "port": ("port", lambda v: True),
    "model": ("model", lambda v: True),
    "repo": ("model", _repo),
    "dir": ("model", _path),
    "path": ("model", _path),
    "version": ("vllm_version", lambda v: True),
}
_PLACEHOLDER = re.compile(r"<([a-z][a-z_\-]*)>")


def _inputs() -> list[Path]:
    """Every fixture's input (the one file beside its .expect.toml: .log, .log.gz, .txt, .json) and every lab log."""
    logs = []
    for expect in sorted((FIXTURES / "logs").rglob("*.expect.toml")):
        base = expect.name.removesuffix(".expect.toml")
        logs += [p for p in sorted(expect.parent.glob(base + ".*")) if p != expect]
    return logs + sorted(LAB.glob("*.log"))


INPUTS = _inputs()


def _fact(facts: dict[str, Any], dotted: str) -> Any:
    node: Any = facts
    for key in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def unfilled(report) -> list[str]:
    """`rule: <name> in <where> (fact = value)` for every placeholder a fact could have filled."""
    out = []
    for d in report.diagnoses:
        texts = [("summary", d.summary)]
        for f in d.fixes:
            texts += [(f"fix {f.rank} action", f.action), (f"fix {f.rank} why", f.why)]
        for where, text in texts:
            for name in _PLACEHOLDER.findall(text or ""):
                fact, stands = PLACEHOLDER_FACTS.get(name, ("", bool))
                value = _fact(report.facts, fact) if fact else None
                if value is not None and stands(value):
                    out.append(f"{d.rule}: <{name}> in {where} ({fact} = {value!r}): {text}")
    return out


def test_the_inputs_are_found():
    assert len(INPUTS) > 50 and any(p.parent == LAB for p in INPUTS)


@pytest.mark.parametrize("log", INPUTS, ids=[f"{p.parent.name}/{p.name}" for p in INPUTS])
def test_no_placeholder_a_fact_could_fill(log: Path, run):
    found = unfilled(run(log))
    assert not found, "\n".join(found)


def test_a_placeholder_without_its_fact_is_kept(run):
    """The fallback still reads: a fact the log lacks leaves the placeholder, and the test lets it."""
    from vllm_doctor.data import Diagnosis, FixOut

    fix = FixOut(1, "lsof -i :<port>", None, None, "why", None)
    d = Diagnosis(rule="r", category="c", severity="blocker", confidence="high", title="t", summary="s",
                  explanation="", evidence=[], numbers={}, fixes=[fix], dropped=[], priority=1)  # fmt: skip

    class _R:
        diagnoses = [d]
        facts: dict[str, Any] = {"port": None}

    assert unfilled(_R()) == []
    _R.facts = {"port": 8125}
    assert unfilled(_R()) == ["r: <port> in fix 1 action (port = 8125): lsof -i :<port>"]
