"""Every Report is built here, whatever the input: log files (explain, and serve's capture) or
/metrics scrapes (explain --metrics, watch). The stages run in the order of the tree:
read -> matching -> knowledge (facts, checks, diagnoses) with capacity's model and GPU numbers.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_doctor.data import MODEL_SHAPE_KEYS, Diagnosis, Match, Report, Rule
from vllm_doctor.knowledge.checks import DEFAULT_BLOCK_SIZE, CheckInput, Options, concurrency_budget
from vllm_doctor.knowledge.diagnose import diagnose
from vllm_doctor.knowledge.facts import Facts
from vllm_doctor.matching import loader
from vllm_doctor.matching.engine import Engine
from vllm_doctor.read import logread

if TYPE_CHECKING:
    from vllm_doctor.read.metrics import Scrape


def explain(paths: list[str], rules: list[Rule] | None = None, options: Options | None = None) -> Report:
    """Read the logs, match the rules, and diagnose. Raises logread.ReadError for unreadable input."""
    rules = rules if rules is not None else loader.load()
    engine = Engine(rules)
    stats = logread.ReadStats()
    facts = Facts()
    matches = engine.run(logread.read(paths, engine.prefilter, stats), facts)
    warnings = list(stats.warnings)
    if engine.skipped:
        slow = ", ".join(f"{rule} ({n})" for rule, n in sorted(engine.skipped.items()))
        warnings.append(f"rules that hit the regex time limit skipped those lines only (lines skipped): {slow}")
    recognised = bool(facts.values or facts.stats.samples or matches)
    return build(rules, facts, matches, options, paths=list(paths), lines=stats.lines, warnings=warnings,
                 recognised=recognised)  # fmt: skip


def from_metrics(scrapes: list[Scrape], rules: list[Rule] | None = None, options: Options | None = None) -> Report:
    """The same report for one /metrics scrape or a series: the scrapes fill the stats series that
    a log's stats lines would, and the same rules decide."""
    from vllm_doctor.read import metrics

    if not scrapes:
        raise metrics.MetricsError("no scrape to diagnose")
    from vllm_doctor.capacity.gpu import skipped

    # a scrape may come from any host: this machine's GPUs say nothing about that server
    options = replace(options or Options(), gpu_snapshot=skipped("not taken for a /metrics scrape"))
    return build(
        rules if rules is not None else loader.load(),
        metrics.to_facts(scrapes),
        {},
        options,
        paths=sorted({s.source for s in scrapes}),
        lines=sum(s.lines for s in scrapes),
        warnings=metrics.warnings(scrapes[-1]),
        recognised=bool(scrapes[-1].vllm_series),
        extra={"metrics": metrics.summary(scrapes)},
    )


def build(
    rules: list[Rule],
    facts: Facts,
    matches: dict[str, Match],
    options: Options | None,
    *,
    paths: list[str],
    lines: int,
    warnings: list[str],
    recognised: bool,
    extra: dict[str, Any] | None = None,
) -> Report:
    """The one place a Report is assembled: derived facts, the model and GPU, the diagnoses, the
    concurrency budget, the model's facts, the status. `recognised`: the input was vLLM's at all."""
    _derive(facts)
    options, model_note = with_model_and_gpu(facts, options or Options())
    diagnoses = diagnose(rules, matches, facts, options)
    report_facts = facts.to_json()
    budget = concurrency_budget(CheckInput(facts.flat(), facts, None, options)).values
    if budget:
        report_facts["concurrency"] = budget
    report_facts.update(model_facts(facts, options, model_note))
    report_facts.update(extra or {})
    return Report(
        paths=paths,
        lines=lines,
        status=status(diagnoses, recognised),
        diagnoses=diagnoses,
        facts=report_facts,
        warnings=warnings,
    )


