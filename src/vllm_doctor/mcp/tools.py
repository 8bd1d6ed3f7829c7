"""The tools' work, without the SDK: each a thin call into the pipeline the CLI calls, answered as
(the verdict line, the document as the CLI's `--format json` prints it). Redaction is always on;
the network is never touched (offline model lookups) unless a URL passed the guard's prefixes."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from typing import Any

from vllm_doctor.mcp.guard import Guard, Refused, text_size

Answer = tuple[str, str]  # (verdict, JSON)


def explain(
    guard: Guard, paths: list[str] | None = None, text: str | None = None, config: str | None = None,
    target_concurrency: int | None = None, target_len: int | None = None, lifetime: int | None = None,
) -> Answer:  # fmt: skip
    """`vllm-doctor explain PATH... --format json --no-gpu`, or the same of log text."""
    from vllm_doctor import pipeline
    from vllm_doctor.knowledge.contract import Options
    from vllm_doctor.knowledge.rulebook import LOG_KINDS, load

    if bool(paths) == (text is not None):
        raise Refused("Give either paths (log files under the roots) or text (the log itself), one of them.")
    options = Options(target_concurrency, target_len, config=str(guard.file(config, "config")) if config else None,
                      offline=True, lookup_model=True, gpu=False, lifetime=lifetime)  # fmt: skip
    rules = load(kinds=LOG_KINDS)
    if text is not None:
        text_size(text)
        with tempfile.TemporaryDirectory(prefix="vllm-doctor-mcp-") as tmp:
            path = os.path.join(tmp, "log")
            with open(path, "w", encoding="utf-8", errors="surrogateescape", newline="") as f:
                f.write(text)
            report = replace(pipeline.explain([path], rules, options), paths=["<text>"])
    else:
        real = [str(guard.file(p)) for p in paths or []]
        report = replace(pipeline.explain(real, rules, options), paths=list(paths or []))
    return _report(report)


def check(argv: list[str], guard: Guard) -> Answer:
    """`vllm-doctor check --no-ask-vllm --no-gpu --offline -f json -- MODEL ARGS...`."""
    from vllm_doctor.preflight.args import parse
    from vllm_doctor.preflight.run import preflight

    if not argv:
        raise Refused("Give the vllm serve command line: the model, then its flags.")
    words = argv[1:] if argv[0] == "vllm" else argv
    args = parse(words)
    model = str(args.model or "")
    if model.startswith(("/", ".", "~")):  # a local model directory: under a root, as every file
        guard.directory(model)
    return _report(preflight(args, offline=True, no_gpu=True, ask_vllm=False))


def _report(report: Any) -> Answer:
    from vllm_doctor.render import render
    from vllm_doctor.render.summary import headline

    return headline(report), render(report, "json", redact=True)


PLAN_KEYS = ("params", "layers", "heads", "kv_heads", "head_dim", "dtype", "gpu_memory", "gpus", "utilization",
             "max_model_len", "tp", "kv_cache_dtype", "quantization", "target_concurrency", "block_size",
             "prompt_len", "kv_cache_memory", "device")  # fmt: skip


def plan(guard: Guard, config: str | None = None, **shape: Any) -> Answer:
    """`vllm-doctor plan --config FILE | --params ... --layers ... --no-gpu --offline -f json`."""
    from vllm_doctor.capacity import plan as planner
    from vllm_doctor.capacity.gpu import skipped
    from vllm_doctor.render.plan import json as plan_json

    given = {k: v for k, v in shape.items() if k in PLAN_KEYS and v is not None}
    if given.get("gpu_memory", "auto") == "auto":
        raise Refused("Give gpu_memory (e.g. 80GB or 80GiB): the server does not ask this machine's GPUs.")
    configs = [str(guard.file(config, "config"))] if config else []
    request = planner.PlanRequest(configs=configs, offline=True, **given)
    result = planner.make_plan(request, skipped("not asked over MCP"))
    return f"plan {'fits' if result.fits else 'does not fit'}", plan_json(result)


def rule_doc(rule_id: str) -> str:
    """`vllm-doctor rules show ID|CATEGORY`: the rule's documentation (the tool's, and a resource's)."""
    from vllm_doctor.knowledge.checks import CHECKS
    from vllm_doctor.knowledge.rulebook import load
    from vllm_doctor.matching.ruledoc import show

    every = load()
    if rule_id not in {r.id for r in every} | {r.category for r in every if r.category}:
        raise Refused(f"No rule or category is named {rule_id!r}; call rules without an id to list them.")
    return show(every, rule_id, CHECKS)


def rules(rule_id: str | None = None) -> Answer:
    """`vllm-doctor rules` (every rule) or `vllm-doctor rules show ID|CATEGORY`."""
    from vllm_doctor.knowledge.rulebook import load

    if rule_id:
        doc = rule_doc(rule_id)
        return f"{rule_id}: {doc.splitlines()[0] if doc else ''}", json.dumps({"id": rule_id, "doc": doc}, indent=2)
    every = load()
    listed = [{"id": r.id, "kind": r.kind, "category": r.category, "severity": r.severity, "title": r.title}
              for r in sorted(every, key=lambda r: (r.kind, r.category or "", r.id))]  # fmt: skip
    return f"{len(listed)} rules", json.dumps(listed, indent=2)


def metrics(guard: Guard, sources: list[str]) -> Answer:
    """`vllm-doctor explain --metrics SOURCE... -f json`: saved scrapes under a root, or allowed URLs."""
    from vllm_doctor import pipeline
    from vllm_doctor.knowledge.rulebook import LOG_KINDS, load
    from vllm_doctor.read.metrics import fetch, is_url

    if not sources:
        raise Refused("Give one or more /metrics URLs or saved scrape files.")
    checked = [guard.url(s) if is_url(s) else str(guard.file(s)) for s in sources]
    report = pipeline.from_metrics([fetch(s) for s in checked], load(kinds=LOG_KINDS))
    return _report(report)
