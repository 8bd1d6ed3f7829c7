"""The command line: thin commands that parse options and call the library."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Explain why vllm serve failed or queues requests: the cause, the numbers and the fixes in order.",
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


class FailOn(str, Enum):
    warning = "warning"
    blocker = "blocker"


def fail(message: str) -> None:
    """One clear line on stderr and exit status 2; never a traceback."""
    typer.echo(f"vllm-doctor: {message}", err=True)
    raise typer.Exit(2)


def _load_rules(extra: list[Path]):
    from .rules import RuleError, load

    try:
        return load(extra)
    except RuleError as e:
        fail(str(e))


@app.command()
def explain(
    paths: Annotated[
        list[str], typer.Argument(help="Log files (.gz works too); - reads stdin.", metavar="LOG", show_default=False)
    ],
    format: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.text,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report here.")] = None,
    rules_dirs: Annotated[list[Path], typer.Option("--rules", help="A directory of extra rules (repeatable).")] = [],  # noqa: B006
    fail_on: Annotated[FailOn, typer.Option("--fail-on", help="Exit 1 from this severity up.")] = FailOn.blocker,
    target_concurrency: Annotated[
        Optional[int], typer.Option("--target-concurrency", min=1, help="Sequences the server must hold at once.")
    ] = None,
    target_len: Annotated[
        Optional[int], typer.Option("--target-len", min=1, help="Tokens per sequence for --target-concurrency.")
    ] = None,
) -> None:
    """Diagnose a vLLM log: the cause, the evidence, the numbers and the fixes in order."""
    from .checks import Options
    from .explain import explain as run
    from .logread import ReadError

    rules = _load_rules(rules_dirs)
    try:
        report = run(paths, rules, Options(target_concurrency, target_len))
    except ReadError as e:
        fail(str(e))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    _emit(report, format, output)
    severities = {d.severity for d in report.diagnoses}
    failing = {"blocker"} if fail_on is FailOn.blocker else {"blocker", "warning"}
    raise typer.Exit(1 if severities & failing else 0)


def _emit(report, format: Format, output: Path | None) -> None:
    from . import report as rep

    if format is Format.text and output is None:
        from .terminal import render

        render(report)
        return
    if format is Format.json:
        text = rep.to_json(report)
    elif format is Format.markdown:
        text = rep.to_markdown(report)
    else:
        import io

        from .terminal import render

        buf = io.StringIO()
        render(report, file=buf)
        text = buf.getvalue()
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as e:
        fail(f"{output}: cannot write ({e.strerror or e})")
    typer.echo(f"vllm-doctor: {rep.headline(report)}; report written to {output}", err=True)


@rules_app.callback()
def rules_list(
    ctx: typer.Context,
    rules_dirs: Annotated[list[Path], typer.Option("--rules", help="A directory of extra rules.")] = [],  # noqa: B006
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
    rules_dirs: Annotated[list[Path], typer.Option("--rules", help="A directory of extra rules.")] = [],  # noqa: B006
) -> None:
    """Print one rule's documentation, generated from its file."""
    from .ruledoc import document

    rules = {r.id: r for r in _load_rules(rules_dirs)}
    if rule_id not in rules:
        fail(f"no rule {rule_id!r}; `vllm-doctor rules` lists them")
    typer.echo(document(rules[rule_id]))


@rules_app.command("check")
def rules_check(directory: Annotated[Path, typer.Argument(help="A directory of rule files.")]) -> None:
    """Validate every rule file in a directory; one line per problem."""
    from .ruledoc import check_dir

    problems, count = check_dir(directory)
    for p in problems:
        typer.echo(p, err=True)
    if problems:
        raise typer.Exit(2)
    typer.echo(f"{count} rule file(s) OK")


def main() -> None:
    """Run the CLI; usage errors and internal errors are one line on stderr, not a traceback."""
    try:
        code = app(prog_name="vllm-doctor", standalone_mode=False)
    except typer.Abort:
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
    typer.echo(f"vllm-doctor: internal error: {type(e).__name__}: {e} (set VLLM_DOCTOR_DEBUG=1 for the traceback)", err=True)
    return 3
