"""The lab's starts replayed through `check`: their command line, environment and model config
(fixtures/preflight/*.toml, from shared/vllm-lab/recordings/*.meta.json) must predict the category
the real start ended with, before anything starts. The host is this machine's, for real: the port is
a socket the test binds, the RAM and NUMA nodes are read from /proc and /sys."""

from __future__ import annotations

import json
import shlex
import socket
import tomllib
from pathlib import Path

import pytest
from preflight_fakes import FakeNvml

from conftest import FIXTURES
from vllm_doctor.knowledge import fixcheck
from vllm_doctor.preflight.args import parse
from vllm_doctor.preflight.finding import rules
from vllm_doctor.preflight.host import NODE0
from vllm_doctor.preflight.parallel import NUMA_NODES
from vllm_doctor.preflight.run import preflight

CASES = sorted((FIXTURES / "preflight").glob("*.toml"))


def _case(path: Path) -> dict:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def _node_gib(key: str) -> float:
    for line in NODE0.read_text().splitlines():
        if f" {key}:" in line:
            return int(line.split()[3]) / 2**20
    return 0.0


def _node_free_gib() -> float:
    return _node_gib("MemFree")


def _host_allows(name: str) -> str | None:
    """Why this machine cannot reproduce the lab's host (None: it can)."""
    if name == "tp-cpu-numa-binding" and len(list(NUMA_NODES.glob("node[0-9]*"))) >= 3:
        return "this machine has 3 NUMA nodes or more: the binding would succeed here"
    if name == "startup-kvcache-space-exceeds-ram" and _node_free_gib() >= 64:
        return "this machine has 64 GiB free: the lab's 64 GiB KV cache would fit here"
    free, total = _node_gib("MemFree"), _node_gib("MemTotal")
    if name == "startup-cpu-memory-utilization" and free >= 0.92 * total:
        return "NUMA node 0 has 92% of its memory free: the default --gpu-memory-utilization fits here"
    if name == "healthy-auto-kv" and free < 0.5 * total:
        return "NUMA node 0 has less than half its memory free: --gpu-memory-utilization 0.5 fails here"
    return None


def replay(path: Path, tmp_path: Path, listener: socket.socket | None = None):
    case = _case(path)
    model = str(tmp_path / "no-such-model") if case["model"] == "missing" else str(FIXTURES / "configs" / case["model"])
    words = shlex.split(case["command"].replace("<model-dir>", model))[2:]  # drop `vllm serve`
    if listener is not None:
        words[words.index("--port") + 1] = str(listener.getsockname()[1])
    nvml = None
    if case.get("gpus"):
        gpus = case["gpus"]  # compute capability as NVML reports it (9.0 when the case does not say)
        nvml = FakeNvml([(g["name"], g["total_mib"], g["free_mib"], g["processes"], tuple(g.get("capability", (9, 0))))
                         for g in gpus])  # fmt: skip
    env = dict(case.get("env", {}))
    env.setdefault("HF_HOME", str(tmp_path / "hf"))  # an empty cache: nothing of this machine's
    return case, preflight(parse(words, env=env), nvml=nvml, backend=case["backend"], offline=True)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_the_start_is_predicted(path, tmp_path):
    why = _host_allows(path.stem)
    if why:
        pytest.skip(why)
    listener = None
    if _case(path).get("port") == "bound":
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
    try:
        case, report = replay(path, tmp_path, listener)
    finally:
        if listener is not None:
            listener.close()
    top = report.diagnoses[0] if report.diagnoses else None
    fired = [d.rule for d in report.diagnoses]
    assert set(case.get("rules", [])) <= set(fired), fired  # the preflight rules the case triggers
    for d in report.diagnoses:  # every fix held to the numbers as explain's are (knowledge/fixcheck.py)
        direction = {f.flag: f.direction for f in rules()[d.rule].fixes}
        for f in d.fixes:
            assert fixcheck.refuse(f.flag, direction.get(f.flag), f.value, d.numbers, category=d.category) is None, f
    if not case["category"]:  # the real start served: nothing blocks it
        assert report.status in (case.get("status") or ("healthy", "degraded")), report.facts["preflight"]["headline"]
        assert all(d.severity != "blocker" for d in report.diagnoses)
        return
    assert top is not None and (top.category, top.severity) == (case["category"], case["severity"]), [
        (d.category, d.severity, d.summary) for d in report.diagnoses
    ]
    if case.get("fix_value"):
        assert top.fixes[0].value == case["fix_value"]


def test_cache_oom_boundary_numbers_are_vllms(tmp_path):
    """vLLM 0.32 said: max seq len 8192 needs 1.0 GiB, the estimated maximum model length is 8064."""
    _, report = replay(FIXTURES / "preflight" / "cache-oom-boundary.toml", tmp_path)
    top = report.diagnoses[0]
    assert top.numbers["fit_max_model_len"] == 8064 and top.numbers["needed_gib"] == 1.0
    assert top.fixes[0].value == "8064"


def test_fixtures_are_the_lab_meta(shared):
    """Each lab case's command and environment are the recording's own."""
    for path in CASES:
        meta = shared / "vllm-lab" / "recordings" / f"{path.stem}.meta.json"
        if not meta.exists():
            continue  # a case from fixtures/logs, not the lab
        m, case = json.loads(meta.read_text()), _case(path)
        assert case["command"] == m["command"]
        assert case["env"] == {k: v for k, v in m["env"].items() if k != "PYTHONUNBUFFERED"}
        assert case["real"] == m["expected_category"]
        if m.get("model_config"):
            config = json.loads((FIXTURES / "configs" / case["model"] / "config.json").read_text())
            assert config == m["model_config"]
