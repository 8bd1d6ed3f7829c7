"""Run the checks over one start and turn their findings into a Report the renderers show
(text, markdown, json) with explain's exit codes: the first blocker is the failure the start would
stop at, a check that cannot run is one line and the rest go on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.data import Diagnosis, FixOut, Report
from vllm_doctor.errors import DoctorError
from vllm_doctor.preflight.args import ServeArgs
from vllm_doctor.preflight.checks import AREAS, BY_NAME, CHECKS
from vllm_doctor.preflight.context import Context
from vllm_doctor.preflight.finding import CannotRun, Finding, rules
from vllm_doctor.render.redact import MASK, is_secret_name

RANK = {"blocker": 0, "warning": 1, "info": 2}
DECIDING = "fit"  # without it, a start with no blocker is unknown, not ready


@dataclass
class Outcome:
    findings: list[Finding] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # check -> why it could not run
    ran: list[str] = field(default_factory=list)
    only: bool = False  # --only: some checks, not the whole preflight


def run(ctx: Context, only: list[str] | None = None) -> Outcome:
    names = list(only or [c.name for c in CHECKS])
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise DoctorError(f"no check {unknown[0]!r}; `vllm-doctor check --list` names them")
    out = Outcome(only=bool(only))
    for name in names:
        try:
            found = BY_NAME[name].run(ctx)
        except CannotRun as e:
            out.skipped[name] = str(e)
            continue
        except DoctorError:
            raise
        except Exception as e:  # noqa: BLE001 - a bug in one check must not hide the others
            out.skipped[name] = f"internal error: {type(e).__name__}: {e}"
            continue
        out.ran.append(name)
        for f in found:
            f.check = name
            out.findings.append(f)
    out.findings.sort(key=lambda f: (RANK[f.severity], -f.priority))
    return out


def status(outcome: Outcome) -> str:
    severities = {f.severity for f in outcome.findings}
    if "blocker" in severities:
        return "failed"
    if DECIDING in outcome.skipped:
        return "unknown"
    return "degraded" if "warning" in severities else "healthy"


def headline(outcome: Outcome) -> str:
    top = outcome.findings[0] if outcome.findings else None
    state = status(outcome)
    if state == "failed" and top is not None:
        return f"would fail: {top.category} (blocker, at {top.check})"
    if state == "unknown":
        return f"unknown: {DECIDING} could not run ({outcome.skipped[DECIDING]})"
    if state == "degraded" and top is not None:
        return f"would start, with a warning: {top.category}"
    if outcome.only:
        return f"no blocker found by {', '.join(outcome.ran) or 'no check'} (--only)"
    return "ready to start: no blocker found"


STATES = ("blocker", "warning", "passed", "skipped")  # the worst first: it marks an area


def areas(outcome: Outcome) -> list[dict[str, Any]]:
    """The checks run or tried, by area in AREAS' order: each one passed (an info finding is a pass),
    its worst finding's severity, or skipped (it could not run); the area's state, the worst of
    them (skipped where the fit could not run: it decides a start). Text draws a line per area."""
    worst: dict[str, str] = {}
    for f in outcome.findings:  # sorted: the first finding of a check is its worst
        worst.setdefault(f.check, f.severity)
    by_area: dict[str, list[dict[str, str]]] = {}
    for c in CHECKS:
        if c.name in outcome.skipped:
            state = "skipped"
        elif c.name in outcome.ran:
            state = worst.get(c.name, "passed").replace("info", "passed")
        else:
            continue  # not asked (--only)
        by_area.setdefault(c.area, []).append({"check": c.name, "state": state})
    order = [*AREAS.values(), "other"]
    return [{"area": a, "state": _state(by_area[a]), "checks": by_area[a]} for a in sorted(by_area, key=order.index)]


def _state(checks: list[dict[str, str]]) -> str:
    worst = next(s for s in STATES if any(c["state"] == s for c in checks))
    if worst == "passed" and any(c["check"] == DECIDING and c["state"] == "skipped" for c in checks):
        return "skipped"  # what passed beside the fit does not make its area a pass
    return worst


def _diagnosis(f: Finding) -> Diagnosis:
    fixes = [FixOut(i, x.action, x.flag, x.value, x.why) for i, x in enumerate(f.fixes, 1)]
    rule = rules().get(f.rule)  # `vllm-doctor rules show ID` documents it
    return Diagnosis(rule=f.rule, category=f.category, severity=f.severity,
                     confidence=f.confidence, title=f.title, summary=f.summary,
                     explanation=rule.explanation if rule else "", evidence=[], numbers=f.numbers, fixes=fixes,
                     priority=f.priority)  # fmt: skip


def report(args: ServeArgs, outcome: Outcome, ctx: Context | None = None) -> Report:
    pre: dict[str, Any] = {
        "command": args.command,
        "env": {k: MASK if is_secret_name(k) else v for k, v in args.env.items()},
        "headline": headline(outcome),
        "input": f"preflight of {args.command}" + (f" · backend {ctx.backend}" if ctx and ctx.backend else ""),
        "vllm": ctx.vllm_answer.said if ctx is not None and ctx.__dict__.get("vllm_answer") is not None else None,
        "ran": outcome.ran,
        "skipped": outcome.skipped,
    }
    facts: dict[str, Any] = {"preflight": pre, "model": args.model}
    if ctx is not None and ("snapshot" in ctx.__dict__):
        facts["gpu"] = ctx.snapshot.to_json()
    warnings = [f"check {name} could not run: {why}" for name, why in outcome.skipped.items()]
    return Report(paths=[args.command], lines=0, status=status(outcome),
                  diagnoses=[_diagnosis(f) for f in outcome.findings], facts=facts, warnings=warnings,
                  areas=areas(outcome))  # fmt: skip


def preflight(args: ServeArgs, nvml: Any = None, only: list[str] | None = None, offline: bool = False,
              no_gpu: bool = False, backend: str | None = None, ask_vllm: bool = False,
              vllm_bin: str | None = None) -> Report:  # fmt: skip
    """The whole check of one start, as a Report (ask_vllm: vLLM itself answers where installed)."""
    ctx = Context(args, nvml=nvml, offline=offline, no_gpu=no_gpu, backend=backend, ask_vllm=ask_vllm,
                  vllm_bin=vllm_bin)  # fmt: skip
    return report(args, run(ctx, only), ctx)
