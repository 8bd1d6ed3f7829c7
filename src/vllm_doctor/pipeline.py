"""Every Report is built here, whatever the input: log files (explain, and serve's capture) or
/metrics scrapes (explain --metrics, watch). The stages run in the order of the tree:
read -> matching -> knowledge (facts, checks, diagnoses) with capacity's model and GPU numbers.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_doctor.data import CONCURRENCY_KEYS, MODEL_SHAPE_KEYS, Diagnosis, Life, Match, Report, Rule
from vllm_doctor.facts import Facts
from vllm_doctor.knowledge import rulebook
from vllm_doctor.knowledge.checks import DEFAULT_BLOCK_SIZE, CheckInput, Options, concurrency_budget
from vllm_doctor.knowledge.command import corrected
from vllm_doctor.knowledge.diagnose import diagnose
from vllm_doctor.knowledge.lifetimes import Lifetime, Lifetimes, crash_loop, ending, from_this_host
from vllm_doctor.matching.engine import Engine
from vllm_doctor.read import logread
from vllm_doctor.read.budget import Budget

if TYPE_CHECKING:
    from vllm_doctor.read.metrics import Scrape


def explain(paths: list[str], rules: list[Rule] | None = None, options: Options | None = None,
            budget: Budget | None = None) -> Report:  # fmt: skip
    """Read the logs, split them into server lifetimes, and diagnose each alone. The report leads
    with the latest lifetime (or options.lifetime) and lists them all. Raises logread.ReadError
    for unreadable input. With a budget, a file too large to read in time is read at its start
    and its end (a warning says which lines were not read)."""
    rules = rules if rules is not None else rulebook.load()
    engine = Engine(rules)
    stats = logread.ReadStats()
    router = Lifetimes()
    engine.run(logread.read(paths, engine.prefilter, stats, budget), Facts(), router)
    warnings = list(stats.warnings)
    options = _with_gpu(options or Options())
    found = router.lives()
    this_host = options.this_host if options.this_host is not None else from_this_host(found, options.gpu_snapshot)
    options = replace(options, this_host=this_host)
    common: dict[str, Any] = {"paths": list(paths), "lines": stats.lines, "warnings": warnings}
    if not found:
        report = build(rules, Facts(), {}, options, recognised=False, **common)
        report.empty = stats.bytes == 0
        return report
    memo: dict[tuple, tuple[Options, str | None]] = {}
    lives = [_life(rules, life, options, memo, common) for life in found]
    chosen = options.lifetime if options.lifetime and 1 <= options.lifetime <= len(lives) else _worst(found, lives)
    report = replace(lives[chosen - 1].report, lifetimes=lives, shown=chosen)
    space = lives[chosen - 1].space  # the shown server's starts only: another server's failures are not its loop
    report.crash_loop = crash_loop([x.outcome if x.end == "fatal" and x.space == space else None for x in lives])
    return report


_WORST = {"failed": 0, "degraded": 1, "unknown": 2, "healthy": 3}


def _worst(found: list[Lifetime], lives: list[Life]) -> int:
    """The lifetime the report leads with: the latest one; of several servers (several inputs
    that are not one process), the worst of each one's latest, the later on a tie."""
    latest = {life.space: life.index for life in found}  # each server's last start
    return min(latest.values(), key=lambda i: (_WORST.get(lives[i - 1].report.status, 2), -i))


def _life(rules: list[Rule], life: Lifetime, options: Options, memo: dict, common: dict[str, Any]) -> Life:
    """One lifetime diagnosed alone, and how it ended."""
    report = build(rules, life.facts, life.matches, options, recognised=True, life=life, memo=memo, **common)
    top = next((d for d in report.diagnoses if d.severity != "info"), None)
    end = ending(life, report.status, top.category if top else None)
    named = life.container, f"pid {life.owner}" if life.owner is not None else None
    server = " ".join(x for x in named if x)
    if len({p for p in common["paths"]}) > 1:  # several inputs: each server is named by its file
        server = " ".join(x for x in (Path(common["paths"][life.space]).name, server) if x)
    return Life(
        index=life.index,
        started=life.started,
        ended=life.ended,
        ready=end.ready,
        ready_at=life.ready_at,
        last_phase=end.last_phase,
        end=end.end,
        outcome=end.outcome,
        note=end.note,
        last_stats=end.last_stats,
        lines=((life.first or (0, 0))[1], (life.last or (0, 0))[1]),
        server=server or None,
        report=report,
        sources=((life.first or (0, 0))[0], (life.last or (0, 0))[0]),
        space=life.space,
    )


