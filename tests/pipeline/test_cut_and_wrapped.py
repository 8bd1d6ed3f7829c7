"""Messages cut short (an excerpt, a terminal's scrollback) or hard-wrapped at any column keep
their category: each rule has fallbacks for what survives and anchors spread over the message."""

from __future__ import annotations

import pytest

from vllm_doctor.knowledge.checks import Options

HEAD = "INFO 05-01 12:00:00 [api_server.py:1043] vLLM API server version 0.9.2\n"
# (category, the line, how much of the message must survive for it to be recognisable)
MESSAGES = [
    ("cache-oom", "ERROR 05-01 12:00:40 [core.py:396] ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (9.87 GiB). Based on the available memory, the estimated maximum model length is 80864. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.", 50),
    ("cache-oom", "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored in KV cache (18432). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.", 55),
    ("cache-oom", "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.", 34),
    ("cache-oom", "ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token. Try increasing `gpu_memory_utilization`.", 30),
    ("tp-divisibility", "ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).", 48),
    ("tp-divisibility", "ValueError: World size (8) is larger than the number of available GPUs (4) in this node. If this is intentional and you are using:", 40),
    ("gpu-memory-occupied", "ValueError: Free memory on device (37.5/79.19 GiB) on startup is less than desired GPU memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.", 65),
    ("context-exceeds-max", "ValueError: User-specified max_model_len (131072) is greater than the derived max_model_len (max_position_embeddings=32768 or model_max_length=None in model's config.json). To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.", 62),
    ("context-exceeds-max", "ValueError: max_num_batched_tokens (2048) is smaller than max_model_len (32768). This effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences.", 55),
    ("warmup-oom", "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.", 52),
]  # fmt: skip


def category(run, tmp_path, text: str) -> str:
    log = tmp_path / "x.log"
    log.write_text(HEAD + text + "\n")
    report = run(log, options=Options(offline=True))
    top = next((d for d in report.diagnoses if d.severity != "info"), None)
    return top.category if top else "healthy"


@pytest.mark.parametrize(
    ("want", "line", "survives"), MESSAGES, ids=[m[1][m[1].index(": ") + 2 :][:30] for m in MESSAGES]
)
def test_cut_anywhere_after_its_head_and_wrapped_at_any_column(run, tmp_path, want, line, survives):
    start = line.index(": ") + 2
    lost = [
        keep for keep in range(survives, len(line) - start, 5) if category(run, tmp_path, line[: start + keep]) != want
    ]
    assert not lost, f"cut after {lost} characters"
    wraps = [
        w
        for w in range(41, 170, 8)
        if category(run, tmp_path, "\n".join(line[i : i + w] for i in range(0, len(line), w))) != want
    ]
    assert not wraps, f"wrapped at {wraps} columns"
