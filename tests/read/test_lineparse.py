"""lineparse: every colour form and every prefix seen in real vLLM logs is undone, and nothing
that is part of the message is eaten."""

from __future__ import annotations

import pytest

from conftest import FIXTURES
from vllm_doctor.read import lineparse
from vllm_doctor.read.lineparse import parse, strip_colour

MSG = "GPU KV cache size: 442,224 tokens"


def clean(raw: str) -> tuple[str, str | None, str | None]:
    return parse(strip_colour(raw))


COLOURS = [
    # vLLM's own colour formatter and the multiprocess prefix colouring
    f"\x1b[1;36m(APIServer pid=1)\x1b[0;0m \x1b[32mINFO\x1b[0m 05-01 12:00:40 \x1b[2m[core.py:1]\x1b[0m {MSG}",
    f"\x1b(B\x1b[mINFO 05-01 12:00:40 [core.py:1] {MSG}",  # tput sgr0
    f"\x1b]0;vllm serve\x07INFO 05-01 12:00:40 [core.py:1] {MSG}",  # OSC terminal title
    # caret text copied from a pager
    f"^[[1;36m(APIServer pid=1)^[[0;0m ^[[32mINFO^[[0m 05-01 12:00:40 [core.py:1] {MSG}",
    # syslog / CloudWatch escapes, with the carriage return as #015
    f"#033[1;36m(APIServer pid=1)#033[0;0m INFO 05-01 12:00:40 [core.py:1] {MSG}#015",
    # a paste that dropped the ESC byte
    f"[1;36m(APIServer pid=1)[0;0m INFO 05-01 12:00:40 [core.py:1] {MSG}",
    # CRLF
    f"INFO 05-01 12:00:40 [core.py:1] {MSG}\r",
]


@pytest.mark.parametrize("raw", COLOURS)
def test_colour_forms_are_removed(raw):
    message, _process, level = clean(raw)
    assert message == MSG
    assert level == "INFO"


