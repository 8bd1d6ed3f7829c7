"""What shapes a run besides its flags, said wherever the run is seen: each setting in force from a
config file or a VLLM_DOCTOR_* variable (settings.py), and each --rules directory with the rules it
added and the built-in ones it replaced (matching/loader.py). A file planted beside a log cannot
change a diagnosis unannounced: one line per source on stderr when a command starts, the same as
a note in every report format, and the JSON's `settings` list."""

from __future__ import annotations

from typing import Any

import typer

from vllm_doctor.data import Report, Rule


def in_force(ctx: Any) -> list[dict[str, Any]]:
    """The settings of this command that came from the config file or a variable, not a flag or the
    built-in default: [{"kind": "file" | "variable", "source": path or name, "keys": [...]}]."""
    from vllm_doctor.cli import settings

    keys = {settings.PARAM.get(k, k).replace("-", "_"): k for k in settings.KEYS}
    files: list[str] = []
    variables: dict[str, list[str]] = {}
    for p in ctx.command.params:
        key, given = keys.get(p.name or ""), ctx.get_parameter_source(p.name)
        if key is None or given is None or ctx.params.get(p.name) in (None, [], ()):
            continue
        if given.name == "DEFAULT_MAP" and settings.loaded is not None:
            files.append(key)
        elif given.name == "ENVIRONMENT":
            variables.setdefault(settings.KEYS[key][0], []).append(key)
    out = [{"kind": "file", "source": str(settings.loaded), "keys": files}] if files else []
    return out + [{"kind": "variable", "source": name, "keys": ks} for name, ks in variables.items()]


def rule_sources(rules: list[Rule]) -> list[dict[str, Any]]:
    """Each --rules directory that added a rule: its rules, and each earlier rule one replaced."""
    out: dict[str, dict[str, Any]] = {}
    for r in rules:
        if r.source is None:
            continue
        entry = out.setdefault(r.source, {"kind": "rules", "source": r.source, "rules": [], "replaced": []})
        entry["rules"].append(r.id)
        if r.replaces is not None:
            entry["replaced"].append({"id": r.replaces, "by": r.path, "was": r.replaced})
    return list(out.values())


def line(source: dict[str, Any]) -> str:
    """One source as its stderr line and its note in the report."""
    if source["kind"] != "rules":
        return f"settings from {source['source']} ({', '.join(source['keys'])})"
    n = len(source["rules"])
    text = f"rules from {source['source']} ({n} rule{'s' if n != 1 else ''}"
    if source["replaced"]:
        text += "; replacing " + ", ".join(r["id"] for r in source["replaced"])
    return text + ")"


def announce(ctx: Any) -> None:
    """The settings in force, on stderr as the command starts (kept for the report: stamp)."""
    found = in_force(ctx)
    ctx.meta["settings"] = found
    for source in found:
        typer.echo(f"vllm-doctor: {line(source)}", err=True)


def announce_rules(rules: list[Rule]) -> None:
    for source in rule_sources(rules):
        typer.echo(f"vllm-doctor: {line(source)}", err=True)


def stamp(report: Report, ctx: Any, rules: list[Rule]) -> Report:
    """The report names what shaped it: a note each (every format) and the JSON's `settings`."""
    found = list(ctx.meta.get("settings") or []) + rule_sources(rules)
    report.settings = found
    report.warnings = report.warnings + [line(s) for s in found]
    return report
