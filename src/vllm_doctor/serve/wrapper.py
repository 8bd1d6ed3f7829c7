"""The wrapper's life: start vLLM, pass its output through until it and its pipes are gone,
reap what it left behind, then hand over to the incident report (incident.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vllm_doctor.serve import process
from vllm_doctor.serve.capture import Capture
from vllm_doctor.serve.guardian import Guardian
from vllm_doctor.serve.markers import Markers
from vllm_doctor.serve.options import TAG, Outcome, Run, ServeOptions, exit_status, signal_name
from vllm_doctor.serve.passthrough import Output, Pump, plain_copy
from vllm_doctor.serve.signals import Forwarder
from vllm_doctor.serve.watch import Watcher

POLL = 0.1  # seconds between looks at the child when no output arrives
DRAIN = 2.0  # seconds to read what is left in the pipes once every writer is gone
WATCH_WAIT = 120.0  # seconds: only a safety net against a stuck watch; it ends once its queue is read
SWITCH_INTERVAL = 0.0005  # seconds: the watch thread gives the GIL back to the pump this soon


class Wrapper:
    def __init__(self, opts: ServeOptions):
        self.opts = opts
        self.proc: Any = None  # subprocess.Popen, once started
        self.outcome = Outcome(status=0)
        self.out = Output((opts.stdout_fd, opts.stderr_fd))
        self.capture = Capture(self.note, self.outcome.internal_errors)
        self.signals = Forwarder(self.outcome, self.note, opts.grace)
        self.markers: dict[int, Markers] = {}  # per pipe
        self.watcher: Watcher | None = None
        self.guardian: Guardian | None = None  # ends vLLM and deletes the capture if we are killed
        self.gpu: dict[str, Any] | None = None
        self.gpu_snapshot: Any = None  # gpu.GpuSnapshot, handed to the diagnosis
        self.argv: list[str] = []
        self.env: dict[str, str] = {}
        self.ours: set[int] = set()  # our children from before vLLM's (not vLLM's to reap)

    @property
    def capture_path(self) -> Path | None:
        return self.capture.path

    # ---- output -----------------------------------------------------------------------------
    def _write(self, fd: int, data: bytes) -> None:
        self.out.write(fd, data)

    def note(self, message: str) -> None:
        """Queue one line of vllm-doctor's own for stderr, printed only at a line boundary."""
        self.out.note(message)
        self.outcome.warnings.append(message)

    def _flush_notes(self, force: bool = False) -> None:
        self.out.flush_notes(self.opts.stderr_fd, force)

    def _capture(self, fd: int, data: bytes) -> None:
        """A chunk, once passed through, read on the side: markers, capture file, live watch."""
        pieces = self.capture.add(fd, data)
        try:
            self.markers[fd].feed(data)
            if self.watcher is not None and pieces:
                self.watcher.feed(pieces)
        except Exception as e:  # pragma: no cover - defensive
            self.outcome.internal_errors.append(f"inspect: {type(e).__name__}: {e}")

    # ---- run --------------------------------------------------------------------------------
    def start(self) -> None:
        opts = self.opts
        binary = opts.vllm_bin or shutil.which("vllm") or "vllm"
        self.argv = [binary, "serve", *opts.vllm_args]
        self.capture.open(opts.log_file)
        self.guardian = Guardian(opts.grace)  # before `ours`: it is not vLLM's to reap
        if self.capture.temporary and self.capture.path is not None:
            self.guardian.capture(str(self.capture.path))
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")  # vLLM's prints reach the pipe as they happen
        self.env = env
        self.outcome.started = time.time()
        self.signals.install()
        self.ours = process.children()
        self.proc = process.start(self.argv, env)
        self.signals.pid = self.proc.pid
        self.guardian.group(self.proc.pid)
        self.signals.account(self._exited)  # a signal that came while the child was starting
        self.markers = {
            self.proc.stdout.fileno(): Markers(self.outcome),
            self.proc.stderr.fileno(): Markers(self.outcome),
        }
        if opts.watch:
            try:
                self.watcher = Watcher(opts.watch_samples, opts.rules, self.note)
                self.watcher.start()
                sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
            except Exception as e:  # pragma: no cover - defensive
                self.watcher = None
                self.outcome.internal_errors.append(f"watch: {e}")

    def _exited(self) -> bool:
        return self.proc.poll() is not None

    def _routes(self) -> dict[int, int]:
        return {self.proc.stdout.fileno(): self.opts.stdout_fd, self.proc.stderr.fileno(): self.opts.stderr_fd}

    def discard_capture(self) -> None:
        """Close the capture and delete it when it is a temporary file."""
        self.capture.discard()

    def record(self) -> Run:
        """The run as the incident report reads it (after close())."""
        from types import MappingProxyType

        return Run(self.opts, self.outcome, tuple(self.argv), MappingProxyType(dict(self.env)), self.capture_path,
                   self.gpu, self.gpu_snapshot, self.discard_capture)  # fmt: skip

    def pump(self) -> None:
        """Pass the output through until vLLM's main process has exited and its pipes are closed
        (or its leftover processes have been reaped)."""
        try:
            self._pump()
        except Exception as e:  # a bug in the loop: fall back to the plainest copy
            self.outcome.internal_errors.append(f"pump: {type(e).__name__}: {e}")
            self.note(f"{TAG} note: internal error ({type(e).__name__}: {e}); passing vLLM's output through plainly")
            self._plain_pump()

    def _pump(self) -> None:
        proc, sig = self.proc, self.signals
        pump = Pump(self._routes(), self.out, self._capture)
        exited_at: float | None = None
        reaped_at: float | None = None
        try:
            while True:
                timeout = POLL
                if sig.deadline is not None and exited_at is None:
                    timeout = max(0.0, min(timeout, sig.deadline - time.monotonic()))
                if pump.open:
                    pump.step(timeout)
                elif exited_at is None:
                    try:  # the pipes are closed: wait for the main process itself
                        proc.wait(timeout)
                    except subprocess.TimeoutExpired:
                        pass
                else:
                    time.sleep(timeout)
                sig.account(self._exited)
                self._tell_deadline()
                self._flush_notes()
                now = time.monotonic()
                if exited_at is None:
                    if proc.poll() is None:
                        if sig.deadline is not None and now >= sig.deadline:
                            sig.deadline = None
                            sig.kill(f"the {self.opts.grace:g} s grace period")
                        continue
                    exited_at = now
                    self._at_exit()
                if not pump.open and (reaped_at is not None or not process.family(proc.pid, self.ours)):
                    break  # every writer of the pipes is gone
                if reaped_at is None and now - exited_at >= self.opts.reap_wait:
                    self._reap()  # leftovers: kill them, then drain what they wrote
                    reaped_at = now
                elif reaped_at is not None and now - reaped_at >= DRAIN:
                    break  # something that cannot be killed still holds a pipe
            if reaped_at is None:
                self._reap()  # elsewhere than Linux: the process group, if anything is left in it
        finally:
            pump.close()
        self._finish_capture()

    def _plain_pump(self) -> None:
        """The fallback: copy the pipes through with threads and wait; nothing else."""
        threads = plain_copy(self._routes(), self.out, lambda data: self.capture.write([data]))
        sig = self.signals
        while self.proc.poll() is None:
            time.sleep(POLL)
            sig.account(self._exited)
            self._tell_deadline()
            if sig.deadline is not None and time.monotonic() >= sig.deadline:
                sig.kill(f"the {self.opts.grace:g} s grace period")
                sig.deadline = None
        self._reap()
        for t in threads:
            t.join(DRAIN)

    def _tell_deadline(self) -> None:
        if self.guardian is not None:
            self.guardian.deadline(self.signals.deadline)

    def done(self) -> None:
        """Our work is over (vLLM reaped, the capture deleted or kept on purpose): the guardian
        has nothing to do at our exit."""
        if self.guardian is not None:
            self.guardian.done()

    def _at_exit(self) -> None:
        rc = self.proc.returncode
        o = self.outcome
        o.returncode = rc
        o.status = exit_status(rc)
        o.signal = signal_name(-rc) if rc < 0 else None
        o.ended = time.time()
        try:
            from vllm_doctor.capacity import gpu

            self.gpu_snapshot = gpu.snapshot()  # at this moment: leftovers may still hold memory
            self.gpu = self.gpu_snapshot.to_json()
        except Exception as e:
            self.gpu = {"available": False, "reason": f"internal error: {type(e).__name__}: {e}"}

    def _reap(self) -> None:
        survivors, line = process.reap(self.proc.pid, self.ours)
        self.outcome.survivors += survivors
        if line:
            self.note(f"{TAG} {line}")

    def _finish_capture(self) -> None:
        pieces = self.capture.finish()
        for m in self.markers.values():
            m.finish()
        if self.watcher is not None and pieces:
            self.watcher.feed(pieces)

    def close(self) -> None:
        self._finish_capture()
        if self.watcher is not None:
            self.watcher.stop()  # closes its queue: the watch reads what is queued, then ends
            self.watcher.join(WATCH_WAIT)  # that end is the event waited for, however busy the machine
            if self.watcher.is_alive():  # pragma: no cover - a bug in the watch
                self.outcome.internal_errors.append("watch: still running at the exit")
        self._flush_notes(force=True)
        self.signals.restore()
        for f in (self.proc.stdout, self.proc.stderr) if self.proc else ():
            try:
                f.close()
            except OSError:
                pass


