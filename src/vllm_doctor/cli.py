"""The command line: thin commands that parse options and call the library."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperGroup

from vllm_doctor.cliopts import (
    EndOpt,
    MetricsOpt,
    PrometheusOpt,
    SelectorOpt,
    SinceOpt,
    StartOpt,
    TpotBudget,
    TtftBudget,
)


class _Group(TyperGroup):
    """Bad input (a DoctorError from any stage) is one line on stderr and exit status 2."""

    def invoke(self, ctx: Any) -> Any:  # click.Context: vendored by typer 0.28, a dependency before
        from vllm_doctor.errors import DoctorError

        try:
            return super().invoke(ctx)
        except DoctorError as e:
            fail(str(e))


app = typer.Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Explain why vllm serve failed or queues requests: the cause, the numbers and the fixes in order. "
    "Exit status: 0 no blocker, 1 a blocker (--fail-on warning: a warning too), 2 usage error or unreadable "
    "input, 3 internal error, 4 unknown (no vLLM output, an empty input, or a start that stops with no sign of why).",
)
rules_app = typer.Typer(
    add_completion=False,
    invoke_without_command=True,
    rich_markup_mode=None,
    help="List, show and check the rules.",
)
app.add_typer(rules_app, name="rules")


class Format(str, Enum):
    text = "text"
    markdown = "markdown"
    json = "json"
    html = "html"


class Flavor(str, Enum):
    plain = "plain"
    github = "github"


class FailOn(str, Enum):
    warning = "warning"
    blocker = "blocker"


# options several commands share, declared once
RulesDirs = Annotated[list[Path], typer.Option("--rules", help="A directory of extra rules (repeatable).")]
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Output format.")]
OutputOpt = Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the output to this file.")]
FailOnOpt = Annotated[FailOn, typer.Option("--fail-on", help="Exit 1 from this severity up.")]
NoRedactOpt = Annotated[
    bool, typer.Option("--no-redact", help="Keep tokens, API keys and passwords (masked in every format by default).")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Text: print the verdict line only.")]
VerboseOpt = Annotated[
    bool, typer.Option("--verbose", "-v", help="Text: every reason, number and evidence line, the model, the GPUs.")
]
FlavorOpt = Annotated[
    Flavor, typer.Option("--flavor", help="Markdown: plain (GitHub, GitLab, Jira) or github (evidence in <details>).")
]
OfflineOpt = Annotated[bool, typer.Option("--offline", help="Never touch the network (the HF cache only).")]
TargetConcurrency = Annotated[
    Optional[int], typer.Option("--target-concurrency", min=1, help="Sequences the server must hold at once.")
]
# plan's KV budget: vLLM's own flags, instead of GPU memory x utilization
BlockSizeOpt = Annotated[Optional[int], typer.Option("--block-size", min=1, help="Tokens per KV block (16; CPU 128).")]
KvCacheMemoryOpt = Annotated[
    Optional[str], typer.Option("--kv-cache-memory-bytes", help="The KV space per GPU, as vLLM's flag (or 4GiB).")
]
CpuKvSpaceOpt = Annotated[
    Optional[str], typer.Option("--cpu-kvcache-space", help="VLLM_CPU_KVCACHE_SPACE: the CPU KV space, whole GiB.")
]


UNKNOWN_EXIT = 4  # no vLLM output, an empty input, a start that stops with no sign of why


def _exit_code(report, fail_on: FailOn) -> int:
    """1 when a diagnosis reaches the --fail-on severity, 4 when the status is unknown, else 0."""
    failing = {"blocker"} if fail_on is FailOn.blocker else {"blocker", "warning"}
    if {d.severity for d in report.diagnoses} & failing:
        return 1
    return UNKNOWN_EXIT if report.status == "unknown" else 0


def _verbosity(quiet: bool, verbose: bool) -> int:
    """-q -> -1 (the verdict line), -v -> 1 (everything), neither -> 0 (the answer)."""
    if quiet and verbose:
        fail("give -q or -v, not both")
    return -1 if quiet else int(verbose)


def _lifetime(value: str) -> int | None:
    """--lifetime last|all|N: the start the report leads with (None: the latest)."""
    if value in ("last", "all"):
        return None
    if value.isdigit() and int(value) >= 1:
        return int(value)
    fail(f"--lifetime {value}: give last, all or a start's number (1, 2, ...)")
    return None


def fail(message: str) -> None:
    """One clear line on stderr and exit status 2; never a traceback."""
    typer.echo(f"vllm-doctor: {message}", err=True)
    raise typer.Exit(2)


def _load_rules(extra: list[Path]):
    from vllm_doctor.matching.loader import load

    return load(extra)


@app.command()
def explain(
    paths: Annotated[
        Optional[list[str]],
        typer.Argument(help="Log files (.gz works too); - reads stdin.", metavar="LOG", show_default=False),
    ] = None,
    format: FormatOpt = Format.text,
    output: OutputOpt = None,
    rules_dirs: RulesDirs = [],  # noqa: B006 (typer reads the default; it is never mutated)
    fail_on: FailOnOpt = FailOn.blocker,
    target_concurrency: TargetConcurrency = None,
    target_len: Annotated[
        Optional[int], typer.Option("--target-len", min=1, help="Tokens per sequence for --target-concurrency.")
    ] = None,
    metrics: MetricsOpt = None,
    prometheus: PrometheusOpt = None,
    since: SinceOpt = None,
    start: StartOpt = None,
    end: EndOpt = None,
    selector: SelectorOpt = None,
    tpot_budget: TpotBudget = None,
    ttft_budget: TtftBudget = None,
    no_redact: NoRedactOpt = False,
    model: Annotated[
        Optional[str],
        typer.Option(
            "--model",
            help="The model's repo id or directory, for its config.json (default: the log's).",
            metavar="ID|PATH",
        ),
    ] = None,
    config: Annotated[
        Optional[str], typer.Option("--config", help="Use this config.json for the model.", metavar="FILE")
    ] = None,
    offline: OfflineOpt = False,
    no_gpu: Annotated[bool, typer.Option("--no-gpu", help="Skip the NVML snapshot of this machine's GPUs.")] = False,
    this_host: Annotated[
        bool,
        typer.Option(
            "--this-host",
            help="The log is from this machine: its GPUs now inform the fixes (else only when the log's "
            "hostname or GPU pids are this machine's).",
        ),
    ] = False,
    lifetime: Annotated[
        str,
        typer.Option(
            "--lifetime",
            help="A log with restarts: lead with the latest start (last), show every start (all), or start N.",
            metavar="last|all|N",
        ),
    ] = "last",
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    flavor: FlavorOpt = Flavor.plain,
) -> None:
    """Diagnose a vLLM log: the cause, the evidence, the numbers and the fixes in order.

    Exit status: 0 no blocker, 1 a blocker, 2 usage error or unreadable input, 3 internal error,
    4 unknown (no vLLM output, an empty input, or a start that stops with no sign of why)."""
    from vllm_doctor import pipeline
    from vllm_doctor.knowledge.checks import Options

    if (metrics or prometheus) and paths or metrics and prometheus:
        fail("give log files, --metrics URL or --prometheus URL, one of them")
    rules = _load_rules(rules_dirs)
    budgets: dict[str, Any] = {"tpot_budget_ms": tpot_budget, "ttft_budget_ms": ttft_budget}
    if metrics or prometheus:
        server = Options(target_concurrency, target_len, **budgets)
        from vllm_doctor.fleet import server_report

        report = server_report(metrics, prometheus, (since, start, end, selector), rules, server)
    elif paths:
        options = Options(target_concurrency, target_len, model=model, config=config, offline=offline,
                          lookup_model=True, gpu=not no_gpu, this_host=True if this_host else None,
                          lifetime=_lifetime(lifetime), **budgets)  # fmt: skip
        report = pipeline.explain(paths, rules, options)
        report.all_lifetimes = lifetime == "all"
        if options.lifetime and options.lifetime > len(report.lifetimes):
            fail(f"--lifetime {lifetime}: the input holds {len(report.lifetimes)} start(s)")
    else:
        fail("give a log file (- for stdin), --metrics URL or --prometheus URL")
    _emit(report, format, output, redact=not no_redact, verbosity=_verbosity(quiet, verbose), flavor=flavor)
    raise typer.Exit(_exit_code(report, fail_on))


def _emit(
    doc, format: Format, output: Path | None, redact: bool = True, done: str | None = None, verbosity: int = 0,
    flavor: Flavor = Flavor.plain,
) -> None:  # fmt: skip
    """Print `doc` (a Report or a Plan) in `format`, or write it to `output` and say so on stderr."""
    from vllm_doctor.data import Report
    from vllm_doctor.render import render

    if format is Format.text and output is None and isinstance(doc, Report):
        from vllm_doctor.render.text import show

        show(doc, redact=redact, verbosity=verbosity)  # in colour where the terminal takes it
        return
    text = render(doc, format.value, redact=redact, verbosity=verbosity, flavor=flavor.value)
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as e:
        fail(f"{output}: cannot write ({e.strerror or e})")
    if done is None:
        from vllm_doctor.render.summary import headline

        done = f"{headline(doc)}; report"
    typer.echo(f"vllm-doctor: {done} written to {output}", err=True)


@rules_app.callback()
def rules_list(
    ctx: typer.Context,
    rules_dirs: RulesDirs = [],  # noqa: B006
) -> None:
    """List the rules (id, kind, category, severity, title)."""
    if ctx.invoked_subcommand is not None:
        return
    for r in sorted(_load_rules(rules_dirs), key=lambda r: (r.kind, r.category or "", r.id)):
        label = f"{r.category}/{r.severity}" if r.kind == "diagnosis" else "fact"
        typer.echo(f"{r.id:48} {label:38} {r.title}")


@rules_app.command("show")
def rules_show(
    rule_id: Annotated[str, typer.Argument(help="The rule id.")],
    rules_dirs: RulesDirs = [],  # noqa: B006
) -> None:
    """Print one rule's documentation, generated from its file."""
    from vllm_doctor.matching.ruledoc import document

    rules = {r.id: r for r in _load_rules(rules_dirs)}
    if rule_id not in rules:
        fail(f"no rule {rule_id!r}; `vllm-doctor rules` lists them")
    typer.echo(document(rules[rule_id]))


