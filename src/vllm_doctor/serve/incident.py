"""After the exit: the diagnosis and the incident report directory (report.md, report.json,
server.log, env.txt), each part written on its own so that one failing leaves the others."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import tempfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from vllm_doctor.serve.options import Run, ServeOptions
from vllm_doctor.serveargs import ENV_NAMES, ENV_PREFIXES

REPORTS_ROOT = Path("vllm-doctor-reports")


def say(opts: ServeOptions, line: str) -> None:
    try:
        from vllm_doctor.render.visible import visible

        os.write(opts.stderr_fd, (visible(line) + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def finish(w: Run) -> None:
    """The diagnosis and the report within --diagnose-timeout: the capture read within 70 % of it
    (its start and end where it is too large: read/budget.py), server.log copied within 90 %."""
    from vllm_doctor.read.budget import Budget

    opts, o = w.opts, w.outcome
    report, diag_error, begun = None, None, None
    budget = Budget.within(opts.diagnose_timeout)
    copy_by = budget.began + 0.9 * opts.diagnose_timeout
    try:
        from vllm_doctor.knowledge.checks import Options
        from vllm_doctor.knowledge.rulebook import LOG_KINDS, builtin
        from vllm_doctor.pipeline import explain
        from vllm_doctor.serve.capture import may_fail

        # the model's config.json from its directory or the HF cache (never the network: the
        # server has just died, the report should not wait), and the GPUs as they were at the exit
        options = Options(lookup_model=True, offline=True, gpu_snapshot=w.gpu_snapshot, this_host=True)
        rules = builtin(LOG_KINDS) if opts.rules is None else opts.rules
        clean = o.status == 0 and not o.signal and o.ready and not opts.always_report
        if clean and (w.capture_path is None or not may_fail(w.capture_path, rules)):
            w.discard_capture()  # no report to write: the explain of the capture could only say healthy
            return
        if not clean and w.capture_path is not None:  # a report whatever the diagnosis says
            begun = _begin(w, copy_by)
        report = explain([str(w.capture_path)], rules, options, budget)
        report.paths = ["server.log"]
        report.warnings = [x.replace(str(w.capture_path), "server.log") for x in report.warnings]
    except Exception as e:
        diag_error = f"{type(e).__name__}: {e}"
        o.internal_errors.append(f"diagnosis: {diag_error}")
        from vllm_doctor.serve.capture import last_lines

        o.last_lines = last_lines(w.capture_path)  # what the server said last, with no diagnosis to say why
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
    from vllm_doctor.serve.termination import cause

    o.cause = cause(report, diag_error, o)  # serve/termination.py writes it after the report
    if not o.bad_reasons and not opts.always_report:
        w.discard_capture()
        return
    if w.capture_path is None:
        return
    o.report_dir, missing = write_report(w, report, diag_error, begun or copy_by)
    if o.report_dir is None:
        return
    if "server.log" not in missing:  # the capture is deleted only once server.log holds it all
        w.discard_capture()
    if report is not None and report.status in ("failed", "degraded"):
        from vllm_doctor.render.summary import headline

        what = headline(report)
        if budget.jumped:
            what += f" (read within --diagnose-timeout {opts.diagnose_timeout:g} s: the middle of the output was not)"
    elif report is not None:
        what = f"{o.bad_reasons[0] if o.bad_reasons else 'clean exit'}; no cause found in the output"
    else:
        what = f"could not diagnose ({diag_error}); vLLM: {o.how_ended}"
    where = f"incident report in {o.report_dir}/"
    if missing:
        where += f" without {', '.join(missing)}" + (
            f"; raw output in {w.capture_path}" if "server.log" in missing else ""
        )
    if report is not None and report.status in ("failed", "degraded") and not opts.quiet:
        _answer(opts, report)
    say(opts, f"vllm-doctor: {what}; {where}")


def _answer(opts: ServeOptions, report) -> None:
    """explain's first screen on stderr (the cause, the first fix, the corrected command), fitted to
    the terminal as explain's is: what `kubectl logs --previous` and the paged operator read first.
    A closed or failing stderr loses only this."""
    from vllm_doctor.render.text import show

    try:
        with open(opts.stderr_fd, "w", encoding="utf-8", errors="replace", closefd=False) as err:
            err.write("\n")
            show(report, file=err, redact=opts.redact, more="(all of it: report.md in the incident report below)")
    except (OSError, ValueError):
        pass


def _report_dir(opts: ServeOptions) -> Path:
    """A new directory for this incident under --report-dir (or REPORTS_ROOT): created the way
    mkdtemp creates one (a fresh name, O_EXCL semantics, mode 0700), so a second incident never
    overwrites the first and nothing planted in it beforehand can exist."""
    root = Path(opts.report_dir) if opts.report_dir is not None else REPORTS_ROOT
    root.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.mkdtemp(prefix=f"{stamp}-", dir=root))


class ReportFiles:
    """Files created in the report directory through a descriptor of it: never an existing
    name, never through a symlink (O_EXCL | O_NOFOLLOW), mode 0600."""

    def __init__(self, d: Path):
        self.dir = d
        self._fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))

    def open(self, name: str) -> BinaryIO:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        return os.fdopen(os.open(name, flags, 0o600, dir_fd=self._fd), "wb")

    def remove(self, name: str) -> None:
        """A part that failed half-way: gone rather than passed off as whole."""
        try:
            os.unlink(name, dir_fd=self._fd)
        except OSError:
            pass

    def close(self) -> None:
        os.close(self._fd)


Begun = tuple  # (directory, its ReportFiles, the Redactor or None, what the copy ended with)


def _begin(w: Run, by: float) -> Begun | None:
    """The report directory, and server.log written into it by a forked process while this one
    diagnoses: the redacted copy and the explain of a large capture each take a core, not one
    after the other. For a report that is certain before the diagnosis (a bad exit status, a
    signal, never ready, --always-report). None: write_report makes both after it."""
    try:
        d = _report_dir(w.opts)
        files = ReportFiles(d)
    except OSError:
        return None  # write_report tries again, and says why it cannot
    red = _redactor(w)
    return d, files, red, _copy_aside(w, files, red, by)


def _redactor(w: Run):
    from vllm_doctor.render.redact import Redactor, flag_values, secret_values

    return Redactor(secret_values() + flag_values(w.argv)) if w.opts.redact else None


def _copy_log(w: Run, files: ReportFiles, red) -> str | None:
    """server.log, the capture (redacted unless --no-redact); what went wrong, or None."""
    try:
        with open(str(w.capture_path), "rb") as fin, files.open("server.log") as fout:
            if red is not None:
                red.copy(fin, fout)
            else:
                shutil.copyfileobj(fin, fout, 1 << 20)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def _copy_aside(w: Run, files: ReportFiles, red, by: float) -> Callable[[], str | None]:
    """_copy_log in a forked process; returns what waits for it until `by` (time.monotonic(): a
    copy not done then is ended, and said to be) and gives its result (here at once where no
    process can be forked)."""
    try:
        r, wr = os.pipe()
    except OSError:
        r = wr = -1
    pid = -1
    if r >= 0:
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(wr)
    if pid < 0:
        error = _copy_log(w, files, red)
        return lambda: error
    if pid == 0:  # the copy: killed by a signal as a plain process is, it never passes for whole
        try:
            os.close(r)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            error = _copy_log(w, files, red)
            os.write(wr, (error or "").encode("utf-8", "replace")[:4096])
        finally:
            os._exit(0)

    def result() -> str | None:
        import select
        import time

        said = b""
        with os.fdopen(r, "rb", buffering=0) as f:
            while (left := by - time.monotonic()) > 0 and select.select([f], [], [], left)[0]:
                if not (more := f.read(4096)):
                    break
                said += more
            else:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return f"not copied within --diagnose-timeout {w.opts.diagnose_timeout:g} s"
        error = said.decode("utf-8", "replace")
        status = os.waitpid(pid, 0)[1]
        code = os.waitstatus_to_exitcode(status)
        return error or (f"the copying process ended with {code}" if code else None)

    os.close(wr)
    return result


def write_report(w: Run, report, diag_error: str | None, begun: Begun | float) -> tuple[Path | None, list[str]]:
    """server.log first (the one thing that must exist; begun: being written already, else the
    time it is copied by), then env.txt, report.json, report.md. Returns the directory and the
    files that could not be written."""
    from vllm_doctor.render.visible import visible

    opts, o = w.opts, w.outcome
    if isinstance(begun, tuple):
        d, files, red, copied = begun
        error = copied()
    else:
        try:
            d = _report_dir(opts)
            files = ReportFiles(d)
        except OSError as e:
            say(opts, f"vllm-doctor: cannot create the report directory ({e.strerror or e}); raw output in "
                f"{w.capture_path}")  # fmt: skip
            return None, []
        red = _redactor(w)
        error = _copy_aside(w, files, red, begun)()
    missing = []
    if error is not None:
        missing.append("server.log")
        files.remove("server.log")
        o.internal_errors.append(f"server.log: {error}")
    version = report.facts.get("vllm_version") if report is not None else None
    if red is not None and report is not None:  # its evidence each line beside its neighbours (a wrap's cut)
        from vllm_doctor.render.redact import report as masked

        try:
            report = masked(report, red)
        except Exception as e:  # pragma: no cover - defensive: each part is still masked as text
            o.internal_errors.append(f"redaction: {type(e).__name__}: {e}")
    parts = [
        ("env.txt", lambda: env_text(w, version)),
        ("report.json", lambda: json_text(w, report, diag_error, red)),
        ("report.md", lambda: markdown_text(w, report, diag_error, red)),
    ]
    from vllm_doctor.render.html import attachments  # issue 14: memory.svg, queue.svg, report.html

    parts += attachments(report, red, lambda: ended(w))
    for name, make in parts:
        try:
            text = make()
            if red is not None and name != "report.json":
                text = red.text(text)
            if name != "report.json":  # after the masking: a reader gets escapes, not commands
                text = visible(text)
            with files.open(name) as f:
                f.write(text.encode("utf-8"))
        except Exception as e:
            missing.append(name)
            files.remove(name)
            o.internal_errors.append(f"{name}: {type(e).__name__}: {e}")
    files.close()
    return d, missing


def serve_section(w: Run, diag_error: str | None) -> dict[str, Any]:
    o = w.outcome
    return {
        "command": list(w.argv),
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
        "last_lines": o.last_lines,
    }


def json_text(w: Run, report, diag_error: str | None, red) -> str:
    import json

    from vllm_doctor.render.json import SCHEMA, to_dict

    data = to_dict(report) if report is not None else _undiagnosed(SCHEMA)
    data["serve"] = serve_section(w, diag_error)
    if red is not None:
        data["serve"]["command"] = red.argv(list(w.argv))
        data = red.obj(data)
    from vllm_doctor.render.visible import json_visible

    return json_visible(json.dumps(data, indent=2, ensure_ascii=False, default=str)) + "\n"


def _undiagnosed(schema: str) -> dict[str, Any]:
    """report/1 of an output the diagnosis failed on: every key, null or empty (lines: not read)."""
    try:
        from vllm_doctor.capacity.gpu import skipped
        from vllm_doctor.knowledge.checks import Options
        from vllm_doctor.pipeline import unread
        from vllm_doctor.render.json import to_dict

        report = unread(["server.log"], Options(gpu_snapshot=skipped("the diagnosis failed")))
        data = to_dict(report)
        data["input"]["lines"] = None
        return data
    except Exception:  # what broke the diagnosis may break this too: the keys alone, then
        empty = {"paths": ["server.log"], "lines": None, "warnings": [], "empty": False}
        return {"schema": schema, "input": empty, "status": "unknown", "diagnoses": [], "facts": {},
                "lifetime": None, "lifetimes": []}  # fmt: skip


def ended(w: Run) -> dict[str, Any]:
    """How the server ended, for report.md and report.html: (name, text) rows, the processes that
    outlived vLLM, the GPU at exit and the command."""
    o = w.outcome
    how = f"exit status {o.status}" + (f" ({o.signal})" if o.signal else "")
    rows = [("Exit", f"{how}; {'became ready' if o.ready else 'never became ready'}")]
    if o.bad_reasons:
        rows.append(("Why this report", "; ".join(o.bad_reasons)))
    if o.signals_forwarded:
        rows.append(("Signals forwarded", ", ".join(o.signals_forwarded)))
    if o.escalated:
        hung = ' (it hung on "Waiting for connections to close")' if o.hung else ""
        rows.append(("Escalated", "vLLM did not stop in the grace period; vllm-doctor sent SIGKILL" + hung))
    from vllm_doctor.render.summary import gpu_lines

    survivors = [
        (f"pid {s['pid']}", s["command"], "killed" if s["killed"] else "could not be killed") for s in o.survivors
    ]
    return {
        "rows": rows,
        "survivors": survivors,
        "gpu": gpu_lines(w.gpu) or ["not taken"],
        "command": shlex.join(w.argv),
    }


def markdown_text(w: Run, report, diag_error: str | None, red=None) -> str:
    """report.md. Words from the log are Markdown-escaped (render/visible.py), so `red` masks them
    first: an escape inside a secret would hide it from the masking of the whole text after."""
    from vllm_doctor.render import redact as masking
    from vllm_doctor.render.markdown import render as to_markdown
    from vllm_doctor.render.visible import code, fence, md

    def mask(text: str) -> str:
        return red.text(text) if red is not None else text

    o = w.outcome
    out = []
    if report is not None:
        out.append(to_markdown(masking.report(report, red) if red else report, redact=False).rstrip("\n"))
    else:
        out += [
            "## vllm-doctor: could not diagnose",
            "",
            f"The diagnosis failed: {code(mask(diag_error or ''))}. The output is in `server.log`.",
        ]
        if o.last_lines:
            last = [mask(line) for line in o.last_lines]
            out += ["", "### The output's last lines", "", fence(last), *last, fence(last)]
    out += ["", "### How the server ended", ""]
    out += [f"- **{name}:** {md(mask(text))}" for name, text in ended(w)["rows"]]  # a fatal line of the log, maybe
    for s in o.survivors:
        out.append(
            f"- **Outlived vLLM:** pid {s['pid']} {code(mask(s['command']))} "
            f"({'killed' if s['killed'] else 'could not be killed'})"
        )
    from vllm_doctor.render.summary import gpu_lines

    out += ["- **GPU at exit:**"] + [f"  - {md(mask(line))}" for line in gpu_lines(w.gpu) or ["not taken"]]
    # a fenced block: an inline `…` loses its closing backtick to a masked value at its end, and
    # renders alike in GitHub, GitLab and Jira
    command = shlex.join(w.argv)
    out += ["", "**Command**", "", f"{fence([command])}sh", command, fence([command])]
    out += ["", "Files: `server.log` (the output), `env.txt` (versions, GPU, environment), `report.json`.", ""]
    from vllm_doctor.render.html import links

    out += links(report)
    return "\n".join(out)


def env_text(w: Run, version: str | None) -> str:
    import platform

    from vllm_doctor import __version__
    from vllm_doctor.serve import hostenv

    o = w.outcome
    host = hostenv.probe(hostenv.python_of(w.argv[0] if w.argv else None))  # what vLLM's collect_env gathers
    lines = [
        f"vllm-doctor {__version__}",
        f"vLLM: {version or hostenv.vllm_version(host) or 'unknown'}",
        f"command: {shlex.join(w.argv)}",
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
    lines += hostenv.lines(host)
    lines += ["", "environment:"]
    env = w.env or os.environ
    from vllm_doctor.render.redact import MASK, is_secret

    for k in sorted(env):
        if k.startswith(ENV_PREFIXES) or k in ENV_NAMES:  # a secret by its name or its value's shape
            lines.append(f"  {k}={MASK if w.opts.redact and is_secret(k, env[k]) else env[k]}")
    return "\n".join(lines) + "\n"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds") if t else "-"