def from_metrics(
    scrapes: list[Scrape],
    rules: list[Rule] | None = None,
    options: Options | None = None,
    fleet: list | None = None,
    facts: Facts | None = None,
) -> Report:
    """The same report for one /metrics scrape or a series: the scrapes fill the stats series that
    a log's stats lines would, and the same rules decide. `fleet`: every replica's numbers, when
    this series is one replica of several (cli/fleet.py); `facts`: the scrapes' (to_facts), when read already."""
    from vllm_doctor.read import metrics

    if not scrapes:
        raise metrics.MetricsError("no scrape to diagnose")
    from vllm_doctor.capacity.gpu import skipped

    # a scrape may come from any host: this machine's GPUs say nothing about that server
    options = replace(options or Options(), gpu_snapshot=skipped("not taken for a /metrics scrape"))
    facts = facts or metrics.to_facts(scrapes)
    if fleet:
        facts.window["fleet"] = fleet
    report = build(
        rules if rules is not None else rulebook.load(),
        facts,
        {},
        options,
        paths=metrics.sources(scrapes),
        lines=sum(s.lines for s in scrapes),
        warnings=metrics.warnings(scrapes[-1]),
        recognised=bool(scrapes[-1].vllm_series),
        extra={"metrics": metrics.summary(scrapes)},
    )
    if report.status == "healthy" and any(s.skipped for s in scrapes):  # cut: what was not read may be the problem
        report.status = "unknown"
    return report


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
    life: Lifetime | None = None,
    memo: dict | None = None,
) -> Report:
    """The one place a Report is assembled: derived facts, the model and GPU, the diagnoses, the
    concurrency budget, the model's facts, the status. `recognised`: the input was vLLM's at all;
    `life`: the server lifetime these facts are of (a log's), None for a /metrics scrape.

    This machine's GPU snapshot informs the checks only when the log is from this machine
    (options.this_host); otherwise it is shown as this machine's, and the fixes use the log alone."""
    _derive(facts)
    options, model_note = _with_model(facts, options or Options(), memo if memo is not None else {})
    local = options if options.this_host is not False else replace(options, gpu_snapshot=None)
    diagnoses = diagnose(rules, matches, facts, local)
    report_facts = facts.to_json()
    budget = concurrency_budget(CheckInput(facts.flat(), facts, None, local)).values
    report_facts["concurrency"] = {**dict.fromkeys(CONCURRENCY_KEYS), **budget}  # report/1: always there
    report_facts.update(model_facts(facts, local, model_note))
    report_facts["gpu"] = _gpu_json(options)
    report_facts.update(extra or {})
    return Report(
        paths=paths,
        lines=lines,
        status=status(diagnoses, recognised, life),
        diagnoses=diagnoses,
        facts=report_facts,
        warnings=warnings + few_samples(diagnoses),
        corrected=corrected(facts, diagnoses, local.shape),
        series=facts.stats.points,
    )


def whole_evidence(report: Report) -> Report:
    """`-v`: the evidence lines cut at EVIDENCE_CHARS, whole again from the files they came
    from (read/wholelines.py); stdin's stay cut (and flagged truncated)."""
    from vllm_doctor.read.wholelines import whole

    cut = [e for d in report.diagnoses for e in (*d.evidence, *d.context) if e.truncated]
    for source, path in enumerate(report.paths):
        found = whole(path, {e.line for e in cut if e.source == source})
        for e in cut:
            if e.source == source and e.line in found and len(found[e.line]) >= len(e.text):
                e.text, e.truncated = found[e.line], False
    return report


_QUANTILE = re.compile(r"(?P<metric>\w+?)_p(?P<q>\d{2})(?:_(?P<unit>ms|s))?\Z")
FEW = 2  # a quantile set by this many samples or fewer says little beyond "the slowest was"


def few_samples(diagnoses: list[Diagnosis]) -> list[str]:
    """A caveat for each quantile a diagnosis states from too few samples to hold it: a p95 of 8
    first tokens is the slowest one alone ("TTFT p95 128000 ms rests on 1 of 8 samples")."""
    out: list[str] = []
    for d in diagnoses:
        for name, value in d.numbers.items():
            m = _QUANTILE.match(name)
            count = d.numbers.get(f"{m['metric']}_count") if m else None
            if m is None or not isinstance(count, int) or count <= 0 or not isinstance(value, (int, float)):
                continue
            above = count - math.ceil(int(m["q"]) / 100 * count) + 1  # the samples at or above its rank
            metric = m["metric"].upper() if len(m["metric"]) <= 4 else m["metric"].replace("_", " ")
            line = f"{metric} p{m['q']} {value:g}{' ' + m['unit'] if m['unit'] else ''}"
            if above <= FEW and not any(o.startswith(line) for o in out):
                slowest = "one was" if above == 1 else f"{above} were"
                out.append(
                    f"{line} rests on {above} of {count} samples: too few for a p{m['q']}; it says how slow "
                    f"the slowest {slowest}, not what most requests see"
                )
    return out