@rules_app.command("check")
def rules_check(directory: Annotated[Path, typer.Argument(help="A directory of rule files.")]) -> None:
    """Validate every rule file in a directory; one line per problem."""
    from vllm_doctor.matching.ruledoc import check_dir

    problems, count = check_dir(directory)
    for p in problems:
        typer.echo(p, err=True)
    if problems:
        raise typer.Exit(2)
    typer.echo(f"{count} rule file(s) OK")


Preflight = Enum("Preflight", [("warn", "warn"), ("strict", "strict"), ("off", "off")], type=str)  # serve --preflight
ModelArgs = typer.Argument(help="The model and the vllm serve arguments, after --.", metavar="MODEL_AND_ARGS",
                           show_default=False)  # fmt: skip


@app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def check(
    vllm_args: Annotated[Optional[list[str]], ModelArgs] = None,
    list_checks: Annotated[bool, typer.Option("--list", help="List the checks, one line each.")] = False,
    only: Annotated[list[str], typer.Option("--only", help="Run only this check (repeatable).", metavar="NAME")] = [],  # noqa: B006
    format: FormatOpt = Format.text,
    output: OutputOpt = None,
    fail_on: FailOnOpt = FailOn.blocker,
    offline: OfflineOpt = False,
    no_gpu: Annotated[bool, typer.Option("--no-gpu", help="Skip the NVML snapshot (the GPU checks say so).")] = False,
    no_redact: NoRedactOpt = False,
) -> None:
    """Find what `vllm serve` would fail on, before it starts (fit, TP, the GPUs now, the host, the model; the
    environment too). Exit status: 0 no blocker, 1 a blocker, 2 usage error, 4 unknown (fit or model not checked)."""
    if list_checks:
        from vllm_doctor.preflight.checks import listing

        return typer.echo(listing())
    from vllm_doctor.preflight.args import parse
    from vllm_doctor.preflight.run import preflight

    args = list(vllm_args or [])
    if not args or args == ["--"]:
        fail("give the model after --: vllm-doctor check [OPTIONS] -- MODEL [vllm serve args]")
    report = preflight(parse(args), only=list(only), offline=offline, no_gpu=no_gpu)
    _emit(report, format, output, redact=not no_redact)
    raise typer.Exit(_exit_code(report, fail_on))


