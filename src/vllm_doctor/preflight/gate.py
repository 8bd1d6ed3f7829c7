"""What `serve --preflight` does before it spawns vLLM: warn prints the blockers and warnings on
stderr and starts anyway; strict refuses a start with a blocker (exit 1, vLLM never spawned);
off skips the checks. A bug in a check never stops a start in warn mode."""

from __future__ import annotations

import sys
from typing import IO

from vllm_doctor.render.visible import visible

TAG = "[vllm-doctor] preflight"
MODES = ("warn", "strict", "off")


def lines(report) -> list[str]:
    """The headline, then one line per blocker and warning with its first fix; masked as
    `check` masks its report (a password in a model URL, a token)."""
    from vllm_doctor.render.redact import report as masked

    report = masked(report)
    out = [f"{TAG}: {report.facts['preflight']['headline']}"]
    for d in report.diagnoses:
        if d.severity == "info":
            continue
        fix = f" First fix: {d.fixes[0].action}." if d.fixes else ""
        out.append(f"{TAG} {d.severity}: {d.category} ({d.rule}): {d.summary}{fix}")
    return out


def before_serve(vllm_args: list[str], mode: str, err: IO[str] | None = None) -> int | None:
    """None: go on and start vLLM; an exit status: do not start it."""
    if mode == "off":
        return None
    err = err or sys.stderr
    try:
        from vllm_doctor.preflight.args import parse
        from vllm_doctor.preflight.run import preflight

        # warn never waits on the network before the server starts (an air-gapped host would stall
        # the start on the Hub's timeouts): the HF cache only; strict, which may refuse, asks the Hub
        report = preflight(parse(vllm_args), offline=mode != "strict")
    except Exception as e:  # noqa: BLE001 - the server matters more than the preflight
        from vllm_doctor.render.redact import redact

        print(visible(redact(f"{TAG}: could not run ({type(e).__name__}: {e}); starting anyway")), file=err, flush=True)
        return None
    said = lines(report)
    for line in said if len(said) > 1 else []:  # quiet when there is nothing to fix
        print(visible(line), file=err, flush=True)  # the model path and arguments: escapes, not commands
    if mode == "strict" and report.status == "failed":
        print(f"{TAG}: --preflight strict: not starting vLLM (fix the blocker, or --preflight warn)", file=err,
              flush=True)  # fmt: skip
        return 1
    return None
