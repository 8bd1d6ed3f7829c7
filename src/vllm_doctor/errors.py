"""The one error type a user sees: its message is the whole story, printed as one line.

Every stage raises a subclass of DoctorError for input it cannot use (an unreadable log, a bad
rule file, a config.json that is not JSON, a /metrics URL that does not answer); the CLI prints
`vllm-doctor: <message>` and exits 2. Anything else escaping is our bug (exit 3).

The limits on a user's input live here too, so that every stage checks them before it parses or
counts anything (issue 25): a file read whole only up to a size (read_bounded), a number only when
finite and within a sane range (in_range). A 1 GiB sparse settings file took 2 GB and half a minute
before its parse error, `-tp 10**18` counted TP sizes to 10**18, `num_hidden_layers: 1e8` built a
list of 10**8 layers: each is now one line, said before the work starts.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path


class DoctorError(Exception):
    """Bad input or an unusable environment, explained in one line for the user."""


MIB = 1 << 20
# sane maxima, far above any real start or model (the largest clusters hold thousands of GPUs,
# the deepest models a few hundred layers, the widest 128 heads)
MAX_GPUS = 4096
MAX_TP = 4096
MAX_LAYERS = 10_000
MAX_HEADS = 1 << 16
MAX_WIDTH = 1 << 24  # hidden size, head size, vocabulary, experts
MAX_TOKENS = 1 << 40  # a sequence length, a batch of tokens
MAX_BYTES = float(1 << 60)  # a memory size (an exabyte)
MAX_INT = 1 << 53  # any other count: what a float still holds exactly


class TooLarge(DoctorError):
    """A file past its size limit; the message says its size and the limit."""


def read_bounded(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The whole file, or TooLarge when it holds more than `limit` bytes. A regular file's size is
    asked first (a sparse GiB is refused without a read); a FIFO or device is read to limit + 1."""
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        if stat.S_ISREG(st.st_mode) and st.st_size > limit:
            raise TooLarge(_too_large(st.st_size, limit, what))
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(_too_large(None, limit, what))
    return data


def read_text_bounded(path: str | Path, limit: int, what: str = "file") -> str:
    """read_bounded as UTF-8 text (UnicodeDecodeError as str.decode raises it)."""
    return read_bounded(path, limit, what).decode("utf-8")


def _too_large(size: int | None, limit: int, what: str) -> str:
    held = f"{size:,} bytes" if size is not None else f"more than {limit:,} bytes"
    most = f"{limit // MIB} MiB" if limit >= MIB else f"{limit:,} bytes"
    return f"{held}: larger than a {what} may be (at most {most})"


def in_range(
    value: float | int,
    what: str,
    low: float,
    high: float,
    *,
    whole: bool = False,
    error: type[DoctorError] = DoctorError,
) -> float | int:
    """`value` when it is finite (and whole, with `whole`) and within [low, high]; else `error`
    whose one-line message names `what` and the range."""
    shown = f"{what} {_shown(value)}".strip()
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range (10**400)
        number = math.inf if value > 0 else -math.inf
    except (TypeError, ValueError):
        raise error(f"{shown}: not a number") from None
    if not math.isfinite(number):
        raise error(f"{shown}: not a finite number")
    if whole and number != int(number):
        raise error(f"{shown}: not a whole number")
    if not low <= number <= high:
        raise error(f"{shown}: give {'a whole number' if whole else 'a number'} from {_g(low)} to {_g(high)}")
    # an int stays exact; a text or float is the number it read as ("1e-400" is 0, no int() literal)
    return (value if isinstance(value, int) else int(number)) if whole else number


def _g(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e7 else f"{x:.3g}"


def _shown(value: object) -> str:
    """The value as given, cut: a 400-digit integer is not printed whole."""
    try:
        text = str(value)
    except ValueError:  # an int past Python's digit limit
        return "(a number of thousands of digits)"
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} characters)"
