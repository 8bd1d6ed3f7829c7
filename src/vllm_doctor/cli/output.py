"""Where a report or a plan goes: stdout or `-o PATH`, in the format asked for or the one the
path's suffix names, and a closed stdout (`| head`) that ends the output quietly, never the run.

`-o` as kubectl reads it: `-o json`, `-o markdown`, `-o md` or `-o text` name the format (on
stdout), `-o -` is stdout; another bare word (`-o yaml`) is refused with the formats; anything
else is a path (`-o ./json` for a file named json). A path ending in `.json`
or `.md` infers the format unless --format says otherwise.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from pathlib import Path
from typing import Any

from vllm_doctor.errors import DoctorError
from vllm_doctor.render import FORMAT_NAMES, SUFFIXES  # the format table: render/__init__.py


def resolve(fmt: str | None, output: str | None, default: str = "text") -> tuple[str, Path | None]:
    """(format, path or None for stdout). `fmt` is --format when given on the command line;
    `default` is the format from the environment, the config file or the built-in text."""
    if output == "":
        raise DoctorError(f"-o: give a path (or a format: {', '.join(sorted(set(FORMAT_NAMES.values())))})")
    named, path = target(output, FORMAT_NAMES)
    if named is not None:
        if fmt is not None and fmt != named:
            raise DoctorError(f"-o {output} names the format {named}, but --format is {fmt}: give one")
        return named, None
    if fmt is not None:
        return fmt, path
    if path is not None and path.suffix.lower() in SUFFIXES:
        return SUFFIXES[path.suffix.lower()], path
    return default, path


def target(output: str | None, names: dict[str, str]) -> tuple[str | None, Path | None]:
    """-o as kubectl reads it: (the format a word in `names` names, None) or (None, the path);
    `-` and no -o are stdout, (None, None). A word that names no format and has no path form
    (`-o yaml`, `-o wide`: no `/`, no `.`) is refused with the formats: a typo of one, or a
    file name that `-o ./yaml` says is meant."""
    if output is None or output == "-":
        return None, None
    if output.lower() in names:
        return names[output.lower()], None
    if re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", output):
        formats = ", ".join(dict.fromkeys(names.values()))
        raise DoctorError(f"-o {output}: not a format ({formats}); for a file of that name give -o ./{output}")
    return None, Path(output)


def write(text: str, path: Path | None, done: str) -> None:
    """`text` on stdout (a closed one ends it quietly), or in `path`, said on stderr as `done`."""
    if path is None:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            quiet_closed_stdout()
        return
    _save(path, text)
    _note(f"vllm-doctor: {done} written to {path}")


def _note(line: str) -> None:
    """A line on stderr; a path or headline from the input with its control characters as escapes."""
    from vllm_doctor.render.visible import visible

    print(visible(line), file=sys.stderr)


def _save(path: Path, text: str, beside: bool = False) -> None:
    """`beside`: a file named after the report (report.memory.svg), not by the operator: opened
    O_NOFOLLOW, so a symlink planted at that name is refused rather than written through."""
    try:
        if not beside:
            path.write_text(text, encoding="utf-8")
            return
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        with os.fdopen(os.open(path, flags, 0o666), "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        why = "a symbolic link, not followed" if e.errno == errno.ELOOP else e.strerror or e
        raise DoctorError(f"{path}: cannot write ({why})") from None


def quiet_closed_stdout() -> None:
    """The reader of stdout went away (`| head -1`): point fd 1 at /dev/null so that the rest of
    the output and the flush at exit go nowhere, without a BrokenPipeError or its traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def emit(
    doc: Any, fmt: str, path: Path | None, redact: bool = True, done: str | None = None, verbosity: int = 0,
    flavor: str = "plain",
) -> None:  # fmt: skip
    """Print `doc` (a Report or a Plan) in `fmt`, or write it to `path` and say so on stderr. A
    closed stdout stops the output; the exit status stays the diagnosis's."""
    from vllm_doctor.data import Report
    from vllm_doctor.render import render

    try:
        if fmt == "text" and path is None and isinstance(doc, Report):
            from vllm_doctor.render.text import show

            show(doc, redact=redact, verbosity=verbosity)  # in colour where the terminal takes it
            return
        text = render(doc, fmt, redact=redact, verbosity=verbosity, flavor=flavor)
        if path is None:
            write(text, None, "")
            return
    except BrokenPipeError:
        quiet_closed_stdout()
        return
    pictures: list[tuple[Path, str]] = []
    if fmt == "markdown" and isinstance(doc, Report):  # the SVGs beside it, linked from it
        from vllm_doctor.render.html import beside

        text, pictures = beside(doc, path, text, redact)
    for target, content in pictures:
        _save(target, content, beside=True)
    _save(path, text)
    if done is None:
        from vllm_doctor.render.summary import headline

        done = f"{headline(doc)}; report"
    _note(f"vllm-doctor: {done} written to {path}")
    if pictures:
        _note(f"vllm-doctor: pictures written to {', '.join(str(p) for p, _ in pictures)}")
