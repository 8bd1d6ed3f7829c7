"""Every report's advice held to the capacity model, from the outside: over every fixture and lab log
(a lab log with its model's config), the corrected command, read back from its pasted line (its
leading VAR=value words included) as `vllm serve` would take it, must start by capacity/start.py;
no CPU-backend report offers a GPU fix; no suggested variable has a value vLLM refuses."""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path

import pytest

from conftest import FIXTURES, LAB
from vllm_doctor.capacity import start
from vllm_doctor.capacity.shape import shape_from_config
from vllm_doctor.knowledge.contract import Options
from vllm_doctor.preflight import args as serveargs
from vllm_doctor.render.json import to_dict

CONFIGS = FIXTURES / "configs"
GPU_ONLY = ("--gpu-memory-utilization",)
# the words of a fix for GPUs the CPU backend does not have ("Add GPUs", "the GPUs left over", ...)
GPU_WORDS = ("GPUs", "--gpu-memory-utilization", "--quantization fp8")


def _lab_config(log: Path) -> Path | None:
    text = log.read_text(errors="replace")
    for name in ("wide-llama", "tiny-llama-h6kv4", "tiny-llama-h6kv6", "tiny-llama-hd16", "tiny-llama"):
        if f"/models/{name}'" in text or f"/models/{name} " in text:
            return CONFIGS / f"lab-{name}" / "config.json"
    return None


def cases() -> list[tuple[Path, Path | None]]:
    out: list[tuple[Path, Path | None]] = []
    for expect in sorted((FIXTURES / "logs").rglob("*.expect.toml")):
        base = expect.name[: -len(".expect.toml")]
        log = next(p for p in expect.parent.iterdir() if p.name.startswith(base + ".") and p != expect)
        want = tomllib.loads(expect.read_text())
        out.append((log, CONFIGS / want["config"] / "config.json" if "config" in want else None))
    out += [(log, _lab_config(log)) for log in sorted(LAB.glob("*.log"))]
    return out


CASES = cases()


def pasted(line: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(line)
    env: dict[str, str] = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    assert words[:2] == ["vllm", "serve"], line
    return env, words[2:]


def asked(line: str, config: Path, cpu: bool) -> start.StartAnswer:
    env, argv = pasted(line)
    a = serveargs.parse(argv, env=env)
    shape = shape_from_config(json.loads(config.read_text()))
    q = start.StartQuery(
        shape, "cpu" if cpu else "cuda", a.integer("max_model_len"), a.tp, a.pp, a.text("kv_cache_dtype"),
        a.text("dtype"), a.integer("block_size"), a.integer("max_num_batched_tokens"),
        a.text("enable_prefix_caching") != "false", not a.on("disable_hybrid_kv_cache_manager"),
        a.integer("kv_cache_memory_bytes"), a.integer("num_gpu_blocks_override"), a.text("quantization"), env,
        numa_nodes=1, cpus=2,
    )  # fmt: skip
    return start.ask(q)


@pytest.mark.parametrize(("log", "config"), CASES, ids=[f"{c[0].parent.name}/{c[0].name}" for c in CASES])
def test_the_advice_starts(log: Path, config: Path | None, run) -> None:
    report = to_dict(run(log, options=Options(config=str(config)) if config else None))
    cpu = str(report["facts"].get("device") or "").lower() == "cpu"
    util = report["facts"].get("gpu_memory_utilization")
    refused_util = util is not None and not 0 < float(util) <= 1  # vLLM refuses it on every backend
    for d in report["diagnoses"]:
        for fix in d["fixes"]:
            if cpu and not (refused_util and fix["flag"] == "--gpu-memory-utilization"):  # its fix: a fraction
                assert fix["flag"] not in GPU_ONLY, f"a GPU fix on the CPU backend: {fix}"
                assert not any(w in fix["action"] for w in GPU_WORDS), f"a GPU fix on the CPU backend: {fix}"
                assert not (fix["flag"] == "--quantization" and "fp8" in str(fix["value"])), fix
                assert not (
                    fix["flag"] == "--tensor-parallel-size" and fix["direction"] == "raise" and not fix["value"]
                ), fix
            if fix["flag"] == "VLLM_CPU_KVCACHE_SPACE" and fix["value"] is not None:
                assert start.cpu_kvcache_space(fix["value"]), f"vLLM refuses {fix}"
    c = report["corrected_command"]
    if c is None:
        return
    env, _argv = pasted(c["line"])
    if "VLLM_CPU_KVCACHE_SPACE" in env:
        assert start.cpu_kvcache_space(env["VLLM_CPU_KVCACHE_SPACE"]), c
    assert "[REDACTED]" not in c["line"], c
    if config is not None:
        answer = asked(c["line"], config, cpu)
        assert answer.starts is not False, f"{c['line']}: {answer.reason}"


def test_the_lab_tp_divisibility_start_is_told_as_the_cpu_backend(run) -> None:
    """It fails before the engine banner (device_config=cpu): the CPU build's import line says the
    backend, and the advice is the CPU's: TP 2 or 1, no GPUs to add, no pipeline over spare GPUs."""
    log = LAB / "tp-divisibility.log"
    report = to_dict(run(log, options=Options(config=str(_lab_config(log)))))
    assert report["facts"]["device"] == "cpu"
    assert report["lifetimes"][0]["lines"]["first"] == 4  # the banner: the import line is no start
    fixes = report["diagnoses"][0]["fixes"]
    assert [(f["flag"], f["value"]) for f in fixes] == [
        ("--tensor-parallel-size", "2"),
        ("--tensor-parallel-size", "1"),
    ]
    env, _argv = pasted(report["corrected_command"]["line"])
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}  # one NUMA node or not, it starts as pasted
