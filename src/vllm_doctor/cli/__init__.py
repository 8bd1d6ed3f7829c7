"""The command line: the thin typer commands and what only they need.

This folder owns the commands (commands.py: explain, watch, alerts, rules; start.py: check, serve,
plan), the options they share (options.py), the defaults from VLLM_DOCTOR_* variables and
vllm-doctor.toml (settings.py) and their naming on stderr and in the report (sources.py), where a document goes (output.py), explain --follow (follow.py)
and the running server's report from its scrapes or Prometheus (fleet.py). It is the top of the
stage order and may import every stage and pipeline; nothing imports it but __main__ and the
`vllm-doctor` entry point (pyproject.toml). The order is checked by `lint-imports` (.importlinter).
"""

__all__ = ["app", "main"]


def __getattr__(name: str):
    # lazily: the entry point (complete.py) answers a shell's TAB from this package without typer
    if name in __all__:
        from vllm_doctor.cli import commands

        return getattr(commands, name)
    raise AttributeError(name)
