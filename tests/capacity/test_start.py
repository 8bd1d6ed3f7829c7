"""capacity/start.py, the one question, held to real vLLM 0.32 CPU starts: every recording of
fixtures/kv-families (the command and the environment it ran with) started or was refused as
ask() says, with its KV tokens (or the GiB needed and available) within 1%; and the lab's starts
(fixtures/lab, their commands from shared/vllm-lab/recordings/*.meta.json) refused for the reason
vLLM gave."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_kv_families import RUNS, printed

from conftest import FIXTURES
from vllm_doctor.capacity import start
from vllm_doctor.capacity.shape import shape_from_config
from vllm_doctor.preflight.args import parse


def query(shape, argv: list[str], env: dict[str, str]) -> start.StartQuery:
    a = parse(argv, env=env)
    return start.StartQuery(
        shape, "cpu", a.integer("max_model_len"), a.tp, a.pp, a.text("kv_cache_dtype"), a.text("dtype"),
        a.integer("block_size"), a.integer("max_num_batched_tokens"), a.text("enable_prefix_caching") != "false",
        not a.on("disable_hybrid_kv_cache_manager"), a.integer("kv_cache_memory_bytes"),
        a.integer("num_gpu_blocks_override"), a.text("quantization"), dict(a.env), numa_nodes=1, cpus=2,
    )  # fmt: skip


@pytest.mark.parametrize("run", RUNS, ids=[p.stem for p in RUNS])
def test_ask_says_what_vllm_did(run: Path) -> None:
    meta = json.loads(run.read_text())
    seen = printed(run.with_suffix(".log").read_text(errors="replace"))
    answer = start.ask(query(shape_from_config(meta["config"]), meta["command"][2:], meta["env"]))
    assert answer.starts == ("tokens" in seen), answer.reason
    c = answer.capacity
    assert c is not None
    ours = {"tokens": c.tokens, "concurrency": round(c.concurrency, 2), "needed_gib": c.needed_gib,
            "available_gib": c.available_gib, "estimated_max_len": c.estimated_max_len}  # fmt: skip
    for name, value in seen.items():
        assert ours[name] == pytest.approx(value, rel=0.01), f"{run.stem} {name}: vLLM {value}, asked {ours[name]}"


LAB_STARTS = [  # (config, argv, env, the refusal vLLM gave: None when it started)
    ("lab-wide-llama", ["--max-model-len", "32768"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, "cache"),
    ("lab-wide-llama", ["--max-model-len", "8192"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, "cache"),
    ("lab-wide-llama", ["--max-model-len", "8064"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, None),
    ("lab-tiny-llama", ["--max-model-len", "4096"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, "context"),
    ("lab-tiny-llama", ["--max-model-len", "4096"], {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}, None),
    ("lab-tiny-llama", ["--max-model-len", "1024", "-tp", "3"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, "tp-heads"),
    ("lab-tiny-llama-h6kv6", ["--max-model-len", "1024", "-tp", "3"], {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}, "tp-vocab"),
    ("lab-tiny-llama-h6kv4", ["--max-model-len", "1024", "-tp", "3"], {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}, "model-heads"),
    ("lab-tiny-llama-h6kv4", ["--max-model-len", "1024", "-tp", "3"], {}, "model-heads"),
    ("lab-tiny-llama", ["--max-model-len", "1024"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, None),
    # the TP 2 start a one-node host refuses without a bind string, and starts with this host's ('0|1', e2e)
    ("lab-tiny-llama", ["--max-model-len", "1024", "-tp", "2"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, "cpu-numa"),
    ("lab-tiny-llama", ["--max-model-len", "1024", "-tp", "2"], {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}, None),
    ("lab-tiny-llama", ["--max-model-len", "1024"], {"VLLM_CPU_KVCACHE_SPACE": "4.02"}, "cpu-kvcache-space"),
]  # fmt: skip


@pytest.mark.parametrize(("config", "argv", "env", "refused"), LAB_STARTS)
def test_the_lab_starts(config: str, argv: list[str], env: dict[str, str], refused: str | None) -> None:
    shape = shape_from_config(json.loads((FIXTURES / "configs" / config / "config.json").read_text()))
    answer = start.ask(query(shape, ["<model>", *argv], env))
    assert answer.starts is (refused is None), answer.reason
    if refused:
        assert answer.refusals[0][0] == refused, answer.refusals
    assert answer.fixable is (refused != "model-heads")


def test_the_longest_fit_is_capped_at_the_models_maximum() -> None:
    shape = shape_from_config(json.loads((FIXTURES / "configs" / "lab-tiny-llama" / "config.json").read_text()))
    q = query(shape, ["<model>", "--max-model-len", "1024"], {"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert start.longest(q) == shape.derived_max_model_len == 2048  # 1 GiB holds far more than 2,048 tokens


def test_the_hybrid_manager_off_for_chunked_local_attention() -> None:
    """VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0 sizes Llama-4's chunked layers as full attention."""
    run = next(r for r in RUNS if r.stem == "llama4-65536")
    meta = json.loads(run.read_text())
    shape = shape_from_config(meta["config"])
    on = start.ask(query(shape, meta["command"][2:], {}))
    off = start.ask(query(shape, meta["command"][2:], {"VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE": "0"}))
    flag = start.ask(query(shape, [*meta["command"][2:], "--disable-hybrid-kv-cache-manager"], {}))
    assert on.layout.hybrid and not off.layout.hybrid
    assert off.layout.groups == flag.layout.groups and off.tokens == flag.tokens


@pytest.mark.parametrize("run", RUNS, ids=[p.stem for p in RUNS])
def test_plan_predicts_what_vllm_did(run: Path, tmp_path: Path) -> None:
    """plan, given the recording's config and its flags (the CPU backend, --kv-cache-memory-bytes, the
    hybrid manager, batched tokens, TP), says start-or-refuse and the KV tokens vLLM printed within 1%."""
    from vllm_doctor.capacity.gpu import skipped
    from vllm_doctor.capacity.plan import PlanRequest, make_plan

    meta = json.loads(run.read_text())
    seen = printed(run.with_suffix(".log").read_text(errors="replace"))
    config = tmp_path / "config.json"
    config.write_text(json.dumps(meta["config"]))
    a = parse(meta["command"][2:], env=meta["env"])
    req = PlanRequest(
        configs=[str(config)], max_model_len=a.integer("max_model_len"), tp=a.tp, gpus=a.tp, device="cpu",
        kv_cache_dtype=a.text("kv_cache_dtype") or "auto", kv_cache_memory=a.text("kv_cache_memory_bytes"),
        hybrid_manager=not a.on("disable_hybrid_kv_cache_manager"), max_num_batched_tokens=a.integer("max_num_batched_tokens"),
        env=dict(a.env), offline=True,
    )  # fmt: skip
    mp = make_plan(req, skipped("--no-gpu")).models[0]
    assert mp.fits == ("tokens" in seen), mp.problems
    if "tokens" in seen:  # V1's figure, int(concurrency x L); a plain model's "tokens that fit" row stays the
        # seed's memory / bytes per token (test_plan.py's seed), 2.4% above it at 5,000 (off the 128-token grid)
        assert mp.budget.capacity(req.max_model_len).tokens == pytest.approx(seen["tokens"], rel=0.01)
        assert mp.budget.tokens == pytest.approx(seen["tokens"], rel=0.01 if req.max_model_len % 128 == 0 else 0.025)
    else:
        assert mp.budget.longest_sequence == pytest.approx(seen["estimated_max_len"], rel=0.01)
