"""vLLM as its own oracle (issue 38): where vLLM is installed, `check` asks vLLM itself whether it
accepts the command. A subprocess of vLLM's own Python runs `vllm serve`'s own argument parser and
its config construction (EngineArgs.create_engine_config: config.json read, every config class
validated, the platform's own adjustments) with no weights loaded and no device memory
allocated, under a time limit. Its refusal becomes the start's first blocker, in vLLM's words,
named as explain names the same message (the hand rules, else the atlas); its platform and version
say which backend and release will run. What vLLM only learns later (the cache check, TP and NUMA
binding, host RAM) is the capacity model's part.

vLLM's Python: the interpreter of the `vllm` executable (--vllm-bin, else `vllm` on PATH), else
this one when it can import vllm. Importing vLLM takes 5-15 s: the one cost of the answer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_doctor.preflight.context import Context
    from vllm_doctor.preflight.finding import Finding

MARK = "@@vllm-doctor-oracle@@"
TIMEOUT = 90.0  # seconds: vLLM's import (5-15 s) and its config construction, with room for a busy host
# what the subprocess runs: vLLM's CLI with `serve`'s command replaced by the config construction
SCRIPT = r"""
import json, os, sys
out = {"ok": False}
try:
    import vllm
    out["version"] = getattr(vllm, "__version__", None)
    out["site"] = os.path.dirname(os.path.dirname(vllm.__file__))
    from vllm.entrypoints.cli import main as cli_main, serve as cli_serve
except BaseException as e:  # not vLLM's verdict on the command: no answer
    sys.stdout.write("\n" + MARK + json.dumps({"ok": False, "failed": f"cannot import vLLM's CLI ({type(e).__name__}: {e})"[:500]}) + "\n")
    sys.exit(0)
try:

    def construct(args):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        out["ok"] = True

    cli_serve.ServeSubcommand.cmd = staticmethod(construct)
    sys.argv = ["vllm", "serve", *json.loads(sys.argv[1])]
    cli_main.main()
    if not out["ok"] and "exc_type" not in out:
        out["failed"] = "vLLM's command line did not reach the config construction"
except SystemExit as e:  # argparse's refusal: its message is on stderr
    if not out["ok"]:
        out["exit"] = e.code if isinstance(e.code, int) else 1
except BaseException as e:
    out.update(exc_type=type(e).__name__, message=str(e)[:4000])
try:
    from vllm.platforms import current_platform
    out["device"] = str(current_platform.device_type)
except BaseException:
    pass
