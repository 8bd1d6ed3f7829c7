"""Whole lines by number, for `-v`: an evidence line is cut at EVIDENCE_CHARS while the log is
matched (memory stays flat however long a line is), and `explain -v` promises it in full, so
the lines that were cut are read again, numbered as logread numbers them (the same Source: gzip,
NUL holes dropped, CR-only line ends made LF), and cleaned as it cleans them (colour codes
out). Only files can be read twice: stdin and FIFOs keep the cut text.
"""

from __future__ import annotations

import os
import stat

from vllm_doctor.read.candidates import clean
from vllm_doctor.read.source import Source, open_input

BLOCK = 1 << 20


def rereadable(path: str) -> bool:
    try:
        return path != "-" and stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def whole(path: str, wanted: set[int]) -> dict[int, str]:
    """Line number -> the whole line (as evidence holds it: colour codes out, stripped) of
    `wanted` in the file at `path`; {} when it cannot be read again."""
    if not wanted or not rereadable(path):
        return {}
    stream, owned = open_input(path)
    out: dict[int, bytearray] = {}
    last = max(wanted)
    try:
        src, buf, no = Source(stream, path, []), bytearray(BLOCK), 1
        while no <= last and (n := src.fill(buf, 0)):
            start = 0
            while start < n and no <= last:
                end = buf.find(b"\n", start, n)
                piece = buf[start : n if end < 0 else end]
                if no in wanted:
                    out.setdefault(no, bytearray()).extend(piece)
                if end < 0:
                    break
                no, start = no + 1, end + 1
    except Exception:  # best effort: the cut text stays
        return {}
    finally:
        if owned:
            stream.close()
    return {k: clean(bytes(v))[0].strip() for k, v in out.items()}