def with_model_and_gpu(facts: Facts, options: Options) -> tuple[Options, str | None]:
    """Options with the model's shape (from --config, --model, or the model the log names) and this
    machine's GPU snapshot filled in, and the one-line reason when there is no shape.
    Raises modelcfg.ConfigError only for an explicit --config that cannot be read."""
    shape, note = None, None
    ref = options.model or (facts.get("model") if options.lookup_model or options.config else None)
    from_log = not options.model and not options.config
    if from_log and ref and "/" not in ref and not _exists(ref):
        # a bare word from the log is likelier a misread line than a repo id: no Hub request for it
        note = f"{ref!r} (the log's model name) is not a repo id (org/name) or a local path; pass --model or --config"
    elif from_log and ref and ref.startswith(("/", "./", "../", "~")) and not _exists(ref):
        note = f"{ref} (the log's model path) is not on this machine; pass --model or --config"
    elif options.config or options.model or options.lookup_model:
        from vllm_doctor.capacity import modelcfg

        shape, note = modelcfg.load(ref, options.config, options.offline, facts.get("vllm_version"))
        if shape is not None and facts.get("model"):
            shape.name = facts.get("model")  # the model the log served; shape.source says where its config came from
    else:
        note = "not looked up (pass --model ID|PATH or --config FILE)"
    if options.gpu_snapshot is not None:
        gpu = options.gpu_snapshot  # taken by the caller (serve, tests with a fake NVML adapter)
    elif options.gpu:
        from vllm_doctor.capacity.gpu import snapshot

        gpu = snapshot()
    else:
        from vllm_doctor.capacity.gpu import skipped

        gpu = skipped("not requested (--no-gpu)")
    return replace(options, shape=shape, gpu_snapshot=gpu), note


def model_facts(facts: Facts, options: Options, model_note: str | None) -> dict:
    """facts.model_shape, facts.capacity and facts.gpu of the report.

    facts.model stays the model's name, as report/1 has it; its shape goes beside it."""
    from vllm_doctor.knowledge.checks import model_kv
    from vllm_doctor.knowledge.crosscheck import cross_check

    inp = CheckInput(facts.flat(), facts, None, options)
    shape = options.shape
    if shape is not None:
        from vllm_doctor.capacity import arithmetic as cap

        known = model_kv(inp)
        model = shape.to_json(cap.kv_bytes_per_token(shape, known[1], 1) if known else None)
        model["note"] = model_note
    else:
        model = dict.fromkeys(MODEL_SHAPE_KEYS)
        model["name"] = options.model or facts.get("model")
        model["note"] = model_note
    gpu = (
        options.gpu_snapshot.to_json() if options.gpu_snapshot else {"available": False, "reason": None, "devices": []}
    )
    return {"model_shape": model, "capacity": cross_check(inp, model_note).to_json(), "gpu": gpu}


def _derive(facts: Facts) -> None:
    """Facts that follow from others: KV tokens from blocks when vLLM printed only blocks
    (V0), at vLLM's default block size when the log does not give one."""
    blocks = facts.get("kv_cache.gpu_blocks")
    if facts.get("kv_cache.tokens") is None and blocks is not None:
        size = facts.get("kv_cache.block_size")
        where = facts.where.get("kv_cache.gpu_blocks", 0)
        facts.set("kv_cache.tokens", blocks * (size or DEFAULT_BLOCK_SIZE), where)
        facts.set("kv_cache.tokens_from", "blocks x block_size" if size else "blocks x default block_size 16", where)
    elif facts.get("kv_cache.tokens") is not None:
        facts.set_default("kv_cache.tokens_from", "log")


def status(diagnoses: list[Diagnosis], recognised: bool) -> str:
    """The report's status; `recognised` when the input was vLLM's at all."""
    severities = {d.severity for d in diagnoses}
    if "blocker" in severities:
        return "failed"
    if "warning" in severities:
        return "degraded"
    return "healthy" if recognised else "unknown"


def _exists(path: str) -> bool:
    """Whether a name from the log is a path here; a damaged log's name may be no path at all."""
    try:
        return Path(path).expanduser().exists()
    except (OSError, RuntimeError, ValueError):  # too long, ~nosuchuser, a NUL
        return False
