"""The attack shapes of issue 10 as generators, shared by the tests (small sizes), bench/fuzz.py
(random sizes) and bench/attacks.py (full sizes, peak RSS): each one hides one real blocker
where a reader that cuts corners loses it.

Every generator returns the bytes of a log whose diagnosis must be `failed`, with BLOCKER_RULE
among the diagnoses.
"""

from __future__ import annotations

import gzip
import random

# one line that is a blocker on its own, wherever it sits
BLOCKER = (
    "(EngineCore_DP0 pid=1) ERROR 11-30 01:54:29 [core.py:1510] torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free."
)
BLOCKER_RULE = "cuda-oom-after-weights"
STARTUP = [
    "(APIServer pid=1) INFO 11-30 01:53:24 [api_utils.py:347] version 0.32.0",
    "(APIServer pid=1) INFO 11-30 01:53:24 [utils.py:253] non-default args: {'model': '/models/x', 'max_model_len': 8192}",
    "(EngineCore_DP0 pid=1) INFO 11-30 01:53:29 [gpu_model_runner.py:3000] Starting to load model /models/x...",
]
# benign lines full of the words the rules' anchors are made of (config, backend, failure, group,
# available, tokenizer, Running: ...): every one is a candidate line for many rules
DENSE = [
    "(APIServer pid=1) INFO 11-30 02:00:{s:02d} [logger.py:49] Received request cmpl-{i}: prompt: 'my config "
    "of the backend group ran out of memory; no failure, the tokenizer for url module. is fine', params: "
    "SamplingParams(n=1, temperature=0.7, max_tokens=64), lora_request: None.",
    "(APIServer pid=1) WARNING 11-30 02:00:{s:02d} [serving.py:90] request {i}: the backend said 'failure of "
    "config for group {i}: host out of memory, not available on device ordinal 0', retrying with the compiler",
    "(EngineCore_DP0 pid=1) INFO 11-30 02:00:{s:02d} [loggers.py:335] Engine 000: Running: 3 reqs, Waiting: 0 "
    "reqs, GPU KV cache usage: 12.5%, dtype: bfloat16, method: fork, symbol: none, Killed: 0, the bus is idle",
]
STATS = (
    "(APIServer pid=1) INFO 11-30 02:{m:02d}:{s:02d} [loggers.py:335] Engine 000: Avg prompt throughput: "
    "{p:.1f} tokens/s, Avg generation throughput: {g:.1f} tokens/s, Running: {r} reqs, Waiting: {w} reqs, "
    "GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: 12.0%"
)


def _text(lines: list[str], end: str = "\n") -> bytes:
    return ("".join(line + end for line in lines)).encode()


def cr_only(lines: int = 2000) -> bytes:
    """Every line ended by a bare CR (old Mac, some terminal captures), the blocker last."""
    body = [*STARTUP, *(_added(i) if i % 10 else DENSE[0].format(s=i % 60, i=i) for i in range(lines)), BLOCKER]
    return _text(body, "\r")


def _added(i: int) -> str:
    return f"(APIServer pid=1) INFO 11-30 02:00:{i % 60:02d} [async_llm.py:383] Added request cmpl-{i}."


def tqdm_glued(updates: int = 200) -> bytes:
    """A progress bar redrawn `updates` times with CR on one line, the failure glued after the
    last redraw with no newline between (the process died mid-bar)."""
    bar = "".join(
        f"\rLoading safetensors checkpoint shards: {100 * k // updates:3d}% Completed | {k}/{updates} "
        f"[00:{k % 60:02d}<00:00, 3.{k % 10}it/s]"
        for k in range(updates + 1)
    )
    return _text(STARTUP) + (bar + BLOCKER + "\n").encode() + _text(["(APIServer pid=1) INFO shutting down"])


def dense(lines: int = 60_000) -> bytes:
    """Benign lines holding common anchor words (each a candidate for many rules), the blocker at the end."""
    body = [DENSE[i % len(DENSE)].format(s=i % 60, i=i) for i in range(lines)]
    return _text([*STARTUP, *body, BLOCKER])


