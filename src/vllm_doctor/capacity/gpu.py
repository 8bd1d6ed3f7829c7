"""The GPUs of this machine as NVML sees them: per device the name, total/used/free memory and
every process holding memory; the driver and CUDA versions.

All NVML calls sit in one small adapter (Nvml); everything else works on the GpuSnapshot it
yields, and tests replace the adapter, nothing else. Without NVML (no GPU, no driver, no
nvidia-ml-py) the snapshot says why ("GPU checks skipped: <reason>"); it never raises.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

MIB = 2**20


@dataclass
class GpuProcess:
    pid: int
    name: str
    used_mib: int | None  # None where NVML cannot say (containers without the PID namespace)
    # the vLLM server it belongs to (capacity/colocated.py: its pid, model, --gpu-memory-utilization)
    server_pid: int | None = None
    server_model: str | None = None
    server_utilization: float | None = None


@dataclass
class GpuDevice:
    index: int
    name: str
    total_mib: int
    used_mib: int
    free_mib: int
    processes: list[GpuProcess] = field(default_factory=list)


@dataclass
class GpuSnapshot:
    available: bool
    reason: str | None = None  # why there is no snapshot
    devices: list[GpuDevice] = field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "reason": self.reason,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "devices": [_device_json(d) for d in self.devices],
        }

    @property
    def skipped_line(self) -> str | None:
        return None if self.available else f"GPU checks skipped: {self.reason}"


def _device_json(device: GpuDevice) -> dict[str, Any]:
    """A device as report/1 has it: a process's server fields inform the checks, not the report."""
    out = asdict(device)
    out["processes"] = [{"pid": p.pid, "name": p.name, "used_mib": p.used_mib} for p in device.processes]
    return out


class NvmlAdapter(Protocol):
    """What snapshot() needs from NVML. Memory in bytes, as NVML reports it."""

    def open(self) -> None: ...
    def close(self) -> None: ...
    def driver_version(self) -> str: ...
    def cuda_version(self) -> str: ...
    def device_count(self) -> int: ...
    def device_name(self, index: int) -> str: ...
    def memory(self, index: int) -> tuple[int, int, int]: ...  # total, used, free
    def processes(self, index: int) -> list[tuple[int, int | None]]: ...  # pid, used bytes
    def process_name(self, pid: int) -> str: ...


