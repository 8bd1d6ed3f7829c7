"""The GPUs as they are now: memory other processes hold (named: another vLLM, its leftover
EngineCore), the fractions other vLLM servers on the same GPU asked for, the driver against the
CUDA runtime the installed torch was built for, and compute capability against dtype and
quantisation."""

from __future__ import annotations

import re

from vllm_doctor.capacity import colocated, defaults
from vllm_doctor.capacity.gpu import GpuDevice, GpuProcess, headroom
from vllm_doctor.preflight import tables
from vllm_doctor.preflight.context import Context
from vllm_doctor.preflight.finding import CannotRun, Finding, found
from vllm_doctor.versions import version_tuple


def _who(p: GpuProcess) -> str:
    """A process on the GPU, named: a vLLM server, its EngineCore (or one left over), a worker."""
    text = " ".join(colocated.cmdline(p.pid) or [])
    name = p.name
    if "EngineCore" in name or "EngineCore" in text:
        orphan = colocated.parent(p.pid) == 1
        name = "a vLLM EngineCore" + (" left over from a server that is gone (its parent is init)" if orphan else "")
    elif p.server_pid == p.pid:
        name = "a vLLM server"
    if ("EngineCore" in name or "Worker" in text) and p.server_pid not in (None, p.pid):
        name += f" of the server pid {p.server_pid}"
    used = "?" if p.used_mib is None else f"{p.used_mib:,}"
    return f"pid {p.pid} {name} ({used} MiB)"


def gpu_free(ctx: Context) -> list[Finding]:
    """Memory other processes hold: --gpu-memory-utilization must be at most free/total on each GPU."""
    util = ctx.utilization
    out = []
    for d in ctx.used():
        if d.free_mib >= d.total_mib * util:
            continue
        procs = ", ".join(_who(p) for p in d.processes) or "no process NVML can name (another container?)"
        out.append(found("check-gpu-memory-held", {"gpu": d.index, "free_mib": d.free_mib, "total_mib": d.total_mib,
                                                   "gpu_memory_utilization": util, "max_utilization": headroom(d)},
                         gpu_name=d.name, free_fraction=d.free_mib / d.total_mib, holders=procs))  # fmt: skip
    return out


def other_servers(ctx: Context) -> list[Finding]:
    """The fractions other vLLM servers on the same GPU asked for, and the sum with this one."""
    util = ctx.utilization
    out = []
    for d in ctx.used():
        theirs = _servers(d)
        if not theirs:
            continue
        total = util + sum(f for _, f in theirs)
        listed = ", ".join(f"pid {pid} at {f:.2f}" for pid, f in theirs)
        numbers = {"gpu": d.index, "others": round(total - util, 2), "this": util, "sum": round(total, 2)}
        if colocated.oversubscribed([util, *(f for _, f in theirs)]):
            room = max(0.0, round(1.0 - (total - util) - 0.02, 2))
            out.append(found("check-gpu-servers-oversubscribed", numbers, listed=listed, room=room))
        else:
            out.append(found("check-gpu-shared-by-servers", numbers, listed=listed))
    return out


def _servers(d: GpuDevice) -> list[tuple[int, float]]:
    """(server pid, its --gpu-memory-utilization) for each vLLM server holding memory on the GPU, once
    each: the memory is held by its EngineCore or workers, whose server the snapshot names
    (capacity/colocated.py: the nearest ancestor whose command line is `vllm serve ...`)."""
    seen = {p.server_pid: p.server_utilization for p in d.processes if p.server_pid is not None}
    return sorted((pid, util if util is not None else defaults.utilization(None)) for pid, util in seen.items())


def _cuda_of_torch(version: str) -> tuple[int, int] | None:
    m = re.search(r"\+cu(\d+)(\d)$", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def driver(ctx: Context) -> list[Finding]:
    """The driver's CUDA version against the CUDA runtime the installed torch was built for."""
    ctx.gpus()
    if ctx.torch_version is None:
        raise CannotRun("torch is not installed in this environment (its metadata is not found)")
    if not ctx.snapshot.cuda_version:
        raise CannotRun("NVML does not say which CUDA version the driver supports")
    return driver_verdict(ctx.torch_version, ctx.snapshot.cuda_version, ctx.snapshot.driver_version)


def driver_verdict(torch: str, have: str, driver_version: str | None) -> list[Finding]:
    built = _cuda_of_torch(torch)
    if built is None:
        raise CannotRun(f"torch {torch} does not name its CUDA build (+cuXYZ)")
    major, minor = (int(x) for x in have.split(".")[:2])
    numbers = {"torch": torch, "torch_cuda": f"{built[0]}.{built[1]}", "driver": driver_version, "driver_cuda": have}
    if built[0] > major:
        return [found("check-driver-too-old", numbers)]
    if built > (major, minor):
        return [found("check-driver-older-than-torch", numbers)]
    return []


def capability(ctx: Context) -> list[Finding]:
    """Compute capability against the dtype (bf16 needs 8.0) and the quantisation method."""
    used = ctx.used()
    caps = ctx.capabilities
    if not caps:
        raise CannotRun("NVML does not report the compute capability here")
    shape, _ = ctx.loaded
    low = min((caps[d.index], d) for d in used if d.index in caps)
    (major, minor), d = low
    cc = major * 10 + minor
    out = []
    dtype = (ctx.args.text("dtype") or "auto").lower()
    wants_bf16 = dtype in ("bfloat16", "bf16") or (dtype == "auto" and shape is not None and shape.dtype == "bfloat16")
    where = {"gpu": d.index, "gpu_name": d.name}
    need = tables.dtype_min_capability("bfloat16")
    if wants_bf16 and need and cc < need:
        since = version_tuple(tables.dtype_auto_fallback_since())
        explicit = dtype != "auto" or version_tuple(ctx.vllm_version, unknown=(99,)) < since  # before: no fallback
        out.append(found("check-bfloat16-unsupported" if explicit else "check-bfloat16-falls-back",
                         {"compute_capability": f"{major}.{minor}"}, **where, min_capability=need))  # fmt: skip
    method = (ctx.args.text("quantization") or (shape.quant_method if shape else None) or "").lower()
    need = tables.min_capability(method)
    if need and cc < need:
        out.append(found("check-quantization-capability", {"min_capability": need, "capability": cc}, **where,
                         method=method))  # fmt: skip
    return out
