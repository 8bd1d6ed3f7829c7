"""The command line: thin commands that parse options and call the library."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from vllm_doctor.cli import start
from vllm_doctor.cli.options import (
    EXIT_HELP,
    AlertFormat,
    Color,
    ColorOpt,
    Command,
    ConfigOpt,
    EndOpt,
    FailOn,
    FailOnOpt,
    Flavor,
    FlavorOpt,
    FollowOpt,
    FormatOpt,
    Group,
    LifetimeOpt,
    MetricsOpt,
    ModelOpt,
    NoGpuOpt,
    NoRedactOpt,
    OfflineOpt,
    OutputOpt,
    PrometheusOpt,
    QuietOpt,
    RulesDirs,
    SelectorOpt,
    SinceOpt,
    StartOpt,
    StrictRules,
    TargetConcurrency,
    TargetLen,
    ThisHostOpt,
    TpotBudget,
    TtftBudget,
    VerboseOpt,
    exit_code,
    fail,
    finite,
    lifetime_index,
    load_rules,
    say,
    show_version,
    target,
    verbosity,
)
from vllm_doctor.cli.sources import stamp
from vllm_doctor.knowledge.rulebook import LOG_KINDS

app = typer.Typer(
    cls=Group,
    context_settings={"help_option_names": ["-h", "--help"]},  # -h as every command line has it
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
    """The commands: explain, watch, check, serve, plan, alerts, rules, mcp."""


app.command(cls=Command, context_settings=start.VLLM_ARGS)(start.check)
app.command(cls=Command, context_settings=start.VLLM_ARGS)(start.serve)
app.command(cls=Command)(start.plan)


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
    prometheus: PrometheusOpt = None,
    since: SinceOpt = None,
    start: StartOpt = None,
    end: EndOpt = None,
    selector: SelectorOpt = None,
    tpot_budget: TpotBudget = None,
    ttft_budget: TtftBudget = None,
    no_redact: NoRedactOpt = False,
    model: ModelOpt = None,
    config: ConfigOpt = None,
    offline: OfflineOpt = False,
    no_gpu: NoGpuOpt = False,
    this_host: ThisHostOpt = False,
    lifetime: LifetimeOpt = "last",
    follow: FollowOpt = False,
    color: ColorOpt = Color.auto,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    flavor: FlavorOpt = Flavor.plain,
) -> None:
    """Diagnose a vLLM log: the cause, the evidence, the numbers and the fixes in order.

    Exit status: 0 no blocker, 1 a blocker, 2 usage error or unreadable input, 3 internal error,
    4 unknown (no vLLM output, an empty input, or a start that stops with no sign of why)."""
    from vllm_doctor import pipeline
    from vllm_doctor.cli.output import emit
    from vllm_doctor.knowledge.checks import Options

    fmt, path = target(ctx, format, output, color)
    level = verbosity(quiet, verbose)
    server = metrics is not None or prometheus is not None
    if server and paths or metrics is not None and prometheus is not None:
        fail("give log files, --metrics URL or --prometheus URL, one of them")
    if follow and (server or len(paths or []) != 1):
        fail("--follow reads one stream: give one log (- for stdin)")
    rules = load_rules(rules_dirs, strict_rules, LOG_KINDS)
    budgets: dict[str, Any] = {"tpot_budget_ms": tpot_budget, "ttft_budget_ms": ttft_budget}
    if server:
        from vllm_doctor.cli.fleet import server_report

        window = (since, start, end, selector)
        report = server_report(metrics, prometheus, window, rules, Options(target_concurrency, target_len, **budgets))
    elif paths:
        options = Options(target_concurrency, target_len, model=model, config=config, offline=offline,
                          lookup_model=True, gpu=not no_gpu, this_host=True if this_host else None,
                          lifetime=lifetime_index(lifetime), **budgets)  # fmt: skip
        if "-" in paths:  # from a terminal or a quiet pipe: say that stdin is being read
            from vllm_doctor.read.source import stdin_hint

            stdin_hint()
        report = (
            _follow(paths[0], rules, options, fmt, not no_redact) if follow else pipeline.explain(paths, rules, options)
        )
        report.all_lifetimes = lifetime == "all"
        if options.lifetime and options.lifetime > len(report.lifetimes):
            fail(f"--lifetime {lifetime}: the input holds {len(report.lifetimes)} start(s)")
    else:
        fail("give a log file (- for stdin), --metrics URL or --prometheus URL")
    if level > 0 and paths:  # -v: every evidence line in full, not cut at 400 characters
        report = pipeline.whole_evidence(report)
    emit(stamp(report, ctx, rules), fmt, path, redact=not no_redact, verbosity=level, flavor=flavor.value)
    raise typer.Exit(exit_code(report, fail_on))


def _follow(source: str, rules, options, fmt: str, masked: bool):
    """--follow: the lines as diagnoses appear go to stdout with text, to stderr beside a json or
    markdown report; masked as the report is (unless --no-redact)."""
    from vllm_doctor.cli.follow import follow
    from vllm_doctor.read.source import open_input
    from vllm_doctor.render.redact import redact

    def live(line: str) -> None:
        say(redact(line) if masked else line, err=fmt != "text")

    stream, owned = open_input(source)
    try:
        return follow(stream.fileno(), rules, options, live, source)
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
        label = "fact" if r.kind == "fact" else f"{r.category}/{r.severity}"
        label += " (check)" if r.kind == "preflight" else ""  # a finding of `vllm-doctor check`
        say(f"{r.id:48} {label:38} {r.title}", err=False)


def _rule_names(incomplete: str) -> list[str]:
    from vllm_doctor.cli.complete import rule_names

    return rule_names(incomplete)


@rules_app.command("show", cls=Command)
def rules_show(
    rule_id: Annotated[
        str, typer.Argument(help="A rule id, or a category.", metavar="ID|CATEGORY", autocompletion=_rule_names)
    ],
    rules_dirs: RulesDirs = [],  # noqa: B006
) -> None:
    """Print one rule's documentation, generated from its file, or list a category's rules."""
    from vllm_doctor.knowledge.checks import CHECKS
    from vllm_doctor.matching.ruledoc import show

    say(show(load_rules(rules_dirs), rule_id, CHECKS), err=False)


@rules_app.command("coverage", cls=Command)
def rules_coverage(
    vllm: Annotated[
        Optional[str],
        typer.Option("--vllm", metavar="VERSION", help="The release (default: the newest the atlas read)."),
    ] = None,
    rules_dirs: RulesDirs = [],  # noqa: B006
) -> None:
    """Of a vLLM release's startup raise sites (the atlas, read from its wheel): how many a hand rule
    names, how many the atlas names alone, and which neither can."""
    from vllm_doctor.knowledge.coverage import coverage, lines

    release, areas = coverage(load_rules(rules_dirs), vllm)
    say("\n".join(lines(release, areas)), err=False)


@rules_app.command("check", cls=Command)
def rules_check(directory: Annotated[Path, typer.Argument(help="A directory of rule files.", metavar="DIR")]) -> None:
    """Validate every rule file in a directory; one line per problem."""
    from vllm_doctor.knowledge.checks import CHECKS
    from vllm_doctor.matching.ruledoc import check_dir

    problems, count = check_dir(directory, CHECKS)
    for p in problems:
        say(p)
    if problems:
        raise typer.Exit(2)
    typer.echo(f"{count} rule file(s) OK")


@app.command(cls=Command)
def watch(
    ctx: typer.Context,
    url: Annotated[
        str,
        typer.Argument(help="The server (http://HOST:PORT) or its /metrics URL.", metavar="URL", show_default=False),
    ],
    interval: Annotated[
        float,
        typer.Option("--interval", parser=finite(0.1, 86400.0), metavar="SECONDS", help="Seconds between scrapes."),
    ] = 10.0,
    samples: Annotated[int, typer.Option("--samples", min=1, metavar="N", help="Scrapes to take, then diagnose.")] = 6,
    format: FormatOpt = None,
    output: OutputOpt = None,
    rules_dirs: RulesDirs = [],  # noqa: B006
    strict_rules: StrictRules = False,
    fail_on: FailOnOpt = FailOn.blocker,
    no_redact: NoRedactOpt = False,
    color: ColorOpt = Color.auto,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    flavor: FlavorOpt = Flavor.plain,
) -> None:
    """Scrape a running server's /metrics every --interval seconds and diagnose the series:
    a full KV cache, the sequence cap, or a stall. One line per scrape on stderr; Ctrl-C stops early."""
    import time

    from vllm_doctor import pipeline
    from vllm_doctor.cli.output import emit
    from vllm_doctor.read.metrics import MetricsError, Scrape, describe, fetch

    fmt, path = target(ctx, format, output, color)
    level = verbosity(quiet, verbose)
    rules = load_rules(rules_dirs, strict_rules, LOG_KINDS)
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
                say(f"vllm-doctor: {e}")
                break
            say(describe(scrapes[-1], len(scrapes), scrapes[-2] if len(scrapes) > 1 else None))
    except KeyboardInterrupt:
        if not scrapes:
            raise typer.Exit(130) from None
    report = pipeline.from_metrics(scrapes, rules)
    emit(stamp(report, ctx, rules), fmt, path, redact=not no_redact, verbosity=level, flavor=flavor.value)
    raise typer.Exit(exit_code(report, fail_on))


# alerts' own options (monitoring-mixins conventions: render/alerts.py)
ByOpt = Annotated[
    Optional[str],
    typer.Option(
        "--by", metavar="LABELS", help="Labels each alert keeps beside instance and model_name, e.g. namespace,pod,job."
    ),
]
LabelOpt = Annotated[
    list[str],
    typer.Option(
        "--label", metavar="K=V", help="A label on every rule and the PrometheusRule (its ruleSelector); repeatable."
    ),
]
TestsOpt = Annotated[
    bool, typer.Option("--tests", help="Print a promtool unit-test file for these rules (promtool test rules FILE).")
]
RulesFileOpt = Annotated[
    str, typer.Option("--rules-file", metavar="PATH", help="--tests: the rules file's path as the test file finds it.")
]
AlertOutputOpt = Annotated[
    Optional[str],
    typer.Option(
        "--output",
        "-o",
        metavar="PATH|FORMAT",
        help="Write to this file (- for stdout); -o rules|k8s names the format.",
    ),
]
RunbookOpt = Annotated[
    Optional[str],
    typer.Option("--runbook-url", metavar="URL", help="Each alert's runbook_url, {rule} the vllm-doctor rule id."),
]


@app.command(cls=Command)
def alerts(
    format: Annotated[AlertFormat, typer.Option("--format", "-f", help="A rules file, or a PrometheusRule.")] = (
        AlertFormat.rules
    ),
    output: AlertOutputOpt = None,
    tpot_budget: Annotated[
        float, typer.Option("--tpot-budget", parser=finite(0.001, 1e9), help="Inter-token p95, ms.")
    ] = 100.0,
    queue_budget: Annotated[
        float, typer.Option("--queue-budget", parser=finite(0.001, 1e9), help="Queue time p95, s.")
    ] = 5.0,
    namespace: Annotated[str, typer.Option("--namespace", help="The PrometheusRule's namespace.")] = "monitoring",
    by: ByOpt = None,
    label: LabelOpt = [],  # noqa: B006
    selector: Annotated[
        Optional[str], typer.Option("--selector", help="Watch only these series, e.g. '{namespace=\"llm\"}'.")
    ] = None,
    runbook_url: RunbookOpt = None,
    tests: TestsOpt = False,
    rules_file: RulesFileOpt = "vllm-doctor.rules.yml",
) -> None:
    """Print Prometheus alerting rules for what vllm-doctor diagnoses, or with --tests their promtool unit tests.
    promtool check rules accepts the rules file and the PrometheusRule's spec."""
    from vllm_doctor.cli.output import target, write
    from vllm_doctor.errors import DoctorError
    from vllm_doctor.read.prom import parse_selector
    from vllm_doctor.render import alerts as rules

    try:
        named, path = target(output, {f.value: f.value for f in AlertFormat})
        fmt = named or format.value
        scope = rules.scope(by, list(label), parse_selector(selector), runbook_url)
        thresholds = rules.Thresholds(tpot_budget, queue_budget)
        if tests and fmt == "k8s":
            fail("--tests: promtool tests a rules file (--format rules), not a PrometheusRule")
        if tests:
            from vllm_doctor.render import alerttests

            write(alerttests.render(rules_file, thresholds, scope), path, "promtool tests")
        else:
            write(rules.render(fmt, thresholds, namespace, scope), path, "alerting rules")
    except DoctorError as e:
        fail(str(e))


