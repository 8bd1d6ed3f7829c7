"""The host: /dev/shm for the workers' shared memory, the open-files limit, free disk where the
weights download, the port, and host RAM against --swap-space, --cpu-offload-gb and the CPU
backend's KV cache (VLLM_CPU_KVCACHE_SPACE, or --gpu-memory-utilization of the node's memory)."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import socket
from pathlib import Path

from vllm_doctor.capacity.arithmetic import GIB, fmt_size
from vllm_doctor.preflight import procfs, tables
from vllm_doctor.preflight.context import Context
from vllm_doctor.preflight.finding import CannotRun, Finding, found

SHM = Path("/dev/shm")
# vLLM's numbers, from rules/tables/preflight.toml (each with its source there)
CONTAINER_SHM = tables.host("container_shm_mib") * 2**20
NOFILE_TARGET = tables.vllm("nofile_target")
SWAP_RAISE, SWAP_WARN = tables.vllm("swap_space_refuse"), tables.vllm("swap_space_warn")
CPU_UTILIZATION = tables.vllm("cpu_gpu_memory_utilization")
NODE0 = Path("/sys/devices/system/node/node0/meminfo")


def shm(ctx: Context) -> list[Finding]:
    """/dev/shm against what TP > 1 needs (NCCL and vLLM's message queues live there)."""
    try:
        st = os.statvfs(SHM)
    except OSError as e:
        raise CannotRun(f"{SHM}: {e.strerror}") from None
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    world = ctx.args.tp * ctx.args.pp
    numbers = {"shm_total_mib": size // 2**20, "shm_free_mib": free // 2**20, "ranks": world}
    words = {"shm": str(SHM), "shm_size": fmt_size(size, "MiB"), "shm_free_size": fmt_size(free, "MiB")}
    if world == 1:
        return [found("check-shm-one-rank", numbers, **words)]
    if size > CONTAINER_SHM:
        return []
    return [found("check-shm-container-default", numbers, **words)]


def open_files(ctx: Context) -> list[Finding]:
    """The open-files limit: vLLM raises the soft limit to 65535, which the hard limit must allow."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard >= NOFILE_TARGET:
        return []
    return [found("check-open-files-limit", {"soft": soft, "hard": hard}, target=NOFILE_TARGET)]  # late: under load


def _download_dir(ctx: Context) -> Path:
    env = ctx.args.env
    given = ctx.args.text("download_dir") or env.get("HF_HUB_CACHE")
    if given:
        return Path(given).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def disk(ctx: Context) -> list[Finding]:
    """Free disk where the weights will download, against the checkpoint's size."""
    if ctx.resolved.directory is not None and ctx.resolved.repo_id is None:
        raise CannotRun("the model is a local directory: nothing to download")
    shape, _ = ctx.loaded
    return disk_verdict(_download_dir(ctx), _checkpoint_bytes(shape))


def disk_verdict(where: Path, size: float | None) -> list[Finding]:
    """The free space of the disk holding `where` (or its nearest existing parent) against `size`."""
    probe = next((p for p in (where, *where.parents) if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free
    numbers = {"download_dir": str(where), "free_gib": round(free / GIB, 2)}
    if size is None:
        return [found("check-disk-size-unknown", numbers, free_size=fmt_size(free, "GiB"))]
    numbers["checkpoint_gib"] = round(size / GIB, 2)
    if size <= free:
        return []
    return [found("check-disk-too-small", numbers, free_size=fmt_size(free, "GiB"),
                  checkpoint_size=fmt_size(size, "GiB"), missing_size=fmt_size(size - free, "GiB"))]  # fmt: skip


def _checkpoint_bytes(shape) -> float | None:
    if shape is None or not shape.params_by_dtype or "metadata" not in (shape.params_source or ""):
        return None
    from vllm_doctor.capacity.params import weights_bytes_from_dtypes

    return weights_bytes_from_dtypes(shape.params_by_dtype)


def port(ctx: Context) -> list[Finding]:
    """The port the API server binds (--host, --port), and who holds it already."""
    number = ctx.args.integer("port", 8000) or 8000
    host = ctx.args.text("host") or ""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            s.bind((host, number))
            return []
        except OSError as e:
            if e.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise CannotRun(f"cannot test {host or '0.0.0.0'}:{number}: {e.strerror}") from None
            if e.errno == errno.EACCES:
                return [found("check-port-privileged", {"port": number})]
    owner = procfs.describe(procfs.listener(number))
    return [found("check-port-in-use", {"port": number, "host": host or "0.0.0.0"}, owner=owner, next_port=number + 1)]


def host_ram(ctx: Context) -> list[Finding]:
    """Host RAM against --swap-space x TP, --cpu-offload-gb, and the CPU backend's KV cache."""
    mem = procfs.meminfo()
    if "MemTotal" not in mem:
        raise CannotRun("/proc/meminfo is not readable")
    total, available = mem["MemTotal"], mem.get("MemAvailable", mem.get("MemFree", 0))
    out = []
    if ctx.backend == "cpu":
        out += _cpu_memory(ctx, total, available)
    swap = (ctx.args.number("swap_space", 0) or 0) * GIB * ctx.args.tp
    offload = (ctx.args.number("cpu_offload_gb", 0) or 0) * 1e9 * ctx.args.tp
    numbers = {"ram_total_gib": round(total / GIB, 2), "ram_available_gib": round(available / GIB, 2)}
    sizes = {"swap_size": fmt_size(swap, "GiB"), "total_size": fmt_size(total, "GiB"), "refuse_pct": SWAP_RAISE * 100,
             "warn_pct": SWAP_WARN * 100,
             "offload_size": fmt_size(offload, "GiB"), "available_size": fmt_size(available, "GiB")}  # fmt: skip
    if swap > SWAP_RAISE * total:
        out.append(found("check-swap-space-too-large", numbers, **sizes))
    elif swap > SWAP_WARN * total:
        out.append(found("check-swap-space-large", numbers, **sizes))
    if offload and offload + swap > available:
        out.append(found("check-cpu-offload-exceeds-ram", numbers, **sizes))
    return out


def _node0(total: int, available: int) -> tuple[int, int, str]:
    """NUMA node 0's memory (the CPU worker's), else the host's."""
    try:
        lines = NODE0.read_text().splitlines()
    except OSError:
        return total, available, "the host (no NUMA node 0 listed)"
    vals = {ln.split()[2].rstrip(":"): int(ln.split()[3]) * 1024 for ln in lines if len(ln.split()) >= 4}
    return vals.get("MemTotal", total), vals.get("MemFree", available), "NUMA node 0"


def _cpu_memory(ctx: Context, total: int, available: int) -> list[Finding]:
    node_total, node_free, where = _node0(total, available)
    space = ctx.args.env_number("VLLM_CPU_KVCACHE_SPACE")
    numbers = {"node_total_gib": round(node_total / GIB, 2), "node_free_gib": round(node_free / GIB, 2)}
    words = {
        "where": where,
        "node_free_size": fmt_size(node_free, "GiB"),
        "node_total_size": fmt_size(node_total, "GiB"),
    }
    if space and space > 0:
        if space * GIB <= node_free:
            return []
        return [found("check-cpu-kvcache-exceeds-ram", {**numbers, "kv_cache_gib": space}, **words,
                      kvcache_space_max=int(node_free // GIB))]  # fmt: skip
    util = ctx.args.number("gpu_memory_utilization", CPU_UTILIZATION) or CPU_UTILIZATION
    if node_free >= util * node_total:
        return []
    return [found("check-cpu-memory-utilization", {**numbers, "gpu_memory_utilization": util}, **words,
                  reserved_size=fmt_size(util * node_total, "GiB"), max_utilization=int(node_free / node_total * 100) / 100)]  # fmt: skip