sys.stdout.write("\n" + MARK + json.dumps(out) + "\n")
""".replace("MARK", repr(MARK))


@dataclass
class Answer:
    """What vLLM said of the command: it accepts it (ok), or refuses it with its own message."""

    python: str
    ok: bool
    version: str | None = None
    device: str | None = None  # vLLM's current_platform.device_type: cpu, cuda, rocm, ...
    exc_type: str | None = None  # the refusal's exception; "usage" for argparse's
    message: str | None = None
    site: str | None = None  # where its package is: its files are read as text (the model registry)
    failed: str | None = None  # no answer: why (timeout, a crash, vLLM not importable)

    @property
    def said(self) -> str:
        """One line for the report: which vLLM answered, and how."""
        who = f"vLLM {self.version or '?'} ({self.device or 'platform ?'}, {self.python})"
        if self.failed:
            return f"asked {who}: no answer ({self.failed})"
        return f"asked {who}: " + ("accepts the configuration" if self.ok else f"refuses it: {self.message}")


def python_of(vllm_bin: str | None = None) -> str | None:
    """vLLM's interpreter: the `vllm` executable's shebang, else this Python when it has vllm."""
    path = vllm_bin or shutil.which("vllm")
    if path:
        try:
            with open(path, "rb") as f:
                first = f.readline(512)
        except OSError:
            first = b""
        if first.startswith(b"#!"):
            words = first[2:].decode("utf-8", "replace").split()
            if words and os.path.basename(words[0]).startswith("python") and Path(words[0]).is_file():
                return words[0]
    import importlib.util

    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def ask(argv: list[str], python: str, offline: bool = False, timeout: float = TIMEOUT) -> Answer:
    """vLLM's own verdict on `vllm serve ARGV` (in a subprocess of `python`, bounded in time)."""
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR", PYTHONUNBUFFERED="1")
    if offline:
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    try:
        p = subprocess.run([python, "-c", SCRIPT, json.dumps(argv)], capture_output=True, env=env, timeout=timeout,
                           stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        return Answer(python, False, failed=f"no answer within {timeout:g} s")
    except OSError as e:
        return Answer(python, False, failed=f"cannot run {python}: {e.strerror or e}")
    out = p.stdout.decode("utf-8", "replace")
    line = next((x for x in reversed(out.splitlines()) if x.startswith(MARK)), None)
    if line is None:
        tail = p.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {p.returncode}"]
        return Answer(python, False, failed=f"vLLM's Python ended without an answer: {tail[0][:300]}")
    data = json.loads(line[len(MARK) :])
    answer = Answer(python, bool(data.get("ok")), data.get("version"), data.get("device"), data.get("exc_type"),
                    data.get("message"), data.get("site"), data.get("failed"))  # fmt: skip
    if "exit" in data and not answer.ok:  # argparse: "vllm serve: error: argument --dtype: invalid choice: ..."
        errors = [x for x in p.stderr.decode("utf-8", "replace").splitlines() if ": error: " in x]
        answer.exc_type = "usage"
        answer.message = errors[-1].split(": error: ", 1)[1] if errors else f"exit status {data['exit']}"
    return answer


def vllm_config(ctx: Context) -> list[Finding]:
    """The check: vLLM's own parser and config construction, where vLLM is installed and asked."""
    from vllm_doctor.preflight.finding import CannotRun

    answer = ctx.vllm_answer
    if answer is None:
        raise CannotRun("vLLM is not installed here (no `vllm` on PATH, none importable): the checks below answer alone"
                        if ctx.ask_vllm else "not asked (--no-ask-vllm, or serve's preflight: vLLM answers at its start)")  # fmt: skip
    if answer.failed:
        raise CannotRun(answer.said)
    return findings(answer)


def findings(answer: Answer) -> list[Finding]:
    """vLLM's refusal as the start's first blocker: named as explain names the same message at the
    end of a failed start (a hand rule, else the atlas), its fixes with it; argparse's refusal as
    the argument it names. None where vLLM accepts the command."""
    from vllm_doctor.preflight.finding import Finding, Fix, found

    if answer.ok or answer.failed or not answer.message:
        return []
    message = " ".join(answer.message.split())
    who = {"vllm": f"vLLM {answer.version or ''}".strip()}
    if answer.exc_type == "usage":
        return [found("check-vllm-refuses-arguments", who, message=message)]
    top = _explained(answer)
    base = found("check-vllm-refuses", who, message=message, exc_type=answer.exc_type or "error")
    if top is None:
        return [base]
    fixes = [Fix(f.action, f.why, f.flag, f.value) for f in top.fixes] or base.fixes
    return [Finding(top.category, "blocker", top.title, f"{base.summary} {top.summary}", dict(top.numbers), fixes,
                    top.confidence, priority=base.priority, rule=base.rule)]  # fmt: skip


def _explained(answer: Answer):
    """explain's diagnosis of the refusal as vLLM prints it at the end of a failed start."""
    import tempfile

    from vllm_doctor.knowledge.checks import Options
    from vllm_doctor.pipeline import explain

    lines = [
        f"(APIServer pid=1) INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version {answer.version or ''}",
        "(APIServer pid=1) ERROR 01-01 00:00:01 [serve.py:1] Traceback (most recent call last):",
        '(APIServer pid=1) ERROR 01-01 00:00:01 [serve.py:1]   File "/vllm/engine/arg_utils.py", line 1, in create_engine_config',
        *(f"(APIServer pid=1) ERROR 01-01 00:00:01 [serve.py:1] {x}" for x in
          f"{answer.exc_type}: {answer.message}".splitlines()),
    ]  # fmt: skip
    with tempfile.NamedTemporaryFile("w", suffix=".log", prefix="vllm-doctor-oracle-") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        report = explain([f.name], options=Options(lookup_model=False))
    return next((d for d in report.diagnoses if d.severity == "blocker" and d.category != "unrecognised-failure"), None)