@pytest.mark.parametrize(
    ("prefix", "process", "level"),
    [
        # vLLM's logger, by era
        ("INFO 01-28 10:00:00 llm_engine.py:234] ", None, "INFO"),  # <= 0.7.3
        ("INFO 05-01 12:00:40 [kv_cache_utils.py:634] ", None, "INFO"),  # 0.8+
        ("DEBUG 05-01 12:00:40 [vllm/v1/worker/gpu_worker.py:393] ", None, "DEBUG"),  # VLLM_LOGGING_LEVEL=DEBUG
        ("WARNING 05-01 12:00:40.123 [core.py:1] ", None, "WARNING"),
        ("WARN 05-01 12:00:40 [core.py:1] ", None, "WARNING"),
        # vLLM's process prefixes, every era
        (
            "(VllmWorkerProcess pid=1234) INFO 06-11 08:01:40 multiproc_worker_utils.py:215] ",
            "VllmWorkerProcess",
            "INFO",
        ),
        ("(_AsyncLLMEngine pid=4021) INFO 05-01 12:00:40 llm_engine.py:1] ", "_AsyncLLMEngine", "INFO"),
        ("(VllmWorker rank=1 pid=1234) INFO 05-01 12:00:40 [gpu_worker.py:1] ", "VllmWorker", "INFO"),
        ("(VllmWorker TP2 pid=1234) INFO 05-01 12:00:40 [gpu_worker.py:1] ", "VllmWorker_TP2", "INFO"),
        ("(VllmWorker-0 pid=1234) INFO 05-01 12:00:40 [gpu_worker.py:1] ", "VllmWorker-0", "INFO"),
        ("(Worker pid=1234) INFO 05-01 12:00:40 [gpu_worker.py:1] ", "Worker", "INFO"),
        ("(Worker_TP1 pid=1234) INFO 05-01 12:00:40 [gpu_worker.py:1] ", "Worker_TP1", "INFO"),
        ("(Worker_PP1_TP0 pid=1234) INFO 05-01 12:00:40 [gpu_worker.py:1] ", "Worker_PP1_TP0", "INFO"),
        ("(EngineCore_0 pid=1203) INFO 05-01 12:00:40 [core.py:1] ", "EngineCore_0", "INFO"),
        ("(EngineCore_DP0 pid=1203) ERROR 05-01 12:00:40 [core.py:1] ", "EngineCore_DP0", "ERROR"),
        ("(EngineCore pid=1203) INFO 11-28 10:00:40 [kv_cache_utils.py:2330] ", "EngineCore", "INFO"),
        ("(APIServer pid=4021) INFO 05-01 12:00:40 [loggers.py:236] ", "APIServer", "INFO"),
        # Ray, with and without the opening parenthesis its dedup sometimes eats
        ("(RayWorkerWrapper pid=5678, ip=10.0.0.2) INFO 05-01 12:00:40 worker.py:1] ", "RayWorkerWrapper", "INFO"),
        ("RayWorkerWrapper pid=5678, ip=10.0.0.2) INFO 05-01 12:00:40 worker.py:1] ", "RayWorkerWrapper", "INFO"),
        ("(RayWorkerVllm pid=88412, ip=10.1.2.7) ERROR 04-03 18:10:14 ray_utils.py:44] ", "RayWorkerVllm", "ERROR"),
        ("(pid=1234, ip=10.0.0.1) INFO 05-01 12:00:40 worker.py:1] ", None, "INFO"),
        # frameworks embedding vLLM, torch ranks
        ("(WorkerDict pid=2191, ip=10.0.0.5) INFO 04-20 09:12:30 [executor_base.py:112] ", "WorkerDict", "INFO"),
        ("[rank0]: ", "rank0", None),
        ("(RayWorkerWrapper pid=5678, ip=10.0.0.2) [rank1]: ", "RayWorkerWrapper", None),
        ("[default0]:INFO 05-01 12:00:40 [core.py:1] ", None, "INFO"),
        # collectors
        ("vllm-1  | (APIServer pid=1) INFO 05-01 12:00:40 [core.py:1] ", "APIServer", "INFO"),
        ("vllm  | 2024-05-01T10:00:00Z INFO 05-01 12:00:40 [core.py:1] ", None, "INFO"),
        ("2024-05-01T10:00:00.123456789Z INFO 05-01 12:00:40 [core.py:1] ", None, "INFO"),
        (
            "2025-07-10T14:22:05.123456789Z (EngineCore_DP0 pid=1) ERROR 07-10 14:22:05 [core.py:1] ",
            "EngineCore_DP0",
            "ERROR",
        ),
        ("2025-05-01T10:00:00.000000000+00:00 stdout F INFO 05-01 12:00:40 [core.py:1] ", None, "INFO"),
        (
            "[2026-01-01T00:00:00Z]   | (EngineCore_DP0 pid=1) ERROR 05-01 12:00:40 [core.py:1] ",
            "EngineCore_DP0",
            "ERROR",
        ),
        ("[2026-01-01T00:00:00Z]   | ", None, None),
        ("Nov 30 01:53:24 gpu-node-3 vllm[2201]: INFO 05-01 12:00:40 [core.py:1] ", None, "INFO"),
        ("[pod/vllm-0/vllm] INFO 05-01 12:00:40 [core.py:1] ", None, "INFO"),
        # Python application loggers around vLLM
        ("2024-05-01 10:00:00 - vllm.engine.metrics - INFO - ", None, "INFO"),
        ("2024-05-01 10:00:00,123 - vllm.engine.metrics - WARNING - ", None, "WARNING"),
        ("2024-05-01 10:00:00 - ERROR - ", None, "ERROR"),
        ("2024-05-01 10:00:00.123 | WARNING  | app.server:run:42 - ", None, "WARNING"),
        ("2024-05-01 10:00:00,123 INFO vllm.core.scheduler: ", None, "INFO"),
        ("WARNING: ", None, "WARNING"),
        ("[ERROR] ", None, "ERROR"),
        # re-indented by the user
        ("    INFO 05-01 12:00:40 [core.py:1] ", None, "INFO"),
    ],
)
def test_prefixes_are_removed(prefix, process, level):
    message, got_process, got_level = clean(prefix + MSG)
    assert message == MSG
    assert got_process == process
    assert got_level == level


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        # Ray's dedup suffix
        (
            f"(RayWorkerWrapper pid=1, ip=10.0.0.2) INFO 05-01 12:00:40 worker.py:1] {MSG} [repeated 30x across cluster]",
            MSG,
        ),
        # wrappers that put the source last
        (f"WARNING: {MSG} (scheduler.py:1558)", MSG),
        (f"{MSG} (vllm/core/scheduler.py:1558)", MSG),
        # servers that insert [address=..., pid=...] inside the message
        (
            "ValueError: [address=0.0.0.0:40915, pid=3321] To serve at least one request",
            "ValueError: To serve at least one request",
        ),
        # HTML-escaped tracebacks
        (
            "ValueError: This model&#x27;s maximum context length is 4096 tokens (4000 &gt; 4096 - 596)",
            "ValueError: This model's maximum context length is 4096 tokens (4000 > 4096 - 596)",
        ),
        ("  File &quot;/x/vllm/config.py&quot;, line 3, in f", '  File "/x/vllm/config.py", line 3, in f'),
        # tqdm bars glued to the next record
        (
            f"Adding requests: 88%|████| 453/512 [00:06<00:00](EngineCore_DP0 pid=1) ERROR 05-01 12:00:40 [core.py:1] {MSG}",
            MSG,
        ),
        (
            f"Loading safetensors checkpoint shards: 100% Completed | 8/8 [00:04<00:00,  1.92it/s]INFO 06-12 10:00:21 [core.py:1] {MSG}",
            MSG,
        ),
        # collectors' JSON records
        (
            '{"log":"INFO 05-01 12:00:40 [core.py:1] GPU KV cache size: 442,224 tokens\\n","stream":"stdout","time":"2025-01-01T00:00:00Z"}',
            MSG,
        ),
        (
            '{"error":{"message":"The engine prompt length 40001 exceeds the max_model_len 32768.","code":400}}',
            "The engine prompt length 40001 exceeds the max_model_len 32768.",
        ),
    ],
)
def test_insertions_and_wrappers_are_undone(raw, message):
    assert clean(raw)[0] == message


