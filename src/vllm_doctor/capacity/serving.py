"""What `plan`'s `vllm serve` line is made of: the model's name as vLLM takes it, the KV budget
flags, the default overhead the line reserves, and the TP size that fits.

The default overhead. vLLM measures three things at startup and subtracts them before the KV
cache: the activation peak of a profiling forward pass, memory outside PyTorch (CUDA context,
NCCL buffers) and, from 0.20, the CUDA-graph pool. When --overhead is not given, the plan's
steps and serve line reserve a stated default per GPU, the one check reserves (preflight/fit.py),
so both give one verdict (--overhead 0GB: the seed's bare arithmetic):

* activation peak: 1.5 GiB up to 10B parameters, 2.5 GiB up to 40B, 4 GiB above. vLLM's own
  profile lines for 8B models on 80 GB cards say 1.41 GiB ("PyTorch activation peak memory takes
  1.41GiB", 0.6 and 0.11 logs); it grows with the hidden size and the batch the profile runs
  (max_num_batched_tokens), so larger models get more.
* non-torch memory: 0.5 GiB, plus 0.5 GiB per GPU when TP > 1 (NCCL and custom all-reduce
  buffers). vLLM's lines say 0.16-0.62 GiB on one GPU.
* CUDA graphs: 1 GiB on a card under 40 GiB, 2 GiB on a larger one. vLLM's own warning says
  "CUDA graphs can take additional 1~3 GiB memory per GPU" (vllm/worker/model_runner.py), and
  0.20+ logs put a measured 0.53 GiB for an 8B model on 80 GB.

These are estimates, labelled as such wherever the plan prints them; --overhead replaces them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from vllm_doctor.capacity.arithmetic import UNITS, Budget, fmt_size

GIB = UNITS["GIB"]
FIRST_PORT = 8000  # vllm serve's default port; co-hosted models count up from it
_HUB_CACHE_DIR = re.compile(r"models--([^/]+?)--([^/]+)$")


@dataclass
class FixedBudget(Budget):
    """A KV cache whose size is set explicitly (--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE):
    vLLM skips the utilization arithmetic and allocates this much per GPU (or per CPU worker)."""

    kv_bytes: float = 0.0
    flag: str = "--kv-cache-memory-bytes"

    @property
    def cache_bytes(self) -> float:
        return self.kv_bytes

    def work(self, unit: str) -> str:
        return f"{self.flag} (set explicitly: no utilization arithmetic); {fmt_size(self.kv_bytes, unit)}"


def kv_space(kv_cache_memory: str | None, cpu_kvcache_space: str | None) -> tuple[float, str] | None:
    """(bytes, the flag that set them) from vLLM's own KV budget flags; VLLM_CPU_KVCACHE_SPACE wins
    over --kv-cache-memory-bytes, as on vLLM's CPU backend. Raises ValueError for a bad value."""
    if cpu_kvcache_space is not None:
        text = str(cpu_kvcache_space).strip()
        if not text.isdigit() or int(text) < 1:  # vLLM parses it with int(): "0.5" fails at config time
            raise ValueError(f"VLLM_CPU_KVCACHE_SPACE {text!r}: whole GiB (vLLM reads it with int())")
        return int(text) * GIB, f"VLLM_CPU_KVCACHE_SPACE={text}"
    if kv_cache_memory is None:
        return None
    text = str(kv_cache_memory).strip()
    if text.isdigit():
        value = float(text)
    else:
        from vllm_doctor.capacity.arithmetic import parse_size

        value = parse_size(text).bytes
    if value <= 0:
        raise ValueError(f"--kv-cache-memory-bytes {text!r}: must be positive")
    return value, f"--kv-cache-memory-bytes {int(value)}"


def default_overhead(gpu_bytes: float, params: int, tp: int) -> tuple[float, str]:
    """(bytes per GPU, the work behind it): the estimate the serve line reserves (module doc)."""
    activation = 1.5 if params <= 10e9 else 2.5 if params <= 40e9 else 4.0
    non_torch = 0.5 + (0.5 if tp > 1 else 0.0)
    graphs = 1.0 if gpu_bytes < 40 * GIB else 2.0
    total = (activation + non_torch + graphs) * GIB
    work = (f"{activation:g} GiB activation peak + {non_torch:g} GiB non-torch + {graphs:g} GiB CUDA graphs "
            "(estimated defaults; --overhead replaces them)")  # fmt: skip
    return total, work


def model_ref(name: str, from_config: bool) -> str:
    """What `vllm serve` takes: the repo id or the model directory, never a config.json path. A
    config.json in the Hugging Face cache names its repo (models--org--name/snapshots/<rev>/)."""
    if not from_config:
        return name
    folder = Path(name).expanduser().parent
    for part in (folder, *folder.parents)[:3]:
        m = _HUB_CACHE_DIR.search(str(part))
        if m:
            return f"{m.group(1)}/{m.group(2)}"
    return str(folder) if str(folder) not in ("", ".") else "."


def fits(budget: Budget, length: int | None) -> bool:
    return budget.cache_bytes > 0 and (not length or budget.longest_sequence >= length)


def command(
    model: str, length: int | None, budget: Budget, utilization: float, extra: list[str], port: int | None
) -> str:
    """The `vllm serve` line: the model, its length, the KV budget flags, TP and the rest."""
    parts = ["vllm", "serve", model]
    if length:
        parts += ["--max-model-len", str(length)]
    if isinstance(budget, FixedBudget):
        if budget.flag.startswith("--"):
            parts += shlex.split(budget.flag)
        else:
            parts = [budget.flag, *parts]  # the environment variable goes before the command
    else:
        parts += ["--gpu-memory-utilization", f"{utilization:.2f}"]
    if budget.tp > 1:
        parts += ["--tensor-parallel-size", str(budget.tp)]
    parts += extra
    if port is not None:
        parts += ["--port", str(port)]
    return " ".join(shlex.quote(p) if p != "<model>" else p for p in parts)


# the variables of a start a serve line carries in front (the CPU KV space comes from plan's own flag)
START_ENV = (
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
    "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE",
    "VLLM_CPU_OMP_THREADS_BIND",
)


def allowed_length(length: int | None, shape, env: dict[str, str], notes: list[str]) -> int | None:
    """The serve line's --max-model-len, never above the model's maximum without the variable that allows it."""
    derived = shape.derived_max_model_len
    if (
        length
        and derived
        and length > derived
        and env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip() not in ("1", "true")
    ):
        notes.append(f"the serve line keeps --max-model-len at the model's maximum {derived:,}: above it vLLM refuses "
                     "the start unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")  # fmt: skip
        return derived
    return length


def cache_flags(hybrid_manager: bool, prefix_caching: bool, batched: int | None) -> list[str]:
    """The flags of the start that shape the cache, as the serve line repeats them."""
    flags = [] if hybrid_manager else ["--disable-hybrid-kv-cache-manager"]
    flags += [] if prefix_caching else ["--no-enable-prefix-caching"]
    return flags + (["--max-num-batched-tokens", str(batched)] if batched else [])


def with_env(line: str, env: dict[str, str]) -> str:
    """The serve line with the start's variables in front, as leading VAR=value words."""
    words = [f"{k}={shlex.quote(v)}" for k, v in env.items() if k in START_ENV and not line.startswith(k + "=")]
    return " ".join([*words, line])
