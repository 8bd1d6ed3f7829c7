"""Weights exactly (capacity/weights.py): real safetensors files written here (an 8-byte header
length, the JSON header, zeroed data), read by their headers only, in a local directory and in the
Hugging Face cache layout; bytes as vLLM loads them per quantisation; no network."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from test_hub import _doctor, _env, build_hub_cache

from conftest import FIXTURES
from vllm_doctor.capacity import modelcfg, weights
from vllm_doctor.capacity.plan import PlanRequest, make_plan

CONFIGS = FIXTURES / "configs"
SIZE = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "U8": 1, "F8_E4M3": 1}
H, INTER, VOCAB, LAYERS = 256, 512, 313, 2  # lab-tiny-llama


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> int:
    """A valid safetensors file; returns its data bytes."""
    header, offset = {}, 0
    for name, (dtype, dims) in tensors.items():
        n = 1
        for d in dims:
            n *= d
        header[name] = {"dtype": dtype, "shape": dims, "data_offsets": [offset, offset + n * SIZE[dtype]]}
        offset += n * SIZE[dtype]
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)
    return offset


def config(tmp: Path, **extra) -> Path:
    cfg = json.loads((CONFIGS / "lab-tiny-llama" / "config.json").read_text())
    cfg.update(extra)
    path = tmp / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def dense(dtype: str) -> dict[str, tuple[str, list[int]]]:
    out = {"model.embed_tokens.weight": (dtype, [VOCAB, H]), "lm_head.weight": (dtype, [VOCAB, H]),
           "model.norm.weight": (dtype, [H])}  # fmt: skip
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": (dtype, [H, H]), p + "mlp.down_proj.weight": (dtype, [H, INTER]),
                p + "input_layernorm.weight": (dtype, [H])}  # fmt: skip
    return out


def awq() -> dict[str, tuple[str, list[int]]]:
    out = {"model.embed_tokens.weight": ("F16", [VOCAB, H]), "lm_head.weight": ("F16", [VOCAB, H])}
    for i in range(LAYERS):
        p = f"model.layers.{i}.mlp.down_proj."
        out |= {p + "qweight": ("I32", [INTER, H // 8]), p + "qzeros": ("I32", [INTER // 128, H // 8]),
                p + "scales": ("F16", [INTER // 128, H])}  # fmt: skip
    return out


def test_awq_in_the_hf_cache_layout_counts_scales_and_zeros_as_stored(tmp_path):
    """Sharded, with model.safetensors.index.json; a stray consolidated file beside it is not the model."""
    repo = build_hub_cache(tmp_path / "hub", "org/tiny-awq",
                           config(tmp_path, dtype="float16", quantization_config={"quant_method": "awq", "bits": 4,
                                                                                   "group_size": 128}))  # fmt: skip
    snap = next((repo / "snapshots").iterdir())
    tensors = awq()
    names = sorted(tensors)
    first, second = dict((n, tensors[n]) for n in names[:3]), dict((n, tensors[n]) for n in names[3:])
    stored = write_safetensors(snap / "model-00001-of-00002.safetensors", first)
    stored += write_safetensors(snap / "model-00002-of-00002.safetensors", second)
    write_safetensors(snap / "consolidated.safetensors", dense("BF16"))  # a second copy some repos ship
    index = {"weight_map": {n: "model-00001-of-00002.safetensors" for n in first}
             | {n: "model-00002-of-00002.safetensors" for n in second}}  # fmt: skip
    (snap / "model.safetensors.index.json").write_text(json.dumps(index))
    env = _env(HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    r = _doctor("plan", "org/tiny-awq", "--gpu-memory", "80GB", "--no-gpu", "-f", "json", env=env)
    m = json.loads(r.stdout)["models"][0]
    assert m["weights_bytes"] == stored  # exactly the stored bytes: qweight, qzeros and scales as they are
    assert m["model"]["params"] == 2 * VOCAB * H + LAYERS * INTER * H  # 8 weights per int32 of qweight
    assert m["model"]["params_source"] == "safetensors (local files)"
    assert "safetensors headers" in m["steps"][0]["work"]


def test_mxfp4_experts_as_stored_and_the_rest_at_bf16(tmp_path):
    experts = {}
    for i in range(LAYERS):
        p = f"model.layers.{i}.mlp.experts."
        experts |= {p + "gate_up_proj_blocks": ("U8", [4, 2 * INTER, H // 32, 16]),
                    p + "gate_up_proj_scales": ("U8", [4, 2 * INTER, H // 32]),
                    p + "gate_up_proj_bias": ("BF16", [4, 2 * INTER]),
                    f"model.layers.{i}.mlp.router.weight": ("BF16", [4, H])}  # fmt: skip
    tensors = dense("BF16") | experts
    stored = write_safetensors(tmp_path / "model.safetensors", tensors)
    config(tmp_path, quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                                          "model.embed_tokens", "lm_head"]})  # fmt: skip
    shape, _ = modelcfg.load(str(tmp_path))
    total, work = weights.loaded_bytes(shape.tally, "bfloat16")
    assert total == stored
    blocks = LAYERS * 4 * 2 * INTER * H // 32 * 16
    assert shape.params == sum(_n(d) for n, (_t, d) in tensors.items() if "_scales" not in n) + blocks  # 2 per byte


def _n(dims):
    out = 1
    for d in dims:
        out *= d
    return out


def test_fp8_checkpoint_keeps_its_scales_in_float32(tmp_path):
    tensors = {n: ("F8_E4M3" if "proj" in n else "BF16", d) for n, (_t, d) in dense("BF16").items()}
    tensors |= {f"model.layers.{i}.self_attn.q_proj.weight_scale_inv": ("F32", [2, 2]) for i in range(LAYERS)}
    stored = write_safetensors(tmp_path / "model.safetensors", tensors)
    config(tmp_path, quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})
    shape, _ = modelcfg.load(str(tmp_path))
    assert weights.loaded_bytes(shape.tally, "bfloat16")[0] == stored
    assert shape.params == sum(_n(d) for n, (_t, d) in tensors.items() if "scale" not in n)


def test_float32_checkpoint_is_cast_and_online_fp8_quantises_the_linear_layers(tmp_path):
    tensors = dense("F32")
    stored = write_safetensors(tmp_path / "model.safetensors", tensors)
    config(tmp_path)
    shape, _ = modelcfg.load(str(tmp_path))
    assert weights.loaded_bytes(shape.tally, "bfloat16")[0] == stored / 2
    linear = LAYERS * (H * H + H * INTER)
    online = weights.loaded_bytes(shape.tally, "bfloat16", "fp8")[0]
    assert online == (shape.params - linear) * 2 + linear * 1  # embeddings, lm_head and norms stay bf16
    plan = make_plan(PlanRequest(models=[str(tmp_path)], gpu_memory="80GB", quantization="fp8", max_model_len=1024))
    assert plan.models[0].budget.weights_bytes == online


def test_float32_checkpoint_auto_is_served_in_bfloat16_and_an_explicit_float32_in_float32(tmp_path):
    """vLLM casts a float32 checkpoint to 16 bits only for --dtype auto; --dtype float32 keeps 4 B,
    in the weights and in an auto KV cache alike."""
    stored = write_safetensors(tmp_path / "model.safetensors", dense("F32"))
    config(tmp_path, torch_dtype="float32")
    auto = make_plan(PlanRequest(models=[str(tmp_path)], gpu_memory="80GB", max_model_len=1024)).models[0]
    asked = make_plan(PlanRequest(models=[str(tmp_path)], gpu_memory="80GB", max_model_len=1024, dtype="float32"))
    f32 = asked.models[0]
    assert (auto.dtype, auto.element_bytes, auto.budget.weights_bytes) == ("bfloat16", 2.0, stored / 2)
    assert (f32.dtype, f32.element_bytes, f32.budget.weights_bytes) == ("float32", 4.0, stored)


def test_without_headers_the_estimate_says_so(tmp_path):
    config(tmp_path, quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128})
    shape, _ = modelcfg.load(str(tmp_path))
    assert shape.tally is None and shape.params_source == "estimated from the shape"
    total, work = weights.estimated_bytes(shape, "float16", None, 4.0)
    embed = 2 * VOCAB * H
    assert total == pytest.approx((shape.params - embed) * (0.5 + (2 + 0.5) / 128) + embed * 2)
    assert "estimated from the shape" in work


# --- explain's cache-oom fit (knowledge/sizing.weights_per_gpu): a log without vLLM's "Model loading
# --- took" line sizes TP with the headers of the model in the HF cache, else says the weights are estimated
QWEN_H, QWEN_INTER, QWEN_VOCAB, QWEN_LAYERS, QWEN_KV = 3584, 18944, 152064, 28, 512  # Qwen2.5-7B's tensors


def qwen_float32() -> dict[str, tuple[str, list[int]]]:
    """Qwen2.5-7B's tensors (with the q/k/v biases the shape's estimate leaves out), stored in F32."""
    h, i = QWEN_H, QWEN_INTER
    out = {"model.embed_tokens.weight": ("F32", [QWEN_VOCAB, h]), "lm_head.weight": ("F32", [QWEN_VOCAB, h]),
           "model.norm.weight": ("F32", [h])}  # fmt: skip
    for n in range(QWEN_LAYERS):
        p = f"model.layers.{n}."
        out |= {p + "self_attn.q_proj.weight": ("F32", [h, h]), p + "self_attn.q_proj.bias": ("F32", [h]),
                p + "self_attn.k_proj.weight": ("F32", [QWEN_KV, h]), p + "self_attn.k_proj.bias": ("F32", [QWEN_KV]),
                p + "self_attn.v_proj.weight": ("F32", [QWEN_KV, h]), p + "self_attn.v_proj.bias": ("F32", [QWEN_KV]),
                p + "self_attn.o_proj.weight": ("F32", [h, h]), p + "mlp.gate_proj.weight": ("F32", [i, h]),
                p + "mlp.up_proj.weight": ("F32", [i, h]), p + "mlp.down_proj.weight": ("F32", [h, i]),
                p + "input_layernorm.weight": ("F32", [h]), p + "post_attention_layernorm.weight": ("F32", [h])}  # fmt: skip
    return out


def write_sparse_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> int:
    """A valid safetensors file at full size whose data is a hole (7B of zeros take no disk)."""
    header, offset = {}, 0
    for name, (dtype, dims) in tensors.items():
        n = _n(dims) * SIZE[dtype]
        header[name] = {"dtype": dtype, "shape": dims, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(blob)) + blob)
        fh.truncate(8 + len(blob) + offset)
    return offset


def _oom_log(tmp: Path, loading_line: bool) -> Path:
    log = FIXTURES / "logs" / "cache-oom" / "0.8.3_v1-kv-cache-needed-gib.log"
    lines = [ln for ln in log.read_text().splitlines(keepends=True) if loading_line or "Model loading took" not in ln]
    out = tmp / f"oom-{loading_line}.log"
    out.write_text("".join(lines))
    return out


def _top(tmp: Path, env: dict[str, str], loading_line: bool = False) -> dict:
    r = _doctor("explain", str(_oom_log(tmp, loading_line)), "--no-gpu", "-f", "json", env=env)
    return json.loads(r.stdout)["diagnoses"][0]


def test_explain_sizes_tp_with_the_headers_of_the_cached_model_when_the_log_does_not_say(tmp_path):
    repo = build_hub_cache(tmp_path / "hub", "Qwen/Qwen2.5-7B-Instruct-1M", CONFIGS / "qwen2.5-7b" / "config.json")
    env = _env(HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    estimated = _top(tmp_path, env)  # config.json alone: the shape's estimate, said so
    assert "weights_per_gpu_gib" not in estimated["numbers"]
    assert estimated["numbers"]["weights_estimated_gib"] == 14.18  # 7.61B params x 2 B
    tp_why = next(f["why"] for f in estimated["fixes"] if f["flag"] == "--tensor-parallel-size")
    assert "estimated from the shape: no safetensors headers" in tp_why

    stored = write_sparse_safetensors(next((repo / "snapshots").iterdir()) / "model.safetensors", qwen_float32())
    exact = _top(tmp_path, env)  # the headers: every tensor cast to the log's dtype=torch.bfloat16
    assert "weights_estimated_gib" not in exact["numbers"]
    assert exact["numbers"]["weights_per_gpu_gib"] == round(stored / 2 / 2**30, 2) == 14.19  # the biases counted
    tp_why = next(f["why"] for f in exact["fixes"] if f["flag"] == "--tensor-parallel-size")
    assert "weights 14.19 GiB per GPU from the safetensors headers" in tp_why

    logged = _top(tmp_path, env, loading_line=True)  # vLLM's own "Model loading took 14.2512 GiB" first
    assert not {"weights_per_gpu_gib", "weights_estimated_gib"} & logged["numbers"].keys()
    tp_why = next(f["why"] for f in logged["fixes"] if f["flag"] == "--tensor-parallel-size")
    assert tp_why.endswith("(57,344 B per token from config.json).")  # no figure of ours beside vLLM's


def test_weights_per_gpu_follows_the_logs_dtype_quantization_and_tp(tmp_path):
    from vllm_doctor.capacity.weights import FROM_HEADERS
    from vllm_doctor.facts import Facts
    from vllm_doctor.knowledge.contract import CheckInput
    from vllm_doctor.knowledge.sizing import weights_per_gpu

    write_safetensors(tmp_path / "model.safetensors", dense("F32"))
    config(tmp_path)
    shape, _ = modelcfg.load(str(tmp_path))

    def per_gpu(values, tp):
        return weights_per_gpu(CheckInput(values, Facts(), None), shape, tp)

    linear = LAYERS * (H * H + H * INTER)
    assert per_gpu({"dtype": "torch.bfloat16", "quantization": "None"}, 2) == (shape.params * 2 / 2, FROM_HEADERS)
    online = per_gpu({"dtype": "torch.bfloat16", "quantization": "fp8"}, 1)
    assert online == ((shape.params - linear) * 2 + linear, FROM_HEADERS)  # fp8 online, as loaded_bytes
    _estimate, why = per_gpu({"dtype": "torch.bfloat16", "quantization": "bitsandbytes"}, 1)
    assert why.startswith("estimated from the shape: --quantization bitsandbytes")  # not the headers at bf16
    assert per_gpu({"weights_gib": 3.5}, 4) == (3.5 * 2**30, None)  # vLLM's own figure, as it is
