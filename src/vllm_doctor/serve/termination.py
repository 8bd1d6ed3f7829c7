"""Kubernetes' termination message: on a bad exit, the cause where `kubectl describe pod` and
the pod's last state show it (lastState.terminated.message), so the incident is readable even
when the container's filesystem, and the incident directory with it, is gone.

The kubelet reads the file a container's terminationMessagePath names (default
/dev/termination-log, which it mounts writable into every container) and keeps at most 4096
bytes of it: the verdict, the first fix and the corrected command come first, the summary, the
exit and where the incident report is follow while they fit, and the whole is cut at a
character boundary to 4096 bytes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from vllm_doctor.data import Report
    from vllm_doctor.serve.options import Outcome, ServeOptions

DEFAULT = Path("/dev/termination-log")
LIMIT = 4096  # bytes the kubelet keeps of the message
LAST_BYTES = 2048  # of it, the output's last lines where there is no diagnosis


def default_path() -> Path | None:
    """/dev/termination-log when it exists and is writable (in a Kubernetes container), else None."""
    return DEFAULT if DEFAULT.is_file() and os.access(DEFAULT, os.W_OK) else None


def cause(report: Report | None, diag_error: str | None, outcome: Outcome) -> tuple[list[str], list[str]]:
    """The message's lines from the diagnosis: (the ones it must hold, the ones it holds if they fit).
    With no diagnosis, how vLLM ended and the output's last lines (at most LAST_BYTES of them, so
    the exit and the report's directory still fit after). Secrets are not masked here (message does)."""
    from vllm_doctor.render.summary import corrected_command, headline

    if report is None:
        last: list[str] = []
        size = 0
        for line in reversed(outcome.last_lines):  # the last ones first, while they fit
            size += len(line.encode("utf-8", "replace")) + 1
            if size > LAST_BYTES:
                break
            last.insert(0, line)
        return [f"vllm-doctor: could not diagnose ({diag_error}); vLLM: {outcome.how_ended}"], (
            ["The output's last lines:", *last] if last else []
        )
    must = [f"vllm-doctor: {headline(report)}"]
    top = next((d for d in report.diagnoses if d.severity != "info"), None)
    extra = [top.summary] if top is not None else []
    if top is not None and top.fixes:
        f = top.fixes[0]
        must.append(f"Fix {f.rank}: {f.action}")
        extra.append(f"Why: {f.why}")
    command = corrected_command(report, redact=False)
    if command is not None:
        must += [f"{command[0]}:", command[1]]
    return must, extra


def message(must: list[str], extra: list[str], outcome: Outcome, mask: Callable[[str], str] | None = None) -> str:
    """The text written: `must`, then `extra`, the exit and the report directory while they fit
    in LIMIT bytes (masked by `mask`); cut to LIMIT bytes when `must` alone is longer."""
    how = f"exit status {outcome.status}" + (f" ({outcome.signal})" if outcome.signal else "")
    tail = [f"vLLM ended: {how}; {'became ready' if outcome.ready else 'never became ready'}"]
    if outcome.report_dir is not None:
        tail.append(f"Incident report: {os.path.abspath(outcome.report_dir)}/")  # the volume it is on
    text = _masked("\n".join(must), mask)
    for line in [*extra, *tail]:
        more = text + "\n" + _masked(line, mask)
        if len(more.encode("utf-8")) + 1 <= LIMIT:
            text = more
    data = (text + "\n").encode("utf-8")
    return data[:LIMIT].decode("utf-8", "ignore") if len(data) > LIMIT else text + "\n"


def _masked(text: str, mask: Callable[[str], str] | None) -> str:
    """Masked, then made visible: a control, bidi or lone surrogate from the log as its escape
    (a surrogate no UTF-8 file can hold would lose the whole message)."""
    from vllm_doctor.render.visible import visible

    return visible(mask(text) if mask is not None else text)


def write(path: Path, text: str) -> None:
    """The message, replacing what the file held (a restarted container's last message)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def tell(opts: ServeOptions, outcome: Outcome, argv: list[str]) -> None:
    """After a bad exit (and the incident report): the message in opts.termination_log (else
    default_path(): in a pod, Kubernetes' file). Never
    raises: a failure is one internal error, the exit status is the child's regardless."""
    path = opts.termination_log or default_path()
    if path is None or not (outcome.bad_reasons or outcome.status != 0):
        return
    try:
        mask = None
        if opts.redact:
            from vllm_doctor.render.redact import Redactor, flag_values, secret_values

            mask = Redactor(secret_values() + flag_values(argv)).text
        must, extra = outcome.cause or ([f"vllm-doctor: vLLM ended badly; {'; '.join(outcome.bad_reasons)}"], [])
        write(path, message(must, extra, outcome, mask))
    except Exception as e:
        outcome.internal_errors.append(f"termination log: {type(e).__name__}: {e}")
