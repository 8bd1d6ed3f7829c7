"""The typer options of the running-server commands (explain --metrics / --prometheus and their
window and budgets), declared once; cli.py imports them."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

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
    Optional[float], typer.Option("--tpot-budget", min=0.001, help="Inter-token latency p95 allowed, in ms.")
]
TtftBudget = Annotated[
    Optional[float], typer.Option("--ttft-budget", min=0.001, help="Time to first token p95 allowed, in ms.")
]
