"""The lifetime router on its own: what a line's prefixes say, where a start begins, crash loops."""

from __future__ import annotations

from vllm_doctor.data import Line, Rule
from vllm_doctor.knowledge.lifetimes import Lifetimes, crash_loop, from_this_host, seconds, who

START = Rule(id="server-start-banner", kind="fact", title="", explanation="", path="", phase="server_start")
ENGINE = Rule(id="server-start-engine", kind="fact", title="", explanation="", path="", phase="server_start")
READY = Rule(id="server-ready", kind="fact", title="", explanation="", path="", phase="ready")
FACT = Rule(id="some-fact", kind="fact", title="", explanation="", path="")


def line(no: int, raw: str, process: str | None = None) -> Line:
    return Line(no=no, text=raw, raw=raw, process=process)


def test_who_reads_pid_container_time_and_host():
    w = who(line(1, "vllm-1  | (APIServer pid=1) INFO 11-30 01:53:24 [x.py:1] hi", "APIServer"))
    assert (w.container, w.pid, w.time, w.own_clock) == ("vllm-1", 1, "11-30 01:53:24", True)
    w = who(line(1, "[pod/vllm-0/vllm] INFO:     Started server process [14044]"))
    assert (w.container, w.pid, w.host) == ("pod/vllm-0/vllm", 14044, "vllm-0")
    w = who(line(1, "2025-09-20T03:15:00.0Z stdout F INFO:     Application startup complete."))
    assert (w.container, w.pid, w.time, w.own_clock) == (None, None, "09-20 03:15:00", False)
    w = who(line(1, "Nov 30 01:53:24 gpu-node-7 vllm[12]: INFO 11-30 01:53:24 [x.py:1] hi"))
    assert w.host == "gpu-node-7"
    assert who(line(1, "ValueError: pid=5 is not a prefix")).pid is None  # a message's text, not a prefix
    assert seconds("11-30 01:54:29") - seconds("11-30 01:53:24") == 65


def test_a_repeated_start_from_the_same_process_is_a_restart():
    lives = Lifetimes()
    a, _ = lives.route(START, line(1, "(APIServer pid=1) INFO 01-01 00:00:00 [a.py:1] v", "APIServer"))
    b, _ = lives.route(ENGINE, line(2, "(EngineCore_DP0 pid=60) INFO 01-01 00:00:05 [a.py:1] e", "EngineCore_DP0"))
    c, _ = lives.route(ENGINE, line(3, "(EngineCore_DP1 pid=61) INFO 01-01 00:00:05 [a.py:1] e", "EngineCore_DP1"))
    assert a is b is c  # data-parallel engines each print the engine banner once: one start
    d, _ = lives.route(START, line(9, "(APIServer pid=1) INFO 01-01 00:01:00 [a.py:1] v", "APIServer"))
    e, _ = lives.route(ENGINE, line(10, "(EngineCore_DP0 pid=60) INFO 01-01 00:01:05 [a.py:1] e", "EngineCore_DP0"))
    assert d is e and d is not a  # pid 1 again in the restarted container: the engine's pid 60 is the new one's
    assert [life.index for life in lives.lives()] == [1, 2]


def test_any_start_after_ready_is_a_restart_and_lines_without_pid_follow_the_last():
    lives = Lifetimes()
    lives.route(START, line(1, "INFO 01-01 00:00:00 api_server.py:1] vLLM API server version 0.4.0"))
    lives.route(READY, line(2, "INFO:     Application startup complete."))
    first = lives.all[0]
    assert first.ready and first.ready_at == "01-01 00:00:00"
    lives.route(ENGINE, line(5, "INFO 01-01 00:09:00 llm_engine.py:1] Initializing an LLM engine"))
    assert len(lives.all) == 2
    facts, _ = lives.route(FACT, line(6, "  File x.py, line 3"))
    assert facts is lives.all[1].facts


def test_a_pasted_header_below_an_excerpt_is_not_a_restart():
    lives = Lifetimes()
    lives.route(FACT, line(1, "(APIServer pid=7) INFO 08-20 12:00:10 [loggers.py:1] Running: 32 reqs", "APIServer"))
    lives.route(START, line(2, "(APIServer pid=7) INFO 08-20 11:58:00 [utils.py:1] non-default args: {}", "APIServer"))
    assert len(lives.lives()) == 1  # older than what came before: the arguments asked for, pasted below


def test_crash_loop_is_three_same_failures_in_a_row():
    assert crash_loop(["cache-oom", "cache-oom", "cache-oom"]) == ("cache-oom", 1, 3)
    assert crash_loop(["port-in-use", "cache-oom", "cache-oom", "cache-oom", None]) == ("cache-oom", 2, 4)
    assert crash_loop(["cache-oom", "cache-oom", None]) is None
    assert crash_loop([None, None, None]) is None


def test_this_host_from_a_gpu_pid_or_the_hostname():
    import socket

    from vllm_doctor.capacity.gpu import GpuDevice, GpuProcess, GpuSnapshot

    lives = Lifetimes()
    lives.route(START, line(1, "(APIServer pid=4242) INFO 01-01 00:00:00 [a.py:1] v", "APIServer"))
    snap = GpuSnapshot(True, None, [GpuDevice(0, "H100", 80000, 70000, 10000, [GpuProcess(4242, "python3", 69000)])])
    assert from_this_host(lives.lives(), snap)
    assert not from_this_host(lives.lives(), GpuSnapshot(True, None, [GpuDevice(0, "H100", 80000, 0, 80000)]))
    here = Lifetimes()
    here.route(START, line(1, f"Nov 30 01:53:24 {socket.gethostname()} vllm[1]: vLLM API server version 0.4.0"))
    assert from_this_host(here.lives(), None)


def test_output_with_no_start_is_part_of_the_start_below():
    pasted = Lifetimes()  # the error pasted first, the start below it (later times on the error)
    pasted.route(FACT, line(1, "ERROR 07-14 11:03:51 [core.py:586] EngineCore failed to start."))
    pasted.route(START, line(4, "INFO 07-14 11:02:40 [api_server.py:1395] vLLM API server version 0.9.2"))
    pasted.route(FACT, line(5, "INFO 07-14 11:03:50 [gpu_worker.py:232] Available KV cache memory: 9.87 GiB"))
    [one] = pasted.lives()
    assert (one.first, one.last) == ((0, 1), (0, 5))
    untimed = Lifetimes()
    untimed.route(FACT, line(1, "torch.OutOfMemoryError: CUDA out of memory."))
    untimed.route(START, line(3, "vLLM API server version 0.7.3"))
    assert len(untimed.lives()) == 1


def test_a_fact_printed_before_the_banner_is_the_starts_but_does_not_begin_it():
    """The CPU build's import line ("Triton is installed, but doesn't include CPU backend", no pid)
    comes before the banner: its fact goes to the start below it, which still begins at the banner;
    a crash loop of such starts keeps each start's first line (tests/pipeline/test_restarts.py)."""
    lives = Lifetimes()
    facts, _ = lives.route(FACT, line(1, "Triton is installed, but doesn't include CPU backend. Disabling Triton."))
    facts.set("device", "CPU", 1)
    lives.route(START, line(4, "(APIServer pid=1) INFO 01-01 00:00:00 [a.py:1] v", "APIServer"))
    lives.route(READY, line(9, "(APIServer pid=1) INFO 01-01 00:00:30 [a.py:1] ready", "APIServer"))
    [only] = lives.lives()
    assert only.first == (0, 4) and only.facts.get("device") == "cpu"
