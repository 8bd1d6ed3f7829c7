"""The one fake the preflight tests use: NVML (capacity/gpu.py's adapter), with compute capability."""

from __future__ import annotations

MIB = 2**20


class FakeNvml:
    """GPUs as (name, total MiB, free MiB, [(pid, used MiB)], (major, minor))."""

    def __init__(self, gpus, cuda="12.4", driver="550.54.15"):
        self.gpus = gpus
        self.cuda, self.driver = cuda, driver

    def open(self):
        pass

    def close(self):
        pass

    def driver_version(self):
        return self.driver

    def cuda_version(self):
        return self.cuda

    def device_count(self):
        return len(self.gpus)

    def device_name(self, i):
        return self.gpus[i][0]

    def memory(self, i):
        _, total, free, *_ = self.gpus[i]
        return total * MIB, (total - free) * MIB, free * MIB

    def processes(self, i):
        return [(pid, used * MIB) for pid, used in self.gpus[i][3]]

    def process_name(self, pid):
        try:
            with open(f"/proc/{pid}/comm") as f:
                return f.read().strip()
        except OSError:
            return "python3"

    def compute_capability(self, i):
        return self.gpus[i][4] if len(self.gpus[i]) > 4 else (9, 0)


def h100s(n=1, free=81559, processes=(), capability=(9, 0)):
    return FakeNvml([("NVIDIA H100 80GB HBM3", 81559, free, list(processes), capability) for _ in range(n)])
