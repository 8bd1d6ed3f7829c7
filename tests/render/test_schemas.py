"""The shipped JSON Schemas (src/vllm_doctor/schemas/) are the contract: every JSON output of
every fixture, lab recording and /metrics scrape validates against them, and they are strict
enough to catch a missing key or a wrong type."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from conftest import FIXTURES, LAB, ROOT, SCHEMAS, SHARED, VALIDATORS, conforms
from vllm_doctor.capacity import gpu
from vllm_doctor.capacity.plan import PlanRequest, make_plan
from vllm_doctor.facts import FACTS
from vllm_doctor.knowledge.checks import Options
from vllm_doctor.pipeline import from_metrics
from vllm_doctor.read.metrics import fetch
from vllm_doctor.render.json import render as to_json
from vllm_doctor.render.plan import to_dict as plan_dict

RECORDINGS = SHARED / "vllm-lab" / "recordings" if SHARED else None


def _is_log(p: Path) -> bool:
    return (
        p.is_file()
        and not p.name.endswith((".expect.toml", ".jsonl", ".meta.json", ".md"))
        and ".metrics-" not in p.name
    )


def _inputs() -> list[Path]:
    out = sorted(p for p in (FIXTURES / "logs").rglob("*") if _is_log(p))
    out += sorted(p for p in LAB.iterdir() if _is_log(p))
    if RECORDINGS is not None and RECORDINGS.is_dir():
        out += sorted(p for p in RECORDINGS.iterdir() if _is_log(p))
    return out


def _scrapes() -> list[Path]:
    dirs = [LAB] + ([RECORDINGS] if RECORDINGS is not None and RECORDINGS.is_dir() else [])
    return sorted(p for d in dirs for p in d.iterdir() if ".metrics-" in p.name)


INPUTS = _inputs()
SCRAPES = _scrapes()


def _id(p: Path) -> str:
    return p.relative_to(RECORDINGS.parent).as_posix() if RECORDINGS and p.is_relative_to(RECORDINGS) else p.name


def test_the_inputs_are_all_there():
    assert len(INPUTS) > 300 and len(SCRAPES) >= 10


@pytest.mark.parametrize("log", INPUTS, ids=_id)
def test_every_log_report_validates(log, run):
    data = conforms(to_json(run(log, options=Options(gpu=False))))
    assert data["facts"]["concurrency"].keys() >= {"kv_tokens", "max_model_len", "worst_case_sequences"}


@pytest.mark.parametrize("scrape", SCRAPES, ids=_id)
def test_every_metrics_report_validates(scrape, rules):
    data = conforms(to_json(from_metrics([fetch(str(scrape))], rules)))
    assert data["facts"]["metrics"] and data["facts"]["model_shape"] and data["facts"]["gpu"]


def test_a_scrape_series_validates(rules):
    series = [fetch(str(p)) for p in sorted(LAB.glob("queue-saturation.metrics-*.txt"))]
    conforms(to_json(from_metrics(series, rules)))


@pytest.mark.parametrize("name", ["cache-oom.log", "tp-divisibility-kv-heads.log", "queue-saturation.log"])
def test_with_the_models_config_and_a_target(name, run):
    """model_shape filled from a config.json, and the concurrency target's keys."""
    options = Options(config=str(FIXTURES / "configs/lab-wide-llama/config.json"), gpu=False, target_concurrency=8)
    data = conforms(to_json(run(LAB / name, options=options)))
    assert data["facts"]["model_shape"]["layers"] is not None


def test_a_crash_loop_and_several_inputs_validate(run, tmp_path):
    loop = tmp_path / "loop.log"  # one server's three starts in one file; a second server in another
    loop.write_bytes((LAB / "cache-oom.log").read_bytes() * 3)
    data = conforms(to_json(run(LAB / "healthy.log", loop)))
    assert data["crash_loop"]["times"] == 3 and all("path" in e for e in data["diagnoses"][0]["evidence"])
    assert [x["server"] for x in data["lifetimes"]] == ["healthy.log pid 14044"] + ["loop.log pid 15836"] * 3