@pytest.mark.parametrize(
    "raw",
    [
        '  File "/usr/lib/python3.10/runpy.py", line 196, in _run_module_as_main',
        "    assert self.total_num_kv_heads % tp_size == 0",
        "  Value error, Total number of attention heads (32) must be divisible by tensor parallel size (3).",
        "Traceback (most recent call last):",
        "ValueError: No available memory for the cache blocks.",
        "Running: 4 reqs",
        "[1, 2, 3]",
    ],
)
def test_message_text_is_left_alone(raw):
    assert clean(raw)[0] == raw


def test_traceback_lines_keep_indentation_under_a_prefix():
    raw = "(EngineCore_DP0 pid=1) ERROR 05-01 12:00:40 [core.py:1]     raise ValueError("
    assert clean(raw) == ("    raise ValueError(", "EngineCore_DP0", "ERROR")


def test_prefixes_stack_in_any_order():
    raw = (
        "\x1b[36mvllm-1  | \x1b[0m2025-07-10T14:22:05Z \x1b[1;36m(Worker_TP1 pid=9)\x1b[0;0m [rank1]: "
        f"ERROR 07-10 14:22:05 [multiproc_executor.py:1] {MSG}"
    )
    assert clean(raw) == (MSG, "Worker_TP1", "ERROR")


PAYLOADS = [
    ("INFO 05-01 12:00:00 [logger.py:39] Received request chatcmpl-9f2c: prompt: 'OSError: [Errno 98] Address already"
     " in use', params: SamplingParams(n=1, max_tokens=5), prompt_token_ids: [1], lora_request: None.",
     "Received request chatcmpl-9f2c" + lineparse.PAYLOAD),
    ("INFO 05-01 12:00:00 [logger.py:39] Received request cmpl-1: prompt: 'No available memory for the cache",
     "Received request cmpl-1" + lineparse.PAYLOAD_OPEN),  # a terminal wrapped the rest onto the next lines
    ("INFO 05-01 12:00:00 [logger.py:49] Generated response cmpl-1: output: 'CUDA out of memory', output_token_ids: [1],"
     " finish_reason: stop", "Generated response cmpl-1" + lineparse.PAYLOAD),
    ("DEBUG 05-01 12:00:00 [logger.py:49] Request cmpl-1 details: prompt: 'x', prompt_token_ids: [1], prompt_embeds"
     " shape: None.", "Request cmpl-1 details" + lineparse.PAYLOAD),
    ("app INFO prompt='CUDA out of memory' params: SamplingParams(n=1)", "app INFO" + lineparse.PAYLOAD),
    ("(APIServer pid=1) INFO 05-01 12:00:00 [async_llm.py:270] Added request chatcmpl-9f2c.", "Added request chatcmpl-9f2c."),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "message"), PAYLOADS)
def test_request_payloads_keep_only_their_head(raw, message):
    assert clean(raw)[0] == message


