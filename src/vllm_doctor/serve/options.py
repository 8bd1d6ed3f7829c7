"""What `vllm-doctor serve` is told (ServeOptions), what it found out (Outcome), and the record of one
run the incident report is handed (Run)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_doctor.data import Rule  # dataclasses only: cheap

TAG = "[vllm-doctor]"


@dataclass
class ServeOptions:
    vllm_args: list[str]  # MODEL and the `vllm serve` arguments
    vllm_bin: str | None = None  # default: `vllm` on PATH
    report_dir: Path | None = None  # each incident in a new <time>-<random>/ under it (default: REPORTS_ROOT)
    always_report: bool = False
    log_file: Path | None = None  # keep the raw capture here (default: a temporary file)
    grace: float = 30.0  # seconds after the first forwarded signal before SIGKILL
    reap_wait: float = 15.0  # seconds vLLM's other processes get to exit after the main one
    diagnose_timeout: float = 20.0  # seconds for the exit diagnosis and report: inside a pod's 30 s grace period
    quiet: bool = False  # after a bad exit, the one line only (not explain's first screen)
    watch: bool = True
    watch_samples: int = 3  # consecutive stats samples waiting with a near-full KV cache
    redact: bool = True
    rules: list[Rule] | None = None  # loaded before the child starts (--rules); None: the built-in ones
    termination_log: Path | None = None  # the termination message on a bad exit; None: termination.default_path()
    stdout_fd: int = 1
    stderr_fd: int = 2


@dataclass
class Outcome:
    status: int  # the wrapper's exit status: the child's, 128 + N for a death by signal N
    returncode: int | None = None  # as Popen reports it (negative for a signal)
    signal: str | None = None
    ready: bool = False
    signals_forwarded: list[str] = field(default_factory=list)
    escalated: bool = False  # the wrapper sent SIGKILL after the grace period
    hung: bool = False  # vLLM printed "Waiting for connections to close"
    fatal_lines: list[str] = field(default_factory=list)
    survivors: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what vllm-doctor told the operator
    internal_errors: list[str] = field(default_factory=list)
    bad_reasons: list[str] = field(default_factory=list)
    report_dir: Path | None = None
    cause: tuple[list[str], list[str]] | None = None  # the termination message's lines (termination.cause)
    last_lines: list[str] = field(default_factory=list)  # the output's last lines, when the diagnosis failed
    started: float = 0.0
    ended: float = 0.0

    @property
    def how_ended(self) -> str:
        """The reasons for a report, else the exit status: what the wrapper says of the child."""
        return "; ".join(self.bad_reasons) or f"exit status {self.status}"


def exit_status(returncode: int) -> int:
    """As a shell reports it: 128 + N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass(frozen=True)
class Run:
    """One run as the incident report is handed it, once the child is reaped: what ran, in which
    environment, where its output was captured, the GPUs at the exit. The record does not change;
    the Outcome in it is what the report completes (its reasons, its directory)."""

    opts: ServeOptions
    outcome: Outcome
    argv: tuple[str, ...]
    env: Mapping[str, str]  # read-only (the wrapper's copy)
    capture_path: Path | None
    gpu: dict[str, Any] | None  # the snapshot at the exit as report/1 has it; None: not taken
    gpu_snapshot: Any  # capacity.gpu.GpuSnapshot, handed to the diagnosis
    discard_capture: Callable[[], None]  # close the capture, delete it when temporary


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