def _with_gpu(options: Options) -> Options:
    """This machine's GPU snapshot, taken once (or the caller's: serve, tests with a fake NVML adapter)."""
    if options.gpu_snapshot is not None:
        return options
    if options.gpu:
        from vllm_doctor.capacity.gpu import snapshot

        return replace(options, gpu_snapshot=snapshot())
    from vllm_doctor.capacity.gpu import skipped

    return replace(options, gpu_snapshot=skipped("not requested (--no-gpu)"))


def _with_model(facts: Facts, options: Options, memo: dict) -> tuple[Options, str | None]:
    """The model's shape, looked up once per model and version however many lifetimes name it."""
    key = (options.model, options.config, facts.get("model"), facts.get("vllm_version"))
    if key not in memo:
        memo[key] = _model_shape(facts, options)
    shape, note = memo[key]
    if shape is not None and facts.get("model"):
        shape = replace(shape, name=facts.get("model"))  # the model the log served; shape.source says where
    return replace(_with_gpu(options), shape=shape), note


def _model_shape(facts: Facts, options: Options) -> tuple[Any, str | None]:
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
    else:
        note = "not looked up (pass --model ID|PATH or --config FILE)"
    return shape, note


def unread(paths: list[str], options: Options) -> Report:
    """The one empty Report: an input not diagnosed at all (serve's output when its diagnosis
    failed), every key of report/1 there, null or empty, and no rule run."""
    facts = Facts()
    report_facts = facts.to_json()
    report_facts["concurrency"] = dict.fromkeys(CONCURRENCY_KEYS)
    report_facts.update(model_facts(facts, options, None))
    report_facts["gpu"] = _gpu_json(options)
    return Report(paths=paths, lines=0, status="unknown", diagnoses=[], facts=report_facts)


def model_facts(facts: Facts, options: Options, model_note: str | None) -> dict:
    """facts.model_shape and facts.capacity of the report (facts.gpu is build's, _gpu_json).

    facts.model stays the model's name, as report/1 has it; its shape goes beside it."""
    from vllm_doctor.knowledge.crosscheck import cross_check

    inp = CheckInput(facts.flat(), facts, None, options)
    shape = options.shape
    if shape is not None:
        from vllm_doctor.capacity import arithmetic as cap

        element, _ = cap.kv_element_bytes(inp.get("kv_cache_dtype"), cap.serving_dtype(inp.get("dtype"), shape.dtype))
        model = shape.to_json(cap.kv_bytes_per_token(shape, element, 1))
        model["note"] = model_note
    else:
        model = dict.fromkeys(MODEL_SHAPE_KEYS)
        model["name"] = options.model or facts.get("model")
        model["note"] = model_note
    return {"model_shape": model, "capacity": cross_check(inp, model_note).to_json()}


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
    # the memory profile states the weights and the cache too (V0's summary, V1's DEBUG line)
    for fact, stated in (("weights_gib", "memory.weights_gib"), ("kv_cache.available_gib", "memory.kv_gib")):
        if facts.get(fact) is None and facts.get(stated) is not None:
            facts.set(fact, facts.get(stated), facts.where.get(stated, 0))


def status(diagnoses: list[Diagnosis], recognised: bool, life: Lifetime | None = None) -> str:
    """The report's status; `recognised` when the input was vLLM's at all. A log's lifetime is
    healthy only when it became ready (or served): a start that stops with no sign of why is unknown."""
    severities = {d.severity for d in diagnoses}
    if "blocker" in severities:
        return "failed"
    if "warning" in severities:
        return "degraded"
    if not recognised or (life is not None and not life.ready):
        return "unknown"
    return "healthy"


def _gpu_json(options: Options) -> dict[str, Any]:
    """facts.gpu: this machine's snapshot, and whether it is the log's machine (then it informed the fixes)."""
    snap = options.gpu_snapshot
    out = snap.to_json() if snap is not None else {"available": False, "reason": None, "devices": []}
    out["this_host"] = options.this_host
    return out


def _exists(path: str) -> bool:
    """Whether a name from the log is a path here; a damaged log's name may be no path at all."""
    try:
        return Path(path).expanduser().exists()
    except (OSError, RuntimeError, ValueError):  # too long, ~nosuchuser, a NUL
        return False
