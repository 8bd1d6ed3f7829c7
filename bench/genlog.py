"""Write a realistic vLLM server log of a given size, for the benchmark.

The log is what a vLLM 0.32 server with request logging leaves after a long run: the real startup
of fixtures/lab/queue-saturation.log, then hours of traffic (a `Received request` line with the
prompt and sampling params, an `Added request` line and an access line per request, health and
metrics probes, a stats line every few hundred lines), and near the end the real saturation
episode and shutdown of that recording. `vllm-doctor explain` must find it there: the expected
answer (category and the line numbers of its evidence) is written beside the log as JSON.

    python bench/genlog.py bench/out/1g.log --size 1GiB

Seeded: the same size gives the same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "fixtures" / "lab" / "queue-saturation.log"
VERSION = 1  # bump when the output changes, so cached logs are rebuilt
PID = 16373

PROMPTS = [
    "Summarise the following support ticket in two sentences:",
    "Translate to German: The delivery will arrive on Tuesday.",
    "Write a SQL query that returns the ten most recent orders per customer.",
    "You are a helpful assistant. Answer briefly. What is the capital of Australia?",
    "Classify the sentiment of this review: the battery died after two days.",
    "Extract the invoice number and the total from the text below.",
    "Continue the story: the lighthouse keeper found a letter under the door",
    "Explain the difference between a process and a thread to a new engineer.",
    "Generate three subject lines for a newsletter about spring gardening.",
    "def fibonacci(n):\n    # complete this function",
]
ROUTES = ["/v1/completions", "/v1/chat/completions", "/v1/chat/completions", "/v1/completions"]

_STAMP = re.compile(rb"\d\d-\d\d \d\d:\d\d:\d\d")


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B?|B)?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 100MiB, 1GiB)")
    unit = (m.group(2) or "B").upper().rstrip("B").rstrip("I")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit])


class Clock:
    """Seconds since the recording's start, printed as vLLM does (MM-DD HH:MM:SS)."""

    def __init__(self) -> None:
        self.start = datetime(2025, 11, 30, 1, 58, 40)  # after the recorded startup
        self.t = 0.0
        self._cached = (-1, "")

    def stamp(self) -> str:
        sec = int(self.t)
        if sec != self._cached[0]:
            self._cached = (sec, (self.start + timedelta(seconds=sec)).strftime("%m-%d %H:%M:%S"))
        return self._cached[1]


def traffic(rng: random.Random, clock: Clock):
    """Lines of a healthy server under load, forever."""
    since_stats = 0
    stats_every = rng.randint(200, 400)
    while True:
        clock.t += rng.random() * 0.2
        ts = clock.stamp()
        rid = f"{rng.getrandbits(128):032x}"
        route = rng.choice(ROUTES)
        kind = "chatcmpl" if "chat" in route else "cmpl"
        prompt = rng.choice(PROMPTS)
        ntok = rng.randint(8, 60)
        token_ids = ", ".join(str(rng.randint(2, 32000)) for _ in range(ntok))
        temp = rng.choice((0.0, 0.2, 0.7, 1.0))
        max_tokens = rng.choice((16, 64, 128, 256, 512))
        yield (
            f"(APIServer pid={PID}) INFO {ts} [logger.py:49] Received request {kind}-{rid}: "
            f"prompt: {prompt!r}, params: SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, "
            f"repetition_penalty=1.0, temperature={temp}, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[], "
            f"stop_token_ids=[], bad_words=[], include_stop_str_in_output=False, ignore_eos=False, "
            f"max_tokens={max_tokens}, min_tokens=0, logprobs=None, prompt_logprobs=None, skip_special_tokens=True, "
            f"spaces_between_special_tokens=True, truncate_prompt_tokens=None, structured_outputs=None, "
            f"extra_args=None), prompt_token_ids: [1, {token_ids}], prompt_embeds shape: None, lora_request: None."
        )
        yield f"(APIServer pid={PID}) INFO {ts} [async_llm.py:383] Added request {kind}-{rid}."
        yield f'INFO:     127.0.0.1:{rng.randint(32768, 60999)} - "POST {route} HTTP/1.1" 200 OK'
        since_stats += 3
        if rng.random() < 0.05:
            probe = rng.choice(("/metrics", "/health", "/v1/models"))
            yield f'INFO:     127.0.0.1:{rng.randint(32768, 60999)} - "GET {probe} HTTP/1.1" 200 OK'
            since_stats += 1
        if since_stats >= stats_every:
            since_stats = 0
            stats_every = rng.randint(200, 400)
            yield (
                f"(APIServer pid={PID}) INFO {clock.stamp()} [loggers.py:335] Engine 000: "
                f"Avg prompt throughput: {rng.uniform(200, 900):.1f} tokens/s, "
                f"Avg generation throughput: {rng.uniform(300, 1200):.1f} tokens/s, "
                f"Running: {rng.randint(1, 6)} reqs, Waiting: 0 reqs, "
                f"CPU KV cache usage: {rng.uniform(5, 45):.1f}%, Prefix cache hit rate: {rng.uniform(0, 30):.1f}%"
            )