@app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def serve(
    vllm_args: Annotated[list[str], ModelArgs],
    vllm_bin: Annotated[
        Optional[str], typer.Option("--vllm-bin", help="The vllm executable (default: vllm on PATH).")
    ] = None,
    report_dir: Annotated[
        Optional[Path],
        typer.Option(
            "--report-dir", help="Each incident in a new directory under this one (default: ./vllm-doctor-reports/)."
        ),
    ] = None,
    always_report: Annotated[
        bool, typer.Option("--always-report", help="Write the report after a clean exit too.")
    ] = False,
    log_file: Annotated[Optional[Path], typer.Option("--log-file", help="Also keep the raw output here.")] = None,
    grace: Annotated[
        float, typer.Option("--grace", min=0, help="Seconds after a forwarded SIGINT/SIGTERM/SIGHUP before SIGKILL.")
    ] = 30.0,
    reap_wait: Annotated[
        float, typer.Option("--reap-wait", min=0, help="Seconds vLLM's other processes get to exit after the main one.")
    ] = 15.0,
    watch_samples: Annotated[
        int,
        typer.Option(
            "--watch-samples",
            min=1,
            help="Warn after this many stats samples with requests waiting on a full KV cache.",
        ),
    ] = 3,
    no_watch: Annotated[
        bool, typer.Option("--no-watch", help="Do not watch the stats lines while the server runs.")
    ] = False,
    no_redact: NoRedactOpt = False,
    rules_dirs: RulesDirs = [],  # noqa: B006
    preflight: Annotated[
        Preflight,
        typer.Option("--preflight", help="Run `check` first: warn (and start), strict (refuse a blocker), off."),
    ] = Preflight.warn,
) -> None:
    """Run vllm serve, pass its output through, and on a bad exit write a diagnosed incident report.

    Exits with vLLM's own status (128 + N when a signal N ended it); 1 when --preflight strict refuses.
    """
    from vllm_doctor.preflight.gate import before_serve
    from vllm_doctor.serve import ServeOptions, run

    if vllm_args and vllm_args[0] == "--":
        vllm_args = vllm_args[1:]
    if not vllm_args:
        fail("give the model after --: vllm-doctor serve [OPTIONS] -- MODEL [vllm serve args]")
    refused = before_serve(list(vllm_args), preflight.value)
    if refused is not None:
        raise typer.Exit(refused)
    outcome = run(
        ServeOptions(
            vllm_args=list(vllm_args),
            vllm_bin=vllm_bin,
            report_dir=report_dir,
            always_report=always_report,
            log_file=log_file,
            grace=grace,
            reap_wait=reap_wait,
            watch=not no_watch,
            watch_samples=watch_samples,
            redact=not no_redact,
            rules_dirs=list(rules_dirs),
        )
    )
    raise typer.Exit(outcome.status)


