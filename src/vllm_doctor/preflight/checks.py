"""The one explicit map of preflight checks: name -> (one-line description, function). The order is
the order they run and are listed; a new check is a function in its module and one line here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vllm_doctor.preflight import fit, gpunow, host, model, oracle, parallel
from vllm_doctor.preflight.context import Context
from vllm_doctor.preflight.finding import Finding

# the area a check belongs to, by the module of its function: check's text screen says a line per area
AREAS = {"oracle": "vLLM", "model": "model", "parallel": "parallel", "fit": "fit", "gpunow": "GPUs", "host": "host"}


@dataclass(frozen=True)
class Check:
    name: str
    description: str
    run: Callable[[Context], list[Finding]]

    @property
    def area(self) -> str:
        return AREAS.get(self.run.__module__.rsplit(".", 1)[-1], "other")


CHECKS = [
    Check("vllm_config", "vLLM's own parser and config check, where vLLM is installed (no weights, no device memory)", oracle.vllm_config),
    Check("model_config", "config.json reachable: local directory, HF cache or the Hub (offline-aware)", model.model_config),
    Check("hf_token", "a Hugging Face token for Hub models (gated and private repos need one)", model.token),
    Check("remote_code", "--trust-remote-code where config.json maps its own code (auto_map)", model.remote_code),
    Check("architecture", "the architecture known to the installed vLLM (its registry file, not imported)", model.architecture),
    Check("quantization", "--quantization known to vLLM, and the checkpoint's quantization_config it reads", model.quantization),
    Check("tokenizer", "tokenizer files and a chat template for /v1/chat/completions", model.tokenizer),
    Check("context_limit", "--max-model-len within config.json's maximum (VLLM_ALLOW_LONG_MAX_MODEL_LEN, rope)", fit.context_limit),
    Check("tp_shape", "TP against heads, KV heads and the padded vocabulary; PP against layers", parallel.tp_shape),
    Check("tp_devices", "TP x PP against the visible GPUs (CPU backend: NUMA nodes)", parallel.tp_devices),
    Check("tp_needed", "a TP > 1 whose weights would fit one GPU (info)", parallel.tp_needed),
    Check("fit", "weights, KV cache and one --max-model-len sequence on the GPUs (or VLLM_CPU_KVCACHE_SPACE)", fit.fit),
    Check("gpu_free", "memory other processes hold on the GPUs, named: --gpu-memory-utilization <= free/total", gpunow.gpu_free),
    Check("other_servers", "other vLLM servers' --gpu-memory-utilization on the same GPU, and the sum", gpunow.other_servers),
    Check("driver", "the driver's CUDA against the CUDA build of the installed torch (metadata only)", gpunow.driver),
    Check("capability", "compute capability against the dtype (bf16 needs 8.0) and the quantisation", gpunow.capability),
    Check("shm", "/dev/shm against what TP needs (containers default to 64 MB)", host.shm),
    Check("open_files", "the open-files limit against the 65535 vLLM raises it to", host.open_files),
    Check("disk", "free disk where the weights download (--download-dir, HF_HOME) against the checkpoint", host.disk),
    Check("port", "--host/--port free, and who holds it (/proc/net/tcp)", host.port),
    Check("host_ram", "host RAM against --swap-space, --cpu-offload-gb and the CPU backend's KV cache", host.host_ram),
]  # fmt: skip
BY_NAME = {c.name: c for c in CHECKS}


def listing() -> str:
    """`check --list`: one line per check, like brew doctor's."""
    return "\n".join(f"{c.name:14} {c.description}" for c in CHECKS)
