"""The same incident, mangled every way field logs get mangled, gives the same diagnosis and numbers.

Each base log is a clean excerpt of one era; each mangler does one thing a terminal, launcher,
collector or paste does to a log (fixtures/logs/ holds one real-looking file per kind). A
diagnosis that survives only the clean form would miss most real incidents.
"""

from __future__ import annotations

import gzip
import html
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import FIXTURES
from vllm_doctor.render.json import to_dict

LOGS = FIXTURES / "logs"
SP = "/usr/local/lib/python3.12/dist-packages/vllm"

V1_CACHE_OOM = f"""\
(APIServer pid=7611) INFO 09-20 03:14:50 [api_server.py:1896] vLLM API server version 0.10.2
(APIServer pid=7611) INFO 09-20 03:14:50 [utils.py:328] non-default args: {{'model_tag': 'Qwen/Qwen3-32B', 'model': 'Qwen/Qwen3-32B', 'tensor_parallel_size': 2, 'gpu_memory_utilization': 0.85}}
(APIServer pid=7611) INFO 09-20 03:14:57 [__init__.py:1815] Using max model len 40960
(Worker_TP0 pid=7760) INFO 09-20 03:15:31 [gpu_model_runner.py:2392] Model loading took 30.5855 GiB and 24.633211 seconds
(Worker_TP0 pid=7760) INFO 09-20 03:15:43 [gpu_worker.py:298] Available KV cache memory: 2.12 GiB
(EngineCore_DP0 pid=7702) ERROR 09-20 03:15:44 [core.py:718] EngineCore failed to start.
(EngineCore_DP0 pid=7702) ERROR 09-20 03:15:44 [core.py:718] Traceback (most recent call last):
(EngineCore_DP0 pid=7702) ERROR 09-20 03:15:44 [core.py:718]   File "{SP}/v1/core/kv_cache_utils.py", line 716, in check_enough_kv_cache_memory
(EngineCore_DP0 pid=7702) ERROR 09-20 03:15:44 [core.py:718]     raise ValueError(
(EngineCore_DP0 pid=7702) ERROR 09-20 03:15:44 [core.py:718] ValueError: To serve at least one request with the models's max seq len (40960), (5.00 GiB KV cache is needed, which is larger than the available KV cache memory (2.12 GiB). Based on the available memory, the estimated maximum model length is 17360. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
(APIServer pid=7611) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{}}
"""

V0_CACHE_OOM = """\
INFO 05-10 17:31:02 api_server.py:151] vLLM API server version 0.4.2
INFO 05-10 17:31:03 llm_engine.py:100] Initializing an LLM engine (v0.4.2) with config: model='mistralai/Mistral-7B-Instruct-v0.2', dtype=torch.bfloat16, max_seq_len=32768, tensor_parallel_size=1, quantization=None, enforce_eager=False
INFO 05-10 17:31:15 model_runner.py:175] Loading model weights took 13.4966 GB
INFO 05-10 17:31:19 gpu_executor.py:114] # GPU blocks: 1152, # CPU blocks: 2048
ERROR 05-10 17:31:19 async_llm_engine.py:52] ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored in KV cache (18432). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
"""

TP = """\
(APIServer pid=3301) INFO 08-21 16:02:11 [utils.py:326] non-default args: {'model_tag': 'mistralai/Mistral-Nemo-Instruct-2407', 'model': 'mistralai/Mistral-Nemo-Instruct-2407', 'tensor_parallel_size': 3}
(APIServer pid=3301) pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig
(APIServer pid=3301)   Value error, Total number of attention heads (32) must be divisible by tensor parallel size (3). [type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]
"""

STATS = (
    "\n".join(
        f"(APIServer pid=4021) INFO 11-20 10:0{i}:12 [loggers.py:236] Engine 000: Avg prompt throughput: {p:.1f} tokens/s, "
        f"Avg generation throughput: {g:.1f} tokens/s, Running: {r} reqs, Waiting: {w} reqs, GPU KV cache usage: {k:.1f}%, "
        "Prefix cache hit rate: 41.3%"
        for i, (p, g, r, w, k) in enumerate(
            [(2100.0, 380.2, 60, 0, 72.4), (1532.4, 410.7, 64, 17, 98.7), (900.1, 455.0, 63, 31, 99.7)]
        )
    )
    + "\n"
)