def stats(samples: int = 1_000_000, seed: int = 0) -> bytes:
    """A long healthy run: a stats line every few seconds, `samples` of them, then the blocker."""
    rng = random.Random(seed)
    out = bytearray(_text(STARTUP))
    chunk = []
    for i in range(samples):
        chunk.append(
            STATS.format(
                m=(i // 60) % 60,
                s=i % 60,
                p=rng.uniform(100, 900),
                g=rng.uniform(100, 900),
                r=rng.randint(1, 8),
                w=0,
                kv=rng.uniform(5, 60),
            )  # fmt: skip
        )
        if len(chunk) == 10_000:
            out += _text(chunk)
            chunk = []
    out += _text([*chunk, BLOCKER])
    return bytes(out)


def nul_lead(nuls: int = 1000) -> bytes:
    """A run of NULs before the log: logrotate's copytruncate leaves the writer's old offset as a
    hole, which reads as NULs (a thousand, or megabytes)."""
    return b"\0" * nuls + _text([*STARTUP, BLOCKER])


def nul_holes(holes: int = 5, size: int = 4096, seed: int = 0) -> bytes:
    """NUL runs between lines (a file truncated and written again more than once)."""
    rng = random.Random(seed)
    out = bytearray()
    for i in range(holes):
        out += b"\0" * rng.randint(size // 2, size) + _text([DENSE[0].format(s=i, i=i)] * rng.randint(1, 50))
    return bytes(out + _text([BLOCKER]))


# the records of DENSE glued into one line, as a paste that lost its newlines has them, less the
# request log: what follows a request log's head is the user's prompt and is never matched (issue
# 15, class 10), so a failure glued after one is data too: the safe side for planted text
GLUED = " ".join(DENSE[1:]).format(s=1, i=1) + " "


def megaline(size: int = 1 << 20, failure_at_end: bool = True) -> bytes:
    """One line of `size` bytes, anchor words all along it (a paste that lost its newlines), the
    failure at its end: a reader that matches only around the first anchor misses it."""
    piece = GLUED
    body = piece * (size // len(piece))
    return _text(STARTUP) + ((body + BLOCKER) if failure_at_end else (BLOCKER + body)).encode() + b"\n"


def multi_member_gzip(members: int = 5) -> bytes:
    """`cat a.gz b.gz > c.gz` (rotated logs joined): every member is read, the blocker is in the last."""
    parts = [gzip.compress(_text([DENSE[0].format(s=i, i=i)] * 100)) for i in range(members - 1)]
    return b"".join([*parts, gzip.compress(_text([BLOCKER]))])


def damaged_gzip(lines: int = 50_000) -> bytes:
    """A gzip member whose end was lost and garbage after it, the blocker well before the damage."""
    blob = gzip.compress(_text([*STARTUP, BLOCKER, *(_added(i) for i in range(lines))]))
    return blob[: len(blob) - 7] + b"garbage"


SHAPES = {
    "cr-only": cr_only,
    "tqdm-glued": tqdm_glued,
    "dense-anchors": dense,
    "stats-lines": stats,
    "nul-lead": nul_lead,
    "nul-holes": nul_holes,
    "megabyte-line": megaline,
    "multi-member-gzip": multi_member_gzip,
    "gzip-damaged-tail": damaged_gzip,
}


def random_shape(rng: random.Random, heavy: bool = False) -> tuple[str, bytes, str]:
    """One attack shape at a random size (megabytes when `heavy`), sometimes gzipped or with
    CRLF line ends: (kind, bytes, file suffix). Every one must come out failed with BLOCKER."""
    big = 4 if heavy else 1
    kind = rng.choice(sorted(SHAPES))
    if kind == "cr-only":
        data = cr_only(rng.randint(0, 3000))
    elif kind == "tqdm-glued":
        data = tqdm_glued(rng.choice((1, 50, 200, 2000)) * big)
    elif kind == "dense-anchors":
        data = dense(rng.randint(50, 800) * big)
    elif kind == "stats-lines":
        data = stats(rng.randint(1, 4000) * big, seed=rng.randrange(1000))
    elif kind == "nul-lead":
        data = nul_lead(rng.choice((16, 1000, 4096, 100_000, 1 << 20)) * big)
    elif kind == "nul-holes":
        data = nul_holes(rng.randint(1, 12), rng.choice((16, 300, 5000)), seed=rng.randrange(1000))
    elif kind == "megabyte-line":
        data = megaline(rng.choice((20_000, 200_000, 1 << 20)) * big, failure_at_end=rng.random() < 0.8)
    elif kind == "multi-member-gzip":
        return kind, multi_member_gzip(rng.randint(2, 8)), ".log.gz"
    else:
        return kind, damaged_gzip(rng.randint(0, 5000)), ".log.gz"
    if kind not in ("cr-only", "tqdm-glued") and rng.random() < 0.2:
        data, kind = data.replace(b"\n", b"\r\n"), kind + "+crlf"
    if rng.random() < 0.2:
        return kind + "+gzip", gzip.compress(data, compresslevel=1), ".log.gz"
    return kind, data, ".log"