class Nvml:
    """The real adapter: nvidia-ml-py (module pynvml), imported when first used."""

    def __init__(self) -> None:
        import pynvml  # nvidia-ml-py; ImportError is turned into a reason by snapshot()

        self.nv = pynvml

    def open(self) -> None:
        self.nv.nvmlInit()

    def close(self) -> None:
        self.nv.nvmlShutdown()

    def driver_version(self) -> str:
        return _text(self.nv.nvmlSystemGetDriverVersion())

    def cuda_version(self) -> str:
        v = int(self.nv.nvmlSystemGetCudaDriverVersion())  # e.g. 12040
        return f"{v // 1000}.{v % 1000 // 10}"

    def device_count(self) -> int:
        return int(self.nv.nvmlDeviceGetCount())

    def _handle(self, index: int):
        return self.nv.nvmlDeviceGetHandleByIndex(index)

    def device_name(self, index: int) -> str:
        return _text(self.nv.nvmlDeviceGetName(self._handle(index)))

    def memory(self, index: int) -> tuple[int, int, int]:
        info = self.nv.nvmlDeviceGetMemoryInfo(self._handle(index))
        return int(info.total), int(info.used), int(info.free)

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        handle = self._handle(index)
        seen: dict[int, int | None] = {}
        for getter in (self.nv.nvmlDeviceGetComputeRunningProcesses, self.nv.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                procs = getter(handle)
            except self.nv.NVMLError:
                continue
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                used = None if used is None or used >= 2**63 else int(used)  # NVML_VALUE_NOT_AVAILABLE
                seen[int(p.pid)] = used if seen.get(int(p.pid)) is None else seen[int(p.pid)]
        return list(seen.items())

    def compute_capability(self, index: int) -> tuple[int, int]:
        major, minor = self.nv.nvmlDeviceGetCudaComputeCapability(self._handle(index))
        return int(major), int(minor)

    def process_name(self, pid: int) -> str:
        try:
            return _text(self.nv.nvmlSystemGetProcessName(pid))
        except Exception:  # noqa: BLE001 - not allowed to see it; try /proc
            try:
                return Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                return "?"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _reason(error: BaseException) -> str:
    name = type(error).__name__
    if isinstance(error, ImportError):
        return "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    if "LibraryNotFound" in name:
        return "no NVIDIA driver here (the NVML library libnvidia-ml.so is not found)"
    if "DriverNotLoaded" in name:
        return "the NVIDIA driver is not loaded"
    if "NoPermission" in name:
        return "no permission to query the GPU through NVML"
    text = str(error).strip() or name
    return f"NVML failed: {text}"


# what an NVIDIA driver leaves on a machine (Linux, containers, WSL2); with none of them NVML
# cannot work, and not loading it keeps a GPU-less explain quick
DRIVER_MARKERS = ("/dev/nvidiactl", "/proc/driver/nvidia/version", "/dev/dxg")


def snapshot(adapter: NvmlAdapter | None = None) -> GpuSnapshot:
    """Every GPU's memory and processes now; never raises."""
    if adapter is None and not any(os.path.exists(p) for p in DRIVER_MARKERS):
        return GpuSnapshot(False, "no NVIDIA driver here (no /dev/nvidiactl or /proc/driver/nvidia)")
    try:
        nv = adapter if adapter is not None else Nvml()
        nv.open()
    except Exception as e:  # noqa: BLE001 - any NVML failure means "skip the GPU checks"
        return GpuSnapshot(False, _reason(e))
    try:
        devices = []
        for i in range(nv.device_count()):
            total, used, free = nv.memory(i)
            procs = [_process(nv, pid, b) for pid, b in nv.processes(i)]
            devices.append(GpuDevice(i, nv.device_name(i), total // MIB, used // MIB, free // MIB, procs))
        if not devices:
            return GpuSnapshot(False, "NVML sees no GPU")
        return GpuSnapshot(True, None, devices, _safe(nv.driver_version), _safe(nv.cuda_version))
    except Exception as e:  # noqa: BLE001
        return GpuSnapshot(False, _reason(e))
    finally:
        try:
            nv.close()
        except Exception:  # noqa: BLE001
            pass


def _process(nv: NvmlAdapter, pid: int, used: int | None) -> GpuProcess:
    from vllm_doctor.capacity.colocated import server_of

    p = GpuProcess(pid, nv.process_name(pid), None if used is None else used // MIB)
    server = server_of(pid)
    if server is not None:
        p.server_pid, p.server_model, p.server_utilization, _ = server
    return p


def _safe(call) -> str | None:
    try:
        return call()
    except Exception:  # noqa: BLE001
        return None


def capabilities(adapter: Any = None) -> dict[int, tuple[int, int]]:
    """Each GPU's compute capability (8, 0), from adapters that can say; {} without NVML. Never raises."""
    if adapter is None and not any(os.path.exists(p) for p in DRIVER_MARKERS):
        return {}
    try:
        nv = adapter if adapter is not None else Nvml()
        nv.open()
    except Exception:  # noqa: BLE001 - no NVML: no capabilities
        return {}
    try:
        ask = getattr(nv, "compute_capability", None)
        return {i: tuple(ask(i)) for i in range(nv.device_count())} if ask else {}
    except Exception:  # noqa: BLE001
        return {}
    finally:
        try:
            nv.close()
        except Exception:  # noqa: BLE001
            pass


def skipped(reason: str) -> GpuSnapshot:
    return GpuSnapshot(False, reason)


def headroom(device: GpuDevice, margin: float = 0.02) -> float:
    """The largest --gpu-memory-utilization that fits in what is free on the card now, to 0.01:
    V1 refuses to start when free memory is below total x utilization."""
    return max(0.0, math.floor((device.free_mib / device.total_mib - margin) * 100) / 100)