def generate(out: Path, size: int, seed: int = 0) -> dict:
    """Write the log; returns what explain should find (also written to OUT.json)."""
    lines = SOURCE.read_bytes().split(b"\n")
    split = next(i for i, x in enumerate(lines) if b"Application startup complete" in x) + 1
    head, tail = lines[:split], lines[split:]
    if tail and tail[-1] == b"":
        tail.pop()
    rng = random.Random(seed)
    clock = Clock()
    tail_bytes = sum(len(x) + 1 for x in tail)
    budget = max(0, size - sum(len(x) + 1 for x in head) - tail_bytes)
    count = len(head)
    with open(out, "wb") as f:
        f.write(b"\n".join(head) + b"\n")
        written = 0
        batch: list[str] = []
        batch_bytes = 0
        for line in traffic(rng, clock):
            batch.append(line)
            batch_bytes += len(line) + 1
            if written + batch_bytes >= budget or len(batch) >= 20000:
                data = ("\n".join(batch) + "\n").encode()
                if written + len(data) > budget:  # trim the last batch to the budget, on a line end
                    data = data[: data.rfind(b"\n", 0, max(1, budget - written)) + 1]
                f.write(data)
                written += len(data)
                count += data.count(b"\n")
                batch, batch_bytes = [], 0
                if written + 512 >= budget:
                    break
        first_tail = count + 1
        for i, x in enumerate(tail):  # the recorded episode, stamped on from the traffic's clock
            clock.t += 0.5 if b"loggers.py" in x else 0.01
            tail[i] = _STAMP.sub(clock.stamp().encode(), x, count=1)
        f.write(b"\n".join(tail) + b"\n")
        count += len(tail)
    src = SOURCE.read_bytes().split(b"\n")[split:]
    saturated = [first_tail + i for i, x in enumerate(src) if re.search(rb"Waiting: [1-9]", x)]
    expect = {
        "generator": VERSION,
        "seed": seed,
        "size": out.stat().st_size,
        "lines": count,
        "category": "queue-saturation",
        "evidence_from": saturated[0] if saturated else None,
        "saturated_lines": saturated,
    }
    out.with_suffix(out.suffix + ".json").write_text(json.dumps(expect, indent=1) + "\n")
    return expect


def ensure(out: Path, size: int, seed: int = 0) -> dict:
    """Generate unless a log of this size, seed and generator version is already there."""
    meta = out.with_suffix(out.suffix + ".json")
    if out.exists() and meta.exists():
        try:
            expect = json.loads(meta.read_text())
        except ValueError:
            expect = {}
        if (
            expect.get("generator") == VERSION
            and expect.get("seed") == seed
            and abs(out.stat().st_size - size) < 64 << 10
            and expect.get("size") == out.stat().st_size
        ):
            return expect
    out.parent.mkdir(parents=True, exist_ok=True)
    return generate(out, size, seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", type=parse_size, default=parse_size("100MiB"), help="e.g. 100MiB, 1GiB")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    expect = generate(args.out, args.size, args.seed)
    print(
        f"{args.out}: {expect['size']} bytes, {expect['lines']} lines; expect {expect['category']} "
        f"from line {expect['evidence_from']}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
