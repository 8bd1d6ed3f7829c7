"""Hypothesis strategies for what a vLLM server prints: stats series of every era's form (any
length, constant or varying, saturated, idle, full with nothing waiting, waiting with an empty
cache, interleaved engines and access lines), and values with any Unicode or number in the places
a log, a config.json or a /metrics page puts them (argument dumps, config lines, model paths,
label values).

The Hypothesis profiles (the suite's fixed search, bench/fuzz.py's long one) are in tests/conftest.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from conftest import LAB

# A real start up to "Application startup complete" (the lab's queue recording: vLLM 0.32 CPU)
START = LAB / "queue-saturation.log"


def start_lines() -> list[str]:
    lines = START.read_text().splitlines()
    return lines[: next(i for i, ln in enumerate(lines) if "Application startup complete" in ln) + 1]


# --- stats lines --------------------------------------------------------------------------------

# each era's stats line (../shared/vllm-reference/messages.toml, category "stats"), with the head
# its logger wrote: {p} {g} prompt and generation throughput, {r} running, {w} waiting, {kv} KV usage
ERAS = {
    "v0-early": "INFO {t} llm_engine.py:706] Avg prompt throughput: {p:.1f} tokens/s, Avg generation throughput: "
    "{g:.1f} tokens/s, Running: {r} reqs, Swapped: 0 reqs, Pending: {w} reqs, GPU KV cache usage: {kv:.1f}%, "
    "CPU KV cache usage: 0.0%",
    "v0": "INFO {t} metrics.py:351] Avg prompt throughput: {p:.1f} tokens/s, Avg generation throughput: {g:.1f} "
    "tokens/s, Running: {r} reqs, Swapped: 0 reqs, Pending: {w} reqs, GPU KV cache usage: {kv:.1f}%, CPU KV cache "
    "usage: 0.0%.",
    "v1-0.7.0": "INFO {t} loggers.py:25] Running: {r} reqs, Waiting: {w} reqs ",
    "v1-0.7.1": "INFO {t} loggers.py:72] Avg prompt throughput: {p:.1f} tokens/s, Avg generation throughput: {g:.1f} "
    "tokens/s, Running: {r} reqs, Waiting: {w} reqs GPU KV cache usage: {kv:.1f}%.",
    "v1-prefix": "INFO {t} [loggers.py:80] Avg prompt throughput: {p:.1f} tokens/s, Avg generation throughput: "
    "{g:.1f} tokens/s, Running: {r} reqs, Waiting: {w} reqs, GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: "
    "41.3%",
    "v1-engine": "INFO {t} [loggers.py:118] Engine {e:03d}: Avg prompt throughput: {p:.1f} tokens/s, Avg generation "
    "throughput: {g:.1f} tokens/s, Running: {r} reqs, Waiting: {w} reqs, GPU KV cache usage: {kv:.1f}%, Prefix cache "
    "hit rate: 0.0%",
    "v1-parts": "(APIServer pid={pid}) INFO {t} [loggers.py:236] Engine {e:03d}: Avg prompt throughput: {p:.1f} "
    "tokens/s, Avg generation throughput: {g:.1f} tokens/s, Running: {r} reqs, Waiting: {w} reqs, Preemptions: 0, "
    "GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: 0.0%",
    "v1-device": "(APIServer pid={pid}) INFO {t} [loggers.py:257] Engine {e:03d}: Avg prompt throughput: {p:.1f} "
    "tokens/s, Avg generation throughput: {g:.1f} tokens/s, Running: {r} reqs, Waiting: {w} reqs, CPU KV cache "
    "usage: {kv:.1f}%, Prefix cache hit rate: 0.0%",
    "v1-colour": "\x1b[1;36m(APIServer pid={pid})\x1b[0;0m INFO {t} [loggers.py:257] Engine {e:03d}: Avg prompt "
    "throughput: {p:.1f} tokens/s, Avg generation throughput: {g:.1f} tokens/s, Running: {r} reqs, Waiting: {w} "
    "reqs, GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: 0.0%",
}
ACCESS = 'INFO:     127.0.0.1:{port} - "POST /v1/chat/completions HTTP/1.1" {status} OK'


@dataclass(frozen=True)
class Sample:
    running: int
    waiting: int
    kv: float
    prompt: float
    gen: float


THROUGHPUT = st.floats(0, 5000)


# the kinds of sample a series is made of: what each queue diagnosis reads
def _sample(running, waiting, kv, prompt=THROUGHPUT, gen=THROUGHPUT) -> st.SearchStrategy[Sample]:
    return st.builds(Sample, running, waiting, kv, prompt, gen)


KINDS = {
    "saturated": _sample(st.integers(1, 512), st.integers(1, 10_000), st.floats(80.0, 100.0)),
    "idle-waiting": _sample(st.just(0), st.integers(1, 500), st.floats(0, 100), st.just(0.0), st.just(0.0)),
    "full-nothing-waiting": _sample(st.integers(1, 512), st.just(0), st.floats(80.0, 100.0)),
    "waiting-empty-cache": _sample(st.integers(0, 512), st.integers(1, 500), st.floats(0, 5.0)),
    "quiet": _sample(st.integers(0, 4), st.just(0), st.floats(0, 30.0)),
    "any": _sample(st.integers(0, 10**9), st.integers(0, 10**9), st.floats(0, 100.0)),
}


ANY_KIND = st.sampled_from(sorted(KINDS))


def runs(kinds: st.SearchStrategy[str] = ANY_KIND, max_runs: int = 6, longest: int = 700):
    """A stats series as runs of one kind each, `count` samples long: one sample repeated (a
    constant stretch) or up to six cycled (varying): [(samples, count)], up to a few thousand."""

    @st.composite
    def build(draw):
        out = []
        for _ in range(draw(st.integers(1, max_runs))):
            kind = draw(kinds)
            count = draw(st.integers(1, longest))
            varying = draw(st.booleans())
            samples = [draw(KINDS[kind]) for _ in range(min(count, 6))] if varying else [draw(KINDS[kind])]
            out.append((samples, count))
        return out

    return build()


def samples_of(series) -> list[Sample]:
    """Every sample of a series of runs, a varying run cycling through its drawn samples."""
    return [samples[i % len(samples)] for samples, count in series for i in range(count)]


def stats_line(era: str, s: Sample, i: int, engine: int = 0, pid: int = 1) -> str:
    t = f"12-01 {i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}"
    return ERAS[era].format(t=t, p=s.prompt, g=s.gen, r=s.running, w=s.waiting, kv=s.kv, e=engine, pid=pid)


@dataclass(frozen=True)
class Serving:
    """How a serving log is laid out: which era prints its stats, whether a real start comes first,
    how many engines print stats, access lines between them."""

    era: str
    start: bool
    engines: int
    access_every: int  # an access line after every Nth stats line (0: none)


servings = st.builds(
    Serving,
    st.sampled_from(sorted(ERAS)),
    st.booleans(),
    st.integers(1, 2),
    st.sampled_from([0, 0, 1, 3]),
)


def serving_log(layout: Serving, series) -> str:
    lines = start_lines() if layout.start else []
    for i, s in enumerate(samples_of(series)):
        engine = i % layout.engines
        lines.append(stats_line(layout.era, s, i, engine=engine, pid=1 + engine))
        if layout.access_every and i % layout.access_every == 0:
            lines.append(ACCESS.format(port=40000 + i % 20000, status=200 if i % 50 else 500))
    return "\n".join(lines) + "\n"


# --- any Unicode, any number ---------------------------------------------------------------------

# every code point, lone surrogates (Cs) and private use included: the kinds Hypothesis leaves out
# unless asked (its default alphabet has no surrogates)
ANY_CHAR = st.characters(exclude_categories=())
SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
AWKWARD = st.sampled_from(
    ["\x00", "\x1b[2J", "\x9b", "\u202e", "\u2066", "\ufeff", "\U0001f600", "\U0010ffff", "\r", "\n", "'", '"',
     "\\", "{", "}", "# ", "\n# HEADING\n1. ", "<script>", "`", "|", "%", "$(", "\udfff", "\ud800"]
)  # fmt: skip
texts = st.lists(st.one_of(ANY_CHAR, SURROGATE, AWKWARD), max_size=24).map("".join)
numbers = st.one_of(
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 2**63, -(2**63), 10**40]),
)
# what a spelling of a number can be where a log prints one (no Python repr can write these)
NUMBER_WORDS = ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-0", "0x10", "1_000", "٣", "1e-400", "9" * 500]
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4), st.tuples(inner, inner)
    ),
    max_leaves=12,
)
# the argument names vLLM prints, whose values the facts read: a hostile value lands in a fact
ARG_NAMES = ["model", "model_tag", "served_model_name", "tokenizer", "max_model_len", "tensor_parallel_size",
             "gpu_memory_utilization", "port", "host", "dtype", "kv_cache_dtype", "quantization", "max_num_seqs",
             "block_size", "chat_template", "api_key", "hf_overrides", "enforce_eager"]  # fmt: skip
arg_dumps = st.dictionaries(st.one_of(st.sampled_from(ARG_NAMES), texts), values, max_size=8)


def non_default_args(args: dict, head: str = "(APIServer pid=1) INFO 12-01 10:00:00 [api_utils.py:286] ") -> str:
    """The line vLLM 0.10+ prints (cli_args.py: logger.info("non-default args: %s", args)) after
    `head`: the dict as Python writes it, a lone surrogate as its `\\udfff` escape."""
    return f"{head}non-default args: {args!r}"


def config_line(model: str, extra: str, head: str = "(EngineCore_DP0 pid=2) INFO 12-01 10:00:01 [core.py:93] ") -> str:
    """The engine's config line (V1) after `head`, its model path and a field holding anything."""
    return (
        f"{head}Initializing a V1 LLM engine (v0.10.1) with config: "
        f"model={model!r}, speculative_config=None, tokenizer={model!r}, skip_tokenizer_init=False, "
        f"tokenizer_mode=auto, revision={extra}, dtype=torch.bfloat16, max_seq_len={extra}, "
        "tensor_parallel_size=1, pipeline_parallel_size=1, quantization=None, enforce_eager=False"
    )


def json_line(message: str) -> str:
    """A JSON-formatted log record (a collector's or vLLM's own JSON logging), `\\ud800` escapes and all."""
    return json.dumps({"level": "ERROR", "logger": "vllm.engine", "message": message})


def config_json(path: Path, fields: dict) -> Path:
    """A model directory whose config.json holds these fields (json escapes: surrogates and all)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(fields))
    return path