QUEUE_CAP = (
    "\n".join(
        f"(APIServer pid=610) INFO 08-20 12:0{i}:10 [loggers.py:123] Engine 000: Avg prompt throughput: {p:.1f} tokens/s, "
        f"Avg generation throughput: {g:.1f} tokens/s, Running: 32 reqs, Waiting: {w} reqs, GPU KV cache usage: {k:.1f}%, "
        "Prefix cache hit rate: 0.0%"
        for i, (p, g, w, k) in enumerate(
            [(2210.0, 901.2, 14, 19.4), (1830.4, 955.0, 22, 41.0), (1702.9, 960.3, 25, 65.0)]
        )
    )
    + "\n(APIServer pid=610) INFO 08-20 11:58:00 [utils.py:326] non-default args: {'model': 'Qwen/Qwen2.5-14B-Instruct', 'max_num_seqs': 32}\n"
)

# (name, log, top rule, {path in report: value}); "numbers.x" reads the top diagnosis' numbers
BASES = [
    (
        "v1-cache-oom",
        V1_CACHE_OOM,
        "kv-cache-too-small-for-max-len",
        {
            "numbers.fit_max_model_len": 17360,
            "numbers.needed_gib": 5.0,
            "facts.max_model_len": 40960,
            "fix.value": "17360",
        },
    ),
    (
        "v0-cache-oom",
        V0_CACHE_OOM,
        "max-seq-len-exceeds-kv-cache",
        {"numbers.fit_max_model_len": 18432, "facts.kv_cache.tokens": 18432, "facts.max_model_len": 32768},
    ),
    (
        "tp",
        TP,
        "attention-heads-not-divisible",
        {"numbers.valid_tp_sizes": [1, 2, 4, 8], "facts.tensor_parallel_size": 3, "fix.value": "2"},
    ),
    (
        "queue",
        STATS,
        "queue-cache-full",
        {"facts.stats.samples": 3, "facts.stats.waiting_max": 31, "facts.stats.kv_usage_max_pct": 99.7},
    ),
    (
        "queue-cap",
        QUEUE_CAP,
        "queue-sequence-cap",
        {"facts.stats.samples": 3, "facts.stats.kv_usage_max_pct": 65.0, "numbers.running_while_waiting_max": 32},
    ),
]


def _lines(text: str) -> list[str]:
    return text.rstrip("\n").split("\n")


def _each(fn: Callable[[int, str], str]) -> Callable[[str], str]:
    return lambda text: "\n".join(fn(i, line) for i, line in enumerate(_lines(text))) + "\n"


def _colour(esc: str, reset_tail: str = "") -> Callable[[str], str]:
    def one(_i: int, line: str) -> str:
        if line.startswith("("):
            close = line.index(")") + 1
            line = f"{esc}[1;36m{line[:close]}{esc}[0;0m{line[close:]}"
        for level, code in (("INFO", "32"), ("ERROR", "31"), ("WARNING", "33")):
            line = line.replace(f" {level} ", f" {esc}[{code}m{level}{esc}[0m ", 1)
        return line + reset_tail

    return _each(one)


def _wrap(width: int) -> Callable[[str], str]:
    def wrap(text: str) -> str:
        out = []
        for line in _lines(text):
            out += [line[i : i + width] for i in range(0, len(line), width)] or [""]
        return "\n".join(out) + "\n"

    return wrap


_VLLM_PREFIX = re.compile(
    r"^(?:\([^)]*pid=\d+\) )?(DEBUG|INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[?([\w.]+:\d+)\]? "
)


def _app_logger(text: str) -> str:
    """An application's own logging config: '2024-05-01 10:00:00,123 - vllm.x - INFO - msg'."""
    return _each(
        lambda i, line: _VLLM_PREFIX.sub(
            lambda m: f"2024-05-01 10:00:{i:02d},123 - vllm.{m[2].split('.')[0]} - {m[1]} - ", line
        )
    )(text)


def _source_last(text: str) -> str:
    """Wrappers that print the level, then the message, then the source: 'INFO: msg (core.py:718)'."""

    def one(_i: int, line: str) -> str:
        m = _VLLM_PREFIX.match(line)
        return f"{m[1]}: {line[m.end() :]} ({m[2]})" if m else line

    return _each(one)(text)