def test_lines_that_only_mention_requests_are_untouched():
    for raw in ("ERROR 05-01 12:00:00 [serving_chat.py:200] Error in preprocessing prompt inputs",
                "    params = SamplingParams(**kwargs)",
                "TypeError: SamplingParams.__init__() got an unexpected keyword argument 'foo'"):  # fmt: skip
        assert lineparse.PAYLOAD not in clean(raw)[0]


def test_the_rest_of_a_wrapped_payload_is_payload_until_its_end_or_a_traceback():
    assert lineparse.payload_rest("in use when I start vllm twice?', params: SamplingParams(n=1)", True) is True
    assert lineparse.payload_rest("prompt_token_ids: None, lora_request: None.", True) is None
    assert lineparse.payload_rest("Traceback (most recent call last):", True) is False
    assert lineparse.payload_rest("Received request", False) is False  # a prefixed line is a new record


PLAIN = [
    'INFO:     127.0.0.1:53938 - "POST /v1/completions HTTP/1.1" 400 Bad Request',
    "(APIServer pid=4021) INFO 11-20 10:05:12 [loggers.py:236] Engine 000: Avg prompt throughput: 1532.4 tokens/s,"
    " Avg generation throughput: 410.7 tokens/s, Running: 48 reqs, Waiting: 17 reqs, GPU KV cache usage: 98.7%",
    "(APIServer pid=7) INFO 11-30 00:47:38 [logger.py:43] Received request chatcmpl-f1: prompt: 'CUDA out of memory',"
    " params: SamplingParams(n=1), prompt_token_ids: None, lora_request: None.",
    f"[pod/vllm-0/vllm] (APIServer pid=1) INFO 05-01 12:00:40 [core.py:1] {MSG}",  # kubectl logs --prefix
    f"2024-05-01T12:00:40.123456789Z (APIServer pid=1) INFO 05-01 12:00:40 [core.py:1] {MSG}",  # docker logs -t
    '2024-05-01T12:00:40.1Z stdout F INFO:     127.0.0.1:1 - "GET /v1/models HTTP/1.1" 200 OK',  # a CRI file
    'vllm-1  | INFO:     127.0.0.1:1 - "GET /v1/models HTTP/1.1" 200 OK',  # docker compose
]
NOT_PLAIN = [
    f"\x1b[1;36m(APIServer pid=1)\x1b[0;0m INFO 05-01 12:00:40 [core.py:1] {MSG}",  # colour
    'INFO:     127.0.0.1:1 - "GET /v1/models?a=1&amp;b=2 HTTP/1.1" 200 OK',  # an entity parse() undoes
    "(APIServer pid=1) INFO 05-01 12:00:40 [core.py:1] INFO 05-01 12:00:40 [core.py:1] x",  # stacked prefixes
    f"Nov 30 01:53:24 host vllm[12]: (APIServer pid=1) INFO 05-01 12:00:40 [core.py:1] {MSG}",  # syslog's
    f"(APIServer pid=1) INFO 05-01 12:00:40 [core.py:1] {MSG}\r",
]


@pytest.mark.parametrize("raw", PLAIN)
def test_plain_forms_read_as_parse_reads_them(raw):
    got = lineparse.plain(raw)
    assert got is not None and got[1:] == parse(raw)


def test_a_plain_lines_run_key_is_its_container_and_process_not_its_stamp():
    keys = {lineparse.plain(f"{stamp}{ctr}(APIServer pid=1) INFO 05-01 12:00:40 [core.py:1] {MSG}")[0]
            for stamp in ("", "2024-05-01T12:00:40Z ", "2024-05-01T12:00:41.5Z ") for ctr in ("", "[pod/a/b] ")}  # fmt: skip
    assert keys == {"(APIServer pid=1) INFO ", "[pod/a/b] (APIServer pid=1) INFO "}


@pytest.mark.parametrize("raw", NOT_PLAIN)
def test_plain_declines_what_parse_would_change(raw):
    assert lineparse.plain(raw) is None


def test_plain_agrees_with_parse_on_every_recorded_line():
    """Every line of every fixture and lab recording that plain() reads, it reads as parse() does."""
    read = 0
    for path in sorted(FIXTURES.rglob("*.log")):
        for raw in path.read_bytes().decode("utf-8", "replace").split("\n"):
            got = lineparse.plain(raw)
            if got is not None:
                read += 1
                assert strip_colour(raw) == raw and got[1:] == parse(raw), (path, raw)
    assert read > 1000