def run(opts: ServeOptions) -> Outcome:
    """Run vLLM under the wrapper until it exits; write the incident report on a bad exit."""
    from vllm_doctor.serve.incident import finish, say

    w = Wrapper(opts)
    try:
        w.start()
    except OSError as e:  # the binary is missing or cannot run: as a shell says it
        w.signals.restore()
        w.discard_capture()
        w.done()
        w._flush_notes(force=True)
        name = w.argv[0] if w.argv else "vllm"
        if isinstance(e, FileNotFoundError):
            say(opts, f"vllm-doctor: {name}: not found (use --vllm-bin PATH)")
            return Outcome(status=127)
        say(opts, f"vllm-doctor: cannot start {name}: {e.strerror or e}")
        return Outcome(status=126)
    try:
        w.pump()
    finally:
        if w.proc.poll() is None:  # only when vllm-doctor itself is being torn down
            w.proc.wait()
        if w.outcome.returncode is None:
            w._at_exit()
        w.close()
    if w.guardian is not None:
        w.guardian.reaped()  # the group is gone: its number is no longer ours to signal
    o = w.outcome
    if w.watcher is not None and w.watcher.failed:
        o.internal_errors.append(f"watch: {w.watcher.failed}")
    try:
        finish(w.record())
    except Exception as e:  # the report is a bonus; the status is the child's regardless
        o.internal_errors.append(f"report: {type(e).__name__}: {e}")
        say(opts, f"vllm-doctor: could not finish the report ({type(e).__name__}: {e}); raw output in {w.capture_path}")
    w.done()
    from vllm_doctor.serve.termination import tell

    tell(opts, o, w.argv)  # Kubernetes' termination message: the cause in `kubectl describe pod`
    return o