@app.command()
def watch(
    url: Annotated[str, typer.Argument(help="The server (http://HOST:PORT) or its /metrics URL.", show_default=False)],
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between scrapes.")] = 10.0,
    samples: Annotated[int, typer.Option("--samples", min=1, help="Scrapes to take, then diagnose.")] = 6,
    format: FormatOpt = Format.text,
    output: OutputOpt = None,
    rules_dirs: RulesDirs = [],  # noqa: B006
    fail_on: FailOnOpt = FailOn.blocker,
    no_redact: NoRedactOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    flavor: FlavorOpt = Flavor.plain,
) -> None:
    """Scrape a running server's /metrics every --interval seconds and diagnose the series:
    a full KV cache, the sequence cap, or a stall. One line per scrape on stderr; Ctrl-C stops early."""
    import time

    from vllm_doctor import pipeline
    from vllm_doctor.read.metrics import MetricsError, Scrape, describe, fetch

    rules = _load_rules(rules_dirs)
    scrapes: list[Scrape] = []
    try:
        for i in range(samples):
            if i:
                time.sleep(max(0.0, scrapes[-1].at + interval - time.monotonic()))
            try:
                scrapes.append(fetch(url))
            except MetricsError as e:
                if not scrapes:
                    fail(str(e))
                typer.echo(f"vllm-doctor: {e}", err=True)
                break
            typer.echo(describe(scrapes[-1], len(scrapes), scrapes[-2] if len(scrapes) > 1 else None), err=True)
    except KeyboardInterrupt:
        if not scrapes:
            raise typer.Exit(130) from None
    report = pipeline.from_metrics(scrapes, rules)
    _emit(report, format, output, redact=not no_redact, verbosity=_verbosity(quiet, verbose), flavor=flavor)
    raise typer.Exit(_exit_code(report, fail_on))