def test_the_cli_json_validates_end_to_end(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_COLOR": "1"}
    for args, schema in (
        (["explain", str(LAB / "cache-oom.log"), "--no-gpu"], "report-1"),
        (["explain", "--metrics", str(LAB / "queue-saturation.metrics-5.txt")], "report-1"),
        (["plan", "--config", str(FIXTURES / "configs/lab-tiny-llama/config.json"), "--gpu-memory", "8GB"], "plan-1"),
    ):
        p = subprocess.run(
            [sys.executable, "-m", "vllm_doctor", *args, "--format", "json"], capture_output=True, env=env
        )
        assert p.returncode in (0, 1), p.stderr
        conforms(p.stdout, schema)


@pytest.mark.parametrize(
    "request_",
    [
        PlanRequest(params="7B", layers=32, kv_heads=8, head_dim=128, dtype="bfloat16", gpu_memory="80GB"),
        PlanRequest(configs=[str(FIXTURES / "configs/lab-tiny-llama/config.json")], gpu_memory="8GB", prompt_len=100, samples=2),
        PlanRequest(configs=[str(FIXTURES / f"configs/{m}/config.json") for m in ("lab-tiny-llama", "lab-wide-llama")],
                    gpu_memory="80GiB", max_model_len=4096, target_concurrency=4),
        PlanRequest(configs=[str(FIXTURES / "configs/deepseek-v3/config.json")], gpu_memory="80GB", tp=8),
    ],
)  # fmt: skip
def test_plans_validate(request_):
    conforms(plan_dict(make_plan(request_, gpu.skipped("--no-gpu"))), "plan-1")


# the schemas are strict: a missing key, a wrong type or an unknown value fails
def _report(run) -> dict:
    return json.loads(to_json(run(LAB / "cache-oom.log", options=Options(gpu=False))))


@pytest.mark.parametrize(
    ("path", "change"),
    [
        (("facts",), lambda d: d.pop("concurrency")),
        (("facts", "kv_cache"), lambda d: d.pop("tokens")),
        (("diagnoses", 0, "evidence", 0), lambda d: d.pop("truncated")),
        (("input",), lambda d: d.update(lines="5")),
        (("diagnoses", 0), lambda d: d.update(severity="fatal")),
        (("facts", "stats"), lambda d: d.update(samples=None)),
        (("facts",), lambda d: d.update(max_model_len=8192.5)),
        ((), lambda d: d.pop("lifetimes")),
    ],
)
def test_a_broken_report_fails(run, path, change):
    data = _report(run)
    VALIDATORS["report-1"].validate(data)
    broken = copy.deepcopy(data)
    node = broken
    for key in path:
        node = node[key]
    change(node)
    with pytest.raises(jsonschema.ValidationError):
        VALIDATORS["report-1"].validate(broken)


def test_every_fact_name_is_typed_in_the_schema():
    """FACTS (facts.py) and the schema's facts agree on names and types."""
    kinds = {int: "integer", float: "number", str: "string", bool: "boolean"}
    facts = json.loads((SCHEMAS / "report-1.json").read_text())["$defs"]["facts"]["properties"]
    for name, kind in FACTS.items():
        node = facts
        *parents, leaf = name.split(".")
        for p in parents:
            node = node[p]["properties"]
        types = node[leaf]["type"]
        assert kinds[kind] in (types if isinstance(types, list) else [types]), name


def test_the_schemas_ship_inside_the_package():
    names = {p.name for p in resources.files("vllm_doctor").joinpath("schemas").iterdir()}
    assert names >= {"report-1.json", "plan-1.json", "serve-report-1.json"}
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'packages = ["src/vllm_doctor"]' in pyproject  # hatch ships every file of the package


def test_the_readme_documents_every_required_key():
    """Each key the schema requires is named in the README's contract section."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## JSON report", 1)[1].split("\n## ", 1)[0]
    missing = set()

    def walk(node):
        if isinstance(node, dict):
            missing.update(k for k in node.get("required", []) if f"`{k}`" not in section and f'"{k}"' not in section)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for p in SCHEMAS.glob("*.json"):
        walk(json.loads(p.read_text()))
    assert not missing, sorted(missing)


def test_cut_evidence_is_flagged(tmp_path, run):
    message = "ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3)."
    log = tmp_path / "x.log"
    log.write_text(f"{message} {'x' * 1000}\n{message}\n")
    data = conforms(to_json(run(log, options=Options(gpu=False))))
    flags = {e["line"]: (e["truncated"], len(e["text"])) for e in data["diagnoses"][0]["evidence"]}
    assert flags == {1: (True, 400), 2: (False, len(message))}