def _elided(text: str) -> str:
    """A user's paste with the traceback frames cut out and '...' in their place."""
    out, cut = [], False
    for line in _lines(text):
        if re.search(r"\]?\s+File \"|^\S.*\]\s{4}\S", line):
            if not cut:
                out.append("...")
            cut = True
            continue
        cut = False
        out.append(line)
    return "\n".join(out) + "\n"


def _json_lines(text: str) -> str:
    return (
        "\n".join(
            json.dumps({"log": line + "\n", "stream": "stderr", "time": "2025-01-01T00:00:00Z"})
            for line in _lines(text)
        )
        + "\n"
    )


MANGLERS: dict[str, Callable[[str], str | bytes]] = {
    "clean": lambda t: t,
    "colour-esc": _colour("\x1b"),
    "colour-caret": _colour("^["),
    "colour-esc-lost": _colour(""),
    "colour-syslog": lambda t: _each(lambda i, line: f"Sep 20 03:15:44 gpu-node-3 vllm[7611]: {line}")(
        _colour("#033", "#015")(t)
    ),
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "gzip": lambda t: gzip.compress(t.encode(), mtime=0),
    "docker-compose": _each(lambda i, line: f"vllm-1  | {line}"),
    "docker-timestamps": _each(lambda i, line: f"2025-09-20T03:15:{i:02d}.{i * 7919:09d}Z {line}"),
    "k8s-cri": _each(lambda i, line: f"2025-09-20T03:15:{i:02d}.000000000+00:00 stderr F {line}"),
    "ci-gutter": _each(lambda i, line: f"[2026-01-01T00:00:{i:02d}Z]   | {line}"),
    "kubectl-prefix": _each(lambda i, line: f"[pod/vllm-0/vllm] {line}"),
    "torch-rank": _each(lambda i, line: f"[rank0]: {line}"),
    "ray-dedup": _each(lambda i, line: f"{line} [repeated {i + 2}x across cluster]"),
    "reindented": _each(lambda i, line: f"    {line}"),
    "html-escaped": lambda t: html.escape(t, quote=True),
    "json-lines": _json_lines,
    "lost-newlines": lambda t: " ".join(_lines(t)) + "\n",
    "tqdm-glued": lambda t: "Loading safetensors checkpoint shards: 100% Completed | 4/4 [00:03<00:00,  1.10it/s]" + t,
    "app-logger": _app_logger,
    "source-last": _source_last,
    "elided": _elided,
    "hard-wrap-200": _wrap(200),
    "hard-wrap-160": _wrap(160),
    "hard-wrap-120": _wrap(120),
}


def _dig(report: dict, top: dict | None, path: str):
    head, _, rest = path.partition(".")
    if head == "numbers":
        return (top or {}).get("numbers", {}).get(rest)
    if head == "fix":
        return ((top or {}).get("fixes") or [{}])[0].get(rest)
    node = report["facts"]
    for key in rest.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


CASES = [(b, m) for b in BASES for m in MANGLERS]


@pytest.mark.parametrize(("base", "mangler"), CASES, ids=[f"{b[0]}-{m}" for b, m in CASES])
def test_mangled_log_gives_the_same_diagnosis(base, mangler, tmp_path: Path, run):
    name, text, rule, want = base
    data = MANGLERS[mangler](text)
    log = tmp_path / ("x.log.gz" if isinstance(data, bytes) else "x.log")
    if isinstance(data, bytes):
        log.write_bytes(data)
    else:
        log.write_bytes(data.encode())
    report = to_dict(run(log))
    top = next((d for d in report["diagnoses"] if d["severity"] in ("blocker", "warning")), None)
    assert top and top["rule"] == rule, [(d["rule"], d["severity"]) for d in report["diagnoses"]]
    for path, value in want.items():
        assert _dig(report, top, path) == value, path


# ---------------------------------------------------------------- what the fixture format cannot say


def _diagnoses(run, path: Path) -> dict[str, dict]:
    return {d["rule"]: d for d in to_dict(run(path))["diagnoses"]}


def test_priority_scheduling_preemption_is_its_own_info(run):
    found = _diagnoses(run, LOGS / "priority-preemption" / "0.12.0_priority-policy-preemptions-kv-47pct.log")
    assert found["priority-preemption"]["severity"] == "info"
    assert found["priority-preemption"]["numbers"]["preemptions"] == 10
    assert "queue-cache-full" not in found