@app.command("mcp", cls=Command)
def mcp_server(
    roots: Annotated[
        list[str],
        typer.Option("--root", metavar="DIR", help="A directory the tools may read under (repeatable; default: .)."),
    ] = [],  # noqa: B006
    allow_url: Annotated[
        list[str],
        typer.Option("--allow-url", metavar="PREFIX", help="URLs the metrics tool may fetch (default: none)."),
    ] = [],  # noqa: B006
    http: Annotated[bool, typer.Option("--http", help="Streamable HTTP instead of stdio.")] = False,
    host: Annotated[str, typer.Option("--host", metavar="ADDR", help="--http: the address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="--http: the port.")] = 8000,
) -> None:
    """Serve the diagnosis to agents over the Model Context Protocol (stdio, or --http): explain, check,
    plan, rules and metrics as tools, read-only, files only under --root, redaction always on."""
    try:
        from vllm_doctor.mcp.server import run
    except ImportError as e:
        fail(f"mcp: the MCP SDK is not installed ({e.name}): pip install 'vllm-log-doctor[mcp]'")
    run(list(roots), list(allow_url), http, host, port)


def main() -> None:
    """Run the CLI; bad input, usage errors and internal errors are one line on stderr, never a
    traceback: exit 2 for the first two, 3 for our own bugs, 130 for Ctrl-C, 141 (SIGPIPE's) when
    stdout closed before a listing was out. Defaults come from the settings (settings.py)."""
    from vllm_doctor.cli.settings import default_map, load
    from vllm_doctor.errors import DoctorError

    try:
        defaults = default_map(load())
        code = _narrowed(sys.argv[1:2])(prog_name="vllm-doctor", standalone_mode=False, default_map=defaults)
    except (typer.Abort, KeyboardInterrupt):
        code = 130
    except DoctorError as e:  # a bad VLLM_DOCTOR_* variable or config file
        say(f"vllm-doctor: {e}")
        code = 2
    except SystemExit as e:  # click met a closed stdout itself (the top --help) and exits 1: SIGPIPE's 141
        code = 141 if type(sys.stdout).__name__ == "PacifyFlushWrapper" else e.code
    except BrokenPipeError:  # a listing's reader went away (`rules | head`)
        from vllm_doctor.cli.output import quiet_closed_stdout

        quiet_closed_stdout()
        code = 141
    except Exception as e:  # click's UsageError family (vendored by typer) and our own bugs
        code = _one_line_error(e)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        from vllm_doctor.cli.output import quiet_closed_stdout

        quiet_closed_stdout()  # the flush at exit finds /dev/null: no "Exception ignored" line
    sys.exit(code or 0)


def _narrowed(first: list[str]) -> typer.Typer:
    """The app with only the command the command line starts with: typer builds a click command for
    every command of an app it runs (13 ms of `explain`'s cold start), and one runs. Anything else
    (no command, an option first, a misspelt command) runs the whole app: its help, its suggestions."""
    import copy

    from typer.main import get_command_name

    def named(info: Any) -> bool:
        return (info.name or get_command_name(info.callback.__name__)) == first[0]

    if not first:
        return app
    commands = [c for c in app.registered_commands if named(c)]
    groups = [g for g in app.registered_groups if g.name == first[0]]
    if len(commands) + len(groups) != 1:
        return app
    only = copy.copy(app)
    only.registered_commands, only.registered_groups = commands, groups
    return only


def _one_line_error(e: Exception) -> int:
    import os

    if type(e).__name__ == "NoArgsIsHelpError":
        typer.echo(e.format_message())  # type: ignore[attr-defined]
        return 0
    if getattr(e, "exit_code", None) == 2 and hasattr(e, "format_message"):
        say(f"vllm-doctor: {e.format_message()} (see --help)")
        return 2
    if os.environ.get("VLLM_DOCTOR_DEBUG"):
        raise e
    say(f"vllm-doctor: internal error: {type(e).__name__}: {e} (set VLLM_DOCTOR_DEBUG=1 for the traceback)")
    return 3
