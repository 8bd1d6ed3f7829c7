"""The command line: thin commands that parse options and call the library."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_doctor.cliopts import (
    EXIT_HELP,
    Color,
    ColorOpt,
    Command,
    ConfigOpt,
    FailOn,
    FailOnOpt,
    FollowOpt,
    FormatOpt,
    Group,
    LifetimeOpt,
    MetricsOpt,
    ModelOpt,
    NoRedactOpt,
    OfflineOpt,
    OutputOpt,
    RulesDirs,
    StrictRules,
    TargetConcurrency,
    TargetLen,
    ThisHostOpt,
    exit_code,
    fail,
    lifetime_index,
    load_rules,
    show_version,
    target,
)

app = typer.Typer(
    cls=Group,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Explain why vllm serve failed or queues requests: the cause, the numbers and the fixes in order. "
    + EXIT_HELP,
)
rules_app = typer.Typer(
    add_completion=False,
    invoke_without_command=True,
    rich_markup_mode=None,
    help="List, show and check the rules.",
)
app.add_typer(rules_app, name="rules")


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=show_version, help="Print the version and exit.")
    ] = False,
) -> None:
    """The commands: explain, watch, plan, serve, rules."""


@app.command(cls=Command)
def explain(
    ctx: typer.Context,
    paths: Annotated[
        Optional[list[str]],
        typer.Argument(help="Log files (.gz works too); - reads stdin.", metavar="[LOG]...", show_default=False),
    ] = None,
    format: FormatOpt = None,
    output: OutputOpt = None,
    rules_dirs: RulesDirs = [],  # noqa: B006 (typer reads the default; it is never mutated)
    strict_rules: StrictRules = False,
    fail_on: FailOnOpt = FailOn.blocker,
    target_concurrency: TargetConcurrency = None,
    target_len: TargetLen = None,
    metrics: MetricsOpt = None,
    no_redact: NoRedactOpt = False,
    model: ModelOpt = None,
    config: ConfigOpt = None,
    offline: OfflineOpt = False,
    no_gpu: Annotated[bool, typer.Option("--no-gpu", help="Skip the NVML snapshot of this machine's GPUs.")] = False,
    this_host: ThisHostOpt = False,
    lifetime: LifetimeOpt = "last",
    follow: FollowOpt = False,
    color: ColorOpt = Color.auto,
) -> None:
    """Diagnose a vLLM log: the cause, the evidence, the numbers and the fixes in order.

    Exit status: 0 no blocker, 1 a blocker, 2 usage error or unreadable input, 3 internal error,
    4 unknown (no vLLM output, an empty input, or a start that stops with no sign of why)."""
    from vllm_doctor import pipeline
    from vllm_doctor.knowledge.checks import Options

    fmt, path = target(ctx, format, output, color)
    if metrics is not None and paths:
        fail("give log files or --metrics URL, not both")
    if follow and (metrics is not None or len(paths or []) != 1):
        fail("--follow reads one stream: give one log (- for stdin)")
    rules = load_rules(rules_dirs, strict_rules)
    if "-" in (paths or []):
        from vllm_doctor.read.source import stdin_hint

        stdin_hint()
    if metrics is not None:
        from vllm_doctor.read.metrics import fetch

        report = pipeline.from_metrics([fetch(metrics)], rules, Options(target_concurrency, target_len))
    elif paths:
        options = Options(target_concurrency, target_len, model=model, config=config, offline=offline,
                          lookup_model=True, gpu=not no_gpu, this_host=True if this_host else None,
                          lifetime=lifetime_index(lifetime))  # fmt: skip
        report = _follow(paths[0], rules, options, fmt) if follow else pipeline.explain(paths, rules, options)
        report.all_lifetimes = lifetime == "all"
        if options.lifetime and options.lifetime > len(report.lifetimes):
            fail(f"--lifetime {lifetime}: the input holds {len(report.lifetimes)} start(s)")
    else:
        fail("give a log file (- for stdin) or --metrics URL")
    from vllm_doctor.output import emit

    emit(report, fmt, path, redact=not no_redact)
    raise typer.Exit(exit_code(report, fail_on))


def _follow(source: str, rules, options, fmt: str):
    """--follow: the lines as diagnoses appear go to stdout with text, to stderr beside a json or markdown report."""
    from vllm_doctor.follow import follow
    from vllm_doctor.read.source import open_input

    stream, owned = open_input(source)
    try:
        return follow(stream.fileno(), rules, options, lambda line: typer.echo(line, err=fmt != "text"))
    finally:
        if owned:
            stream.close()


@rules_app.callback()
def rules_list(
    ctx: typer.Context,
    rules_dirs: RulesDirs = [],  # noqa: B006
) -> None:
    """List the rules (id, kind, category, severity, title)."""
    if ctx.invoked_subcommand is not None:
        return
    for r in sorted(load_rules(rules_dirs), key=lambda r: (r.kind, r.category or "", r.id)):
        label = f"{r.category}/{r.severity}" if r.kind == "diagnosis" else "fact"
        typer.echo(f"{r.id:48} {label:38} {r.title}")


@rules_app.command("show", cls=Command)
def rules_show(
    rule_id: Annotated[str, typer.Argument(help="A rule id, or a category.", metavar="ID|CATEGORY")],
    rules_dirs: RulesDirs = [],  # noqa: B006
) -> None:
    """Print one rule's documentation, generated from its file, or list a category's rules."""
    from vllm_doctor.matching.ruledoc import show

    typer.echo(show(load_rules(rules_dirs), rule_id))


@rules_app.command("check", cls=Command)
def rules_check(directory: Annotated[Path, typer.Argument(help="A directory of rule files.", metavar="DIR")]) -> None:
    """Validate every rule file in a directory; one line per problem."""
    from vllm_doctor.matching.ruledoc import check_dir

    problems, count = check_dir(directory)
    for p in problems:
        typer.echo(p, err=True)
    if problems:
        raise typer.Exit(2)
    typer.echo(f"{count} rule file(s) OK")


@app.command(cls=Command, context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def serve(
    vllm_args: Annotated[
        list[str],
        typer.Argument(
            help="The model and the vllm serve arguments, after --.", metavar="-- MODEL [ARG]...", show_default=False
        ),
    ],
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
        float,
        typer.Option(
            "--grace", min=0, metavar="SECONDS", help="Seconds after a forwarded SIGINT/SIGTERM/SIGHUP before SIGKILL."
        ),
    ] = 30.0,
    reap_wait: Annotated[
        float,
        typer.Option(
            "--reap-wait",
            min=0,
            metavar="SECONDS",
            help="Seconds vLLM's other processes get to exit after the main one.",
        ),
    ] = 15.0,
    watch_samples: Annotated[
        int,
        typer.Option(
            "--watch-samples",
            min=1,
            metavar="N",
            help="Warn after this many stats samples with requests waiting on a full KV cache.",
        ),
    ] = 3,
    no_watch: Annotated[
        bool, typer.Option("--no-watch", help="Do not watch the stats lines while the server runs.")
    ] = False,
    no_redact: NoRedactOpt = False,
    rules_dirs: RulesDirs = [],  # noqa: B006
) -> None:
    """Run vllm serve, pass its output through, and on a bad exit write a diagnosed incident report.

    Exits with vLLM's own status (128 + N when a signal N ended it).
    """
    from vllm_doctor.serve import ServeOptions, run

    if vllm_args and vllm_args[0] == "--":
        vllm_args = vllm_args[1:]
    if not vllm_args:
        fail("give the model after --: vllm-doctor serve [OPTIONS] -- MODEL [vllm serve args]")
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


@app.command(cls=Command)
def watch(
    ctx: typer.Context,
    url: Annotated[
        str,
        typer.Argument(help="The server (http://HOST:PORT) or its /metrics URL.", metavar="URL", show_default=False),
    ],
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, metavar="SECONDS", help="Seconds between scrapes.")
    ] = 10.0,
    samples: Annotated[int, typer.Option("--samples", min=1, metavar="N", help="Scrapes to take, then diagnose.")] = 6,
    format: FormatOpt = None,
    output: OutputOpt = None,
    rules_dirs: RulesDirs = [],  # noqa: B006
    strict_rules: StrictRules = False,
    fail_on: FailOnOpt = FailOn.blocker,
    no_redact: NoRedactOpt = False,
    color: ColorOpt = Color.auto,
) -> None:
    """Scrape a running server's /metrics every --interval seconds and diagnose the series:
    a full KV cache, the sequence cap, or a stall. One line per scrape on stderr; Ctrl-C stops early."""
    import time

    from vllm_doctor import pipeline
    from vllm_doctor.output import emit
    from vllm_doctor.read.metrics import MetricsError, Scrape, describe, fetch

    fmt, path = target(ctx, format, output, color)
    rules = load_rules(rules_dirs, strict_rules)
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
    emit(report, fmt, path, redact=not no_redact)
    raise typer.Exit(exit_code(report, fail_on))


@app.command(cls=Command)
def plan(
    ctx: typer.Context,
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
        Optional[str], typer.Option("--quantization", help="awq, gptq, fp8, ... (bits per weight).")
    ] = None,
    target_concurrency: TargetConcurrency = None,
    block_size: Annotated[int, typer.Option("--block-size", min=1, help="Tokens per KV block.")] = 16,
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
    offline: OfflineOpt = False,
    no_gpu: Annotated[bool, typer.Option("--no-gpu", help="Do not ask NVML for the GPUs.")] = False,
    format: FormatOpt = None,
    output: OutputOpt = None,
    color: ColorOpt = Color.auto,
) -> None:
    """The capacity arithmetic before you start: weights, KV cache, bytes per token, tokens and
    sequences that fit, valid TP sizes and a ready `vllm serve` line. Exit 1 when it does not fit."""
    from vllm_doctor.capacity import plan as planner
    from vllm_doctor.capacity.gpu import skipped, snapshot
    from vllm_doctor.output import emit

    fmt, path = target(ctx, format, output, color)

    request = planner.PlanRequest(
        models=list(models or []), configs=list(config), params=params, layers=layers, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, gpu_memory=gpu_memory, gpus=gpus,
        utilization=utilization, max_model_len=max_model_len, tp=tp, kv_cache_dtype=kv_cache_dtype,
        quantization=quantization, target_concurrency=target_concurrency, block_size=block_size,
        prompt_len=prompt_len, samples=samples, overhead=overhead, offline=offline,
    )  # fmt: skip
    gpu = skipped("--no-gpu") if no_gpu else snapshot()
    result = planner.make_plan(request, gpu)
    emit(result, fmt, path, done=f"plan {'fits' if result.fits else 'does not fit'};")
    raise typer.Exit(0 if result.fits else 1)


def main() -> None:
    """Run the CLI; bad input, usage errors and internal errors are one line on stderr, never a
    traceback: exit 2 for the first two, 3 for our own bugs, 130 for Ctrl-C, 141 (SIGPIPE's) when
    stdout closed before a listing was out. Defaults come from the settings (settings.py)."""
    from vllm_doctor.errors import DoctorError
    from vllm_doctor.settings import default_map, load

    try:
        defaults = default_map(load())
        code = app(prog_name="vllm-doctor", standalone_mode=False, default_map=defaults)
    except (typer.Abort, KeyboardInterrupt):
        code = 130
    except DoctorError as e:  # a bad VLLM_DOCTOR_* variable or config file
        typer.echo(f"vllm-doctor: {e}", err=True)
        code = 2
    except SystemExit as e:  # click met a closed stdout itself (the top --help) and exits 1: SIGPIPE's 141
        code = 141 if type(sys.stdout).__name__ == "PacifyFlushWrapper" else e.code
    except BrokenPipeError:  # a listing's reader went away (`rules | head`)
        from vllm_doctor.output import quiet_closed_stdout

        quiet_closed_stdout()
        code = 141
    except Exception as e:  # click's UsageError family (vendored by typer) and our own bugs
        code = _one_line_error(e)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        from vllm_doctor.output import quiet_closed_stdout

        quiet_closed_stdout()  # the flush at exit finds /dev/null: no "Exception ignored" line
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