@app.command()
def plan(
    models: Annotated[
        Optional[list[str]],
        typer.Argument(
            help="Repo ids or model directories; several share one GPU.", metavar="[MODEL]...", show_default=False
        ),
    ] = None,
    config: Annotated[
        list[str], typer.Option("--config", help="A config.json (repeatable: one model each).", metavar="FILE")
    ] = [],  # noqa: B006
    params: Annotated[
        Optional[str], typer.Option("--params", help="Parameters, e.g. 7B (overrides the config).")
    ] = None,
    layers: Annotated[Optional[int], typer.Option("--layers", min=1, help="Layers (shape by hand).")] = None,
    heads: Annotated[
        Optional[int], typer.Option("--heads", min=1, help="Attention heads (for valid TP sizes).")
    ] = None,
    kv_heads: Annotated[Optional[int], typer.Option("--kv-heads", min=1, help="KV heads.")] = None,
    head_dim: Annotated[Optional[int], typer.Option("--head-dim", min=1, help="Head size.")] = None,
    dtype: Annotated[
        Optional[str], typer.Option("--dtype", help="Weight dtype (default: the config's, else bfloat16).")
    ] = None,
    gpu_memory: Annotated[
        str, typer.Option("--gpu-memory", help="Per GPU: 80GB (10^9 B), 80GiB (2^30 B), or auto (NVML).")
    ] = "auto",
    gpus: Annotated[
        Optional[int], typer.Option("--gpus", min=1, help="GPUs available (default: NVML's count).")
    ] = None,
    utilization: Annotated[
        float, typer.Option("--gpu-memory-utilization", help="Fraction of each GPU vLLM may use.")
    ] = 0.90,
    max_model_len: Annotated[
        Optional[int],
        typer.Option("--max-model-len", min=1, help="Tokens per sequence (default: the model's maximum)."),
    ] = None,
    tp: Annotated[int, typer.Option("--tensor-parallel-size", "-tp", min=1, help="Tensor-parallel size.")] = 1,
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", help="auto (the model's dtype) or fp8.")] = "auto",
    quantization: Annotated[
        Optional[str], typer.Option("--quantization", "-q", help="awq, gptq, fp8, ... (bits per weight).")
    ] = None,
    target_concurrency: TargetConcurrency = None,
    block_size: BlockSizeOpt = None,
    prompt_len: Annotated[
        Optional[int], typer.Option("--prompt-len", min=1, help="Show the blocks a prompt of this length takes.")
    ] = None,
    samples: Annotated[
        int, typer.Option("--samples", min=1, help="Parallel samples of that prompt (shared vs not).")
    ] = 1,
    overhead: Annotated[
        Optional[str],
        typer.Option("--overhead", help="Activation + non-torch + CUDA graphs per GPU, e.g. 2GB (default 0)."),
    ] = None,
    kv_cache_memory: KvCacheMemoryOpt = None,
    cpu_kvcache_space: CpuKvSpaceOpt = None,
    offline: OfflineOpt = False,
    no_gpu: Annotated[bool, typer.Option("--no-gpu", help="Do not ask NVML for the GPUs.")] = False,
    format: FormatOpt = Format.text,
    output: OutputOpt = None,
) -> None:
    """The capacity arithmetic before you start: weights, KV cache, bytes per token, tokens and
    sequences that fit, valid TP sizes and a ready `vllm serve` line. Exit 1 when it does not fit."""
    from vllm_doctor.capacity import plan as planner
    from vllm_doctor.capacity.gpu import skipped, snapshot

    request = planner.PlanRequest(
        models=list(models or []), configs=list(config), params=params, layers=layers, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, gpu_memory=gpu_memory, gpus=gpus,
        utilization=utilization, max_model_len=max_model_len, tp=tp, kv_cache_dtype=kv_cache_dtype,
        quantization=quantization, target_concurrency=target_concurrency, block_size=block_size or 0,
        prompt_len=prompt_len, samples=samples, overhead=overhead, offline=offline,
        kv_cache_memory=kv_cache_memory, cpu_kvcache_space=cpu_kvcache_space,
    )  # fmt: skip
    gpu = skipped("--no-gpu") if no_gpu else snapshot()
    result = planner.make_plan(request, gpu)
    _emit(result, format, output, done=f"plan {'fits' if result.fits else 'does not fit'};")
    raise typer.Exit(0 if result.fits else 1)


def main() -> None:
    """Run the CLI; bad input, usage errors and internal errors are one line on stderr, never a
    traceback: exit 2 for the first two, 3 for our own bugs, 130 for Ctrl-C."""
    try:
        code = app(prog_name="vllm-doctor", standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):
        code = 130
    except Exception as e:  # click's UsageError family (vendored by typer) and our own bugs
        code = _one_line_error(e)
    sys.exit(code or 0)


def _one_line_error(e: Exception) -> int:
    import os

    if type(e).__name__ == "NoArgsIsHelpError":
        typer.echo(e.format_message())  # type: ignore[attr-defined]
        return 0
    if getattr(e, "exit_code", None) == 2 and hasattr(e, "format_message"):
        typer.echo(f"vllm-doctor: {e.format_message()} (see --help)", err=True)
        return 2
    if os.environ.get("VLLM_DOCTOR_DEBUG"):
        raise e
    typer.echo(
        f"vllm-doctor: internal error: {type(e).__name__}: {e} (set VLLM_DOCTOR_DEBUG=1 for the traceback)", err=True
    )
    return 3


class AlertFormat(str, Enum):
    rules = "rules"
    k8s = "k8s"


@app.command()
def alerts(
    format: Annotated[AlertFormat, typer.Option("--format", "-f", help="A rules file, or a PrometheusRule.")] = (
        AlertFormat.rules
    ),
    tpot_budget: Annotated[float, typer.Option("--tpot-budget", min=0.001, help="Inter-token p95, ms.")] = 100.0,
    queue_budget: Annotated[float, typer.Option("--queue-budget", min=0.001, help="Queue time p95, s.")] = 5.0,
    namespace: Annotated[str, typer.Option("--namespace", help="The PrometheusRule's namespace.")] = "monitoring",
) -> None:
    """Print Prometheus alerting rules for what vllm-doctor diagnoses (promtool check rules accepts them)."""
    from vllm_doctor.render.alerts import Thresholds, render

    sys.stdout.write(render(format.value, Thresholds(tpot_budget, queue_budget), namespace))
