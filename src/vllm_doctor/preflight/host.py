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
from vllm_doctor.preflight import procfs
from vllm_doctor.preflight.context import Context
from vllm_doctor.preflight.finding import CannotRun, Finding, Fix, blocker, info, warning

SHM = Path("/dev/shm")
CONTAINER_SHM = 64 * 2**20  # Docker's and containerd's default --shm-size
NOFILE_TARGET = 65535  # vLLM's set_ulimit() raises the soft limit to this, within the hard limit
SWAP_RAISE, SWAP_WARN = 0.7, 0.4  # CacheConfig: swap x TP above these fractions of RAM raises / warns
CPU_UTILIZATION = 0.92  # --gpu-memory-utilization's default on the CPU backend (vLLM 0.32)
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
    text = f"{SHM} is {fmt_size(size, 'MiB')} ({fmt_size(free, 'MiB')} free)"
    if world == 1:
        return [info("shm", "/dev/shm (one rank: not needed for TP)", text + ".", numbers)]
    if size > CONTAINER_SHM:
        return []
    return [warning("shm", "/dev/shm is a container's default size", f"{text}, the container default, with "
                    f"{world} ranks: NCCL and vLLM's shared-memory queues fail or crawl in it.", numbers,
                    [Fix("Run the container with --ipc=host or --shm-size 16g (Kubernetes: an emptyDir with medium "
                         "Memory at /dev/shm)", "the ranks talk through /dev/shm")])]  # fmt: skip


def open_files(ctx: Context) -> list[Finding]:
    """The open-files limit: vLLM raises the soft limit to 65535, which the hard limit must allow."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard >= NOFILE_TARGET:
        return []
    found = warning("config-validation", "The open-files limit is below what vLLM asks for",
                    f"ulimit -n is {soft} (hard {hard}); vLLM tries to raise it to {NOFILE_TARGET} and cannot: "
                    "many connections then fail with 'Too many open files'.", {"soft": soft, "hard": hard},
                    [Fix(f"Raise the hard limit (ulimit -Hn {NOFILE_TARGET}, docker --ulimit nofile={NOFILE_TARGET})",
                         "every connection holds a file descriptor")])  # fmt: skip
    found.stage = 30  # under load, not at startup
    return [found]


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
        return [info("disk-full", "Free disk for the download (checkpoint size unknown)",
                     f"{fmt_size(free, 'GiB')} free at {where}; the checkpoint's size is unknown here (no safetensors "
                     "metadata from the Hub).", numbers)]  # fmt: skip
    numbers["checkpoint_gib"] = round(size / GIB, 2)
    if size <= free:
        return []
    return [blocker("disk-full", "The checkpoint does not fit on the disk it downloads to",
                    f"{fmt_size(size, 'GiB')} of safetensors, {fmt_size(free, 'GiB')} free at {where}.", numbers,
                    [Fix("Point --download-dir (or HF_HOME) at a larger disk, or free space",
                         f"{fmt_size(size - free, 'GiB')} more is needed")])]  # fmt: skip


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
                return [blocker("port-in-use", "The port needs privileges", f"binding port {number} is not "
                                "permitted for this user.", {"port": number},
                                [Fix("Use --port 8000 (or any port above 1023)", "ports below 1024 need root")])]  # fmt: skip
    owner = procfs.describe(procfs.socket_owner(procfs.listening_inodes(number)))
    return [blocker("port-in-use", "The port is already in use",
                    f"{host or '0.0.0.0'}:{number} is taken by {owner}: the API server cannot bind it.",
                    {"port": number, "host": host or "0.0.0.0"},
                    [Fix(f"Use another --port (e.g. {number + 1}), or stop {owner}", "one listener per port",
                         "--port", str(number + 1))])]  # fmt: skip


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
    if swap > SWAP_RAISE * total:
        out.append(blocker("config-validation", "--swap-space is too large for this host",
                           f"--swap-space x TP = {fmt_size(swap, 'GiB')} is above 70% of {fmt_size(total, 'GiB')} RAM: "
                           "vLLM refuses it ('Too large swap space').", numbers,
                           [Fix("Lower --swap-space", "vLLM allows at most 70% of RAM", "--swap-space")]))  # fmt: skip
    elif swap > SWAP_WARN * total:
        out.append(warning("config-validation", "--swap-space takes much of the host's RAM",
                           f"--swap-space x TP = {fmt_size(swap, 'GiB')} is above 40% of {fmt_size(total, 'GiB')} RAM.",
                           numbers))  # fmt: skip
    if offload and offload + swap > available:
        out.append(blocker("config-validation", "--cpu-offload-gb does not fit in the host's free RAM",
                           f"{fmt_size(offload, 'GiB')} offloaded + {fmt_size(swap, 'GiB')} swap, "
                           f"{fmt_size(available, 'GiB')} available.", numbers,
                           [Fix("Lower --cpu-offload-gb", "the offloaded weights live in host RAM", "--cpu-offload-gb")]))  # fmt: skip
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
    if space and space > 0:
        want = space * GIB
        if want <= node_free:
            return []
        return [blocker("cpu-kvcache-exceeds-ram", "VLLM_CPU_KVCACHE_SPACE is more than the memory free",
                        f"VLLM_CPU_KVCACHE_SPACE={space:g} GiB; {where} has {fmt_size(node_free, 'GiB')} free of "
                        f"{fmt_size(node_total, 'GiB')}.", {**numbers, "kv_cache_gib": space},
                        [Fix(f"Set VLLM_CPU_KVCACHE_SPACE to at most {int(node_free // GIB)}", "the KV cache is "
                             "allocated in the node's RAM", None, str(int(node_free // GIB)))])]  # fmt: skip
    util = ctx.args.number("gpu_memory_utilization", CPU_UTILIZATION) or CPU_UTILIZATION
    if node_free >= util * node_total:
        return []
    top = int(node_free / node_total * 100) / 100
    return [blocker("cpu-memory-utilization", "Less node memory is free than --gpu-memory-utilization reserves",
                    f"{where}: {fmt_size(node_free, 'GiB')} free of {fmt_size(node_total, 'GiB')}, below "
                    f"--gpu-memory-utilization {util:.2f} ({fmt_size(util * node_total, 'GiB')}): on the CPU backend "
                    "it is the fraction of RAM reserved.", {**numbers, "gpu_memory_utilization": util},
                    [Fix(f"Lower --gpu-memory-utilization to {top:.2f}, or set VLLM_CPU_KVCACHE_SPACE (GiB)",
                         "at most the free fraction", "--gpu-memory-utilization", f"{top:.2f}")],
                    confidence="medium")]  # MemFree: vLLM may count reclaimable memory as available too  # fmt: skip