@pytest.mark.parametrize(
    ("log", "rule", "numbers"),
    [
        ("healthy/0.6.1_long-context-warning-info.log", "long-context-oom-warning", {"max_model_len": 131072}),
        (
            "healthy/0.9.0_long-context-causeoom-and-chunked-prefill.log",
            "long-context-oom-warning",
            {"max_model_len": 131072},
        ),
        ("healthy/0.4.0_max-len-keys-missing-assumes-2048.log", "max-len-keys-missing", {"default_len": 2048}),
        ("healthy/0.14.0_max-len-keys-missing-no-key-list.log", "max-len-keys-missing", {"default_len": 2048}),
        ("kv-capacity/0.26.0_hybrid-concurrency-as-printed.log", "kv-capacity", {"kv_tokens": 75840}),
    ],
)
def test_info_only_variants_are_reported_as_info(run, log, rule, numbers):
    found = _diagnoses(run, LOGS / log)
    assert found[rule]["severity"] == "info"
    for key, value in numbers.items():
        assert found[rule]["numbers"][key] == value


def test_hybrid_concurrency_is_reported_as_printed(run):
    facts = to_dict(run(LOGS / "kv-capacity" / "0.26.0_hybrid-concurrency-as-printed.log"))["facts"]
    # 75,840 tokens at 2.48x for 120,000-token requests looks inconsistent; vLLM's numbers stand
    assert facts["kv_cache"]["tokens"] == 75840
    assert facts["kv_cache"]["max_concurrency"] == 2.48
    assert facts["kv_cache"]["concurrency_tokens"] == 120000


@pytest.mark.parametrize(
    "log",
    [
        "cache-oom/0.9.2_v1-kv-cache-estimated-max-len.log",
        "cache-oom/0.10.2_v1-kv-cache-estimated-enginecore-dp0.log",
        "cache-oom/0.33.0_v1-kv-cache-planning-enginecore.log",
        "cache-oom/0.10.1_no-cache-blocks-vllmworker-tp-engine-core-0.log",
    ],
)
def test_the_engine_core_wrapper_is_context_not_cause(run, log):
    top = to_dict(run(LOGS / log))["diagnoses"][0]
    assert top["category"] == "cache-oom"
    assert any("initialization failed" in c["text"] or "failed to start" in c["text"] for c in top["context"])


def test_evidence_keeps_the_original_line_numbers_of_a_wrapped_message(run):
    log = LOGS / "cache-oom" / "0.10.2_terminal-hard-wrap-mid-word.log"
    lines = log.read_text().splitlines()
    top = to_dict(run(log))["diagnoses"][0]
    first = top["evidence"][0]
    assert "To serve at least one request" in lines[first["line"] - 1]
    assert any(e["line"] == first["line"] + 1 and lines[e["line"] - 1].startswith("e memory") for e in top["evidence"])


def test_markdown_eaten_hash_still_gives_blocks(run):
    facts = to_dict(run(LOGS / "kv-capacity" / "0.4.2_markdown-ate-the-hash.log"))["facts"]
    assert facts["kv_cache"]["gpu_blocks"] == 1952
    assert facts["kv_cache"]["tokens"] == 1952 * 16


def test_every_mess_kind_has_a_fixture():
    names = {p.name for p in LOGS.rglob("*.log*") if not p.name.endswith(".toml")}
    kinds = [
        "colour-real-esc",
        "request-log",  # a user's prompt quoting errors: data, never a message
        "colour-caret-text",
        "colour-syslog-033",
        "colour-esc-byte-lost",
        "ray-worker-wrapper-repeated-paren-eaten",
        "workerdict",
        "rank-prefix",
        "docker-compose",
        "docker-rfc3339",
        "ci-timestamp-and-gutter",
        "python-app-logger",
        "message-first-source-last",
        "html-escaped",
        "address-inserted",
        "hard-wrap-mid-word",
        "message-split-over-three-lines",
        "tqdm-bar-glued",
        "paste-lost-every-newline",
        "reindented-with-elisions",
        "markdown-ate-the-hash",
        "interleaved-worker-tracebacks",
        "kv-summary-printed-twice",
        "gb-is-gib",
        "cpu-backend-prints-gpu-kv",
        "xpu-kv-cache-size",
        "crlf-line-endings",
        "json-lines",
    ]
    missing = [k for k in kinds if not any(k in n for n in names)]
    assert not missing
    assert any(n.endswith(".log.gz") for n in names)
