"""What the commands share: the option types declared once, the exit status, rule loading with
--strict-rules, the output target, and the one-line failure (exit 2). commands.py and start.py hold
the commands."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from vllm_doctor.errors import MAX_HEADS, DoctorError, in_range


class Group(TyperGroup):
    """Bad input (a DoctorError from any stage) is one line on stderr and exit status 2; a closed
    stdout is SIGPIPE's 141, quietly."""

    def invoke(self, ctx: Any) -> Any:  # click.Context: vendored by typer 0.28, a dependency before
        from vllm_doctor.errors import DoctorError

        try:
            return super().invoke(ctx)
        except DoctorError as e:
            fail(str(e))
        except BrokenPipeError:  # stdout closed before a listing was out (`rules | head`): click would exit 1
            from vllm_doctor.cli.output import quiet_closed_stdout

            quiet_closed_stdout()
            raise typer.Exit(141) from None


# metavars by click type name, for options that name none (typer would print <int range>, <str>)
METAVARS = {"int": "N", "int range": "N", "float": "NUMBER", "float range": "NUMBER", "str": "TEXT", "path": "PATH"}


class Command(TyperCommand):
    """Plain metavars: N, NUMBER, TEXT, PATH for options; typer writes a required argument as {NAME}."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            if p.param_type_name == "option" and p.metavar is None and not getattr(p, "is_flag", False):
                p.metavar = METAVARS.get(p.type.name, p.metavar)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta["argv"] = list(args)  # as given: click drops a `--` (serve tells ours from vLLM's by it)
        rest = super().parse_args(ctx, args)
        from vllm_doctor.cli.sources import announce

        announce(ctx)  # the settings from a file or a variable, named before anything runs
        return rest

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in super().collect_usage_pieces(ctx)]


EXIT_HELP = (
    "Exit status: 0 no blocker, 1 a blocker (--fail-on warning: a warning too), 2 usage error, unreadable "
    "input or a bad setting, 3 internal error, 4 unknown (no vLLM output, an empty input, or a start that stops "
    "with no sign of why); a closed stdout (| head) leaves it unchanged. Defaults come from VLLM_DOCTOR_* "
    "variables and vllm-doctor.toml (see the README); a flag wins."
)


class Format(str, Enum):
    text = "text"
    markdown = "markdown"
    json = "json"
    html = "html"


class Flavor(str, Enum):
    plain = "plain"
    github = "github"


class AlertFormat(str, Enum):
    rules = "rules"
    k8s = "k8s"


class Preflight(str, Enum):  # serve --preflight
    warn = "warn"
    strict = "strict"
    off = "off"


class FailOn(str, Enum):
    warning = "warning"
    blocker = "blocker"


class Color(str, Enum):
    auto = "auto"
    always = "always"
    never = "never"


def finite(low: float, high: float) -> Callable[[Any], float]:
    """A float option's parser: finite and in [low, high]. click's FloatRange lets NaN through (NaN < low
    is false), and `--tpot-budget nan` wrote alerts that can never fire."""

    def parse(text: Any) -> float:
        try:
            return float(in_range(float(text), "", low, high))
        except (TypeError, ValueError, OverflowError, DoctorError) as e:
            raise typer.BadParameter(str(e) if isinstance(e, DoctorError) else f"{text!r} is not a number") from None

    parse.__name__ = "float"  # the metavar (NUMBER) and click's type name
    return parse


# options several commands share, declared once
RulesDirs = Annotated[
    list[Path],
    typer.Option("--rules", help="A directory of extra rules (repeatable).", metavar="DIR", envvar="VLLM_DOCTOR_RULES"),
]
FormatOpt = Annotated[
    Optional[Format],
    typer.Option(
        "--format",
        "-f",
        help="Output format: text, unless -o PATH.json|.md or a setting says.",
        envvar="VLLM_DOCTOR_FORMAT",
    ),
]
OutputOpt = Annotated[
    Optional[str],
    typer.Option(
        "--output",
        "-o",
        help="Write to this file, in the format its suffix names (.json, .md) unless --format says; "
        "-o json|markdown|text names the format, as kubectl's -o does; -o - is stdout (-o ./json for a file named json).",
        metavar="PATH|FORMAT",
    ),
]
ColorOpt = Annotated[
    Color,
    typer.Option(
        "--color", help="Colour: auto (a terminal, unless NO_COLOR is set), always, never.", envvar="VLLM_DOCTOR_COLOR"
    ),
]
StrictRules = Annotated[
    bool, typer.Option("--strict-rules", help="Refuse to run when a --rules file is bad (else: a warning).")
]
FailOnOpt = Annotated[
    FailOn, typer.Option("--fail-on", help="Exit 1 from this severity up.", envvar="VLLM_DOCTOR_FAIL_ON")
]
NoRedactOpt = Annotated[
    bool, typer.Option("--no-redact", help="Keep tokens, API keys and passwords (masked in every format by default).")
]
NoGpuOpt = Annotated[bool, typer.Option("--no-gpu", help="Skip the NVML snapshot of this machine's GPUs.")]
# the vllm serve command line of check and serve
ModelArgs = typer.Argument(
    help="The model and the vllm serve arguments, after --.", metavar="-- MODEL [ARG]...", show_default=False
)
# plan's KV budget: vLLM's own flags, instead of GPU memory x utilization
BlockSizeOpt = Annotated[
    Optional[int], typer.Option("--block-size", min=1, max=MAX_HEADS, help="Tokens per KV block (16; CPU 128).")
]
KvCacheMemoryOpt = Annotated[
    Optional[str], typer.Option("--kv-cache-memory-bytes", help="The KV space per GPU, as vLLM's flag (or 4GiB).")
]
CpuKvSpaceOpt = Annotated[
    Optional[str], typer.Option("--cpu-kvcache-space", help="VLLM_CPU_KVCACHE_SPACE: the CPU KV space, whole GiB.")
]
OfflineOpt = Annotated[bool, typer.Option("--offline", help="Never touch the network (the HF cache only).")]
TargetConcurrency = Annotated[
    Optional[int],
    typer.Option(
        "--target-concurrency",
        min=1,
        help="Sequences the server must hold at once.",
        metavar="N",
        envvar="VLLM_DOCTOR_TARGET_CONCURRENCY",
    ),
]

# explain's own
TargetLen = Annotated[
    Optional[int],
    typer.Option(
        "--target-len",
        min=1,
        help="Tokens per sequence for --target-concurrency.",
        metavar="N",
        envvar="VLLM_DOCTOR_TARGET_LEN",
    ),
]
FollowOpt = Annotated[
    bool,
    typer.Option(
        "--follow",
        help="Read one stream (- for stdin) as it arrives, a file as tail -f does (until Ctrl-C or SIGTERM): "
        "a line per diagnosis as it appears, the report at the end.",
    ),
]
MetricsOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--metrics",
        help="Diagnose a running server from its /metrics (a URL, or a saved scrape); repeat it for a window "
        "of scrapes, oldest first (rates and percentiles need two or more).",
        metavar="URL",
    ),
]
PrometheusOpt = Annotated[
    Optional[str],
    typer.Option("--prometheus", help="Diagnose every replica from Prometheus over a window.", metavar="URL"),
]
SinceOpt = Annotated[Optional[str], typer.Option("--since", help="--prometheus: the window ending now (1h).")]
StartOpt = Annotated[Optional[str], typer.Option("--start", help="--prometheus: the window's start (RFC 3339).")]
EndOpt = Annotated[Optional[str], typer.Option("--end", help="--prometheus: the window's end (RFC 3339).")]
SelectorOpt = Annotated[
    Optional[str], typer.Option("--selector", help="--prometheus: label matchers, e.g. '{namespace=\"llm\"}'.")
]
TpotBudget = Annotated[
    Optional[float],
    typer.Option("--tpot-budget", parser=finite(0.001, 1e9), help="Inter-token latency p95 allowed, in ms."),
]
TtftBudget = Annotated[
    Optional[float],
    typer.Option("--ttft-budget", parser=finite(0.001, 1e9), help="Time to first token p95 allowed, in ms."),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Text: print the verdict line only.")]
VerboseOpt = Annotated[
    bool, typer.Option("--verbose", "-v", help="Text: every reason, number and evidence line, the model, the GPUs.")
]
FlavorOpt = Annotated[
    Flavor, typer.Option("--flavor", help="Markdown: plain (GitHub, GitLab, Jira) or github (evidence in <details>).")
]
ModelOpt = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        help="The model's repo id or directory, for its config.json (default: the log's).",
        metavar="ID|PATH",
    ),
]
ConfigOpt = Annotated[
    Optional[str], typer.Option("--config", help="Use this config.json for the model.", metavar="FILE")
]
ThisHostOpt = Annotated[
    bool,
    typer.Option(
        "--this-host",
        help="The log is from this machine: its GPUs now inform the fixes (else only when the log's "
        "hostname or GPU pids are this machine's).",
    ),
]
LifetimeOpt = Annotated[
    str,
    typer.Option(
        "--lifetime",
        help="A log with restarts: lead with the latest start (last), show every start (all), or start N.",
        metavar="last|all|N",
    ),
]

UNKNOWN_EXIT = 4  # no vLLM output, an empty input, a start that stops with no sign of why


def exit_code(report, fail_on: FailOn) -> int:
    """1 when a diagnosis reaches the --fail-on severity, 4 when the status is unknown, else 0."""
    failing = {"blocker"} if fail_on is FailOn.blocker else {"blocker", "warning"}
    if {d.severity for d in report.diagnoses} & failing:
        return 1
    return UNKNOWN_EXIT if report.status == "unknown" else 0


def verbosity(quiet: bool, verbose: bool) -> int:
    """-q -> -1 (the verdict line), -v -> 1 (everything), neither -> 0 (the answer)."""
    if quiet and verbose:
        fail("give -q or -v, not both")
    return -1 if quiet else int(verbose)


def lifetime_index(value: str) -> int | None:
    """--lifetime last|all|N: the start the report leads with (None: the latest)."""
    if value in ("last", "all"):
        return None
    if value.isdigit() and int(value) >= 1:
        return int(value)
    fail(f"--lifetime {value}: give last, all or a start's number (1, 2, ...)")
    return None


def say(line: str, err: bool = True) -> None:
    """A line of ours on stderr (or stdout): what it quotes from the input (a log line, a /metrics
    body, Prometheus' error, an argument) with its control characters as escapes (render/visible.py)."""
    from vllm_doctor.render.visible import visible

    typer.echo(visible(line), err=err)


def fail(message: str) -> None:
    """One clear line on stderr and exit status 2; never a traceback."""
    say(f"vllm-doctor: {message}")
    raise typer.Exit(2)


def load_rules(extra: list[Path], strict: bool = False, kinds: frozenset | None = None):
    """The built-in rules (of `kinds`, else all) and the --rules files; a bad file (an id already taken
    without `replaces`, too) is one warning and left out (the built-in rules still run), or with
    --strict-rules the one-line error and exit 2. Each directory that added a rule is named on stderr."""
    from vllm_doctor.knowledge.rulebook import load

    def skip(e: Exception) -> None:
        say(f"vllm-doctor: {e} (skipped: the other rules run; --strict-rules refuses)")

    from vllm_doctor.cli.sources import announce_rules

    rules = load(extra, skip=None if strict else skip, kinds=kinds)
    announce_rules(rules)  # each --rules directory that added or replaced a rule, on stderr
    return rules


def target(ctx: typer.Context, format: Format | None, output: str | None, color: Color):
    """(format, path): --format on the command line wins, then -o's suffix, then the settings'.
    --color takes effect here too, before anything is printed."""
    from vllm_doctor.cli.output import resolve
    from vllm_doctor.cli.settings import apply_color

    apply_color(color.value)
    given = ctx.get_parameter_source("format")
    flag = format.value if format is not None and given is not None and given.name == "COMMANDLINE" else None
    return resolve(flag, output, format.value if format is not None else "text")


def show_version(value: bool) -> None:
    """--version: eager, so it answers before a command is asked for."""
    if value:
        from vllm_doctor import __version__

        typer.echo(f"vllm-doctor {__version__}")
        raise typer.Exit(0)
