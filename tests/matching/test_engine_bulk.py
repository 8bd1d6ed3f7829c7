"""The bulk families (access and stats lines read whole, matching/engine.py's _take) give the very
report the general path gives: every fixture and lab recording that has such lines, and a serving
log that mixes them with a failure, payloads, two servers and a restart, read both ways."""

from __future__ import annotations

import pytest

from conftest import FIXTURES
from vllm_doctor.matching import engine
from vllm_doctor.read import bulk, logread
from vllm_doctor.render.json import to_dict

ACCESS = 'INFO:     127.0.0.1:{port} - "POST /v1/completions HTTP/1.1" {status} OK'
STATS = (
    "({proc} pid={pid}) INFO 11-30 01:{m:02d}:{s:02d} [loggers.py:236] Engine 000: Avg prompt throughput: 12.0 tokens/s,"
    " Avg generation throughput: 40.5 tokens/s, Running: {run} reqs, Waiting: {wait} reqs, GPU KV cache usage: {kv}.0%"
)
HEAD = (
    "(APIServer pid={pid}) INFO 11-30 01:00:00 [logger.py:43] Received request cmpl-{i}: prompt: 'say Running: 3 reqs,"
    " Waiting: 1 reqs /v1/ CUDA out of memory', params: SamplingParams(n=1), lora_request: None."
)


def serving_log(quoted: bool, other: bool = True) -> str:
    """Access lines between request heads, a stats line of the API server's every 50 (and, with
    `other`, one of a second process beside it), a restart, a wrapped stats record and a failure."""
    lines = ["(APIServer pid=100) INFO 11-30 01:00:00 [api_server.py:1] vLLM API server version 0.10.1"]
    for i in range(3000):
        pid = 100 if i < 2000 else 300  # a restart with a new pid two thirds in
        if i == 2000:
            lines.append(f"(APIServer pid={pid}) INFO 11-30 01:30:00 [api_server.py:1] vLLM API server version 0.10.1")
        head = HEAD.format(pid=pid, i=i)
        if not quoted:
            head = head.replace(" /v1/", " v1").replace("Running: ", "Running ").replace("reqs,", "reqs")
        lines.append(head if other else head.replace(" CUDA out of memory", ""))  # (no hit: long regions)
        lines.append(ACCESS.format(port=30000 + i, status=500 if i % 97 == 0 else 200))
        if i % 50 == 0:
            lines.append(
                STATS.format(proc="APIServer", pid=pid, m=i // 60 % 60, s=i % 60, run=i % 9, wait=i % 4, kv=i % 100)
            )
            if other:
                lines.append(STATS.format(proc="Other", pid=200, m=i // 60 % 60, s=i % 60, run=1, wait=0, kv=5))
        if i == 1500:
            lines.append("Running: 4 reqs, Waiting: 2 reqs,")  # a stats record cut by a wrap
            lines.append("GPU KV cache usage: 91.0%")
            lines.append(
                "(EngineCore pid=101) ERROR 11-30 01:25:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory."
            )
    return "\n".join(lines) + "\n"


def both_ways(run, paths, monkeypatch) -> tuple[dict, dict, int, int]:
    taken = regions = 0
    real, entries = logread.Bulk.__init__, bulk.entries

    def counted(self, *args):
        nonlocal taken
        taken += 1
        real(self, *args)

    def region(*args):
        nonlocal regions
        regions += 1
        return entries(*args)

    monkeypatch.setattr(logread, "REGION", 64 << 10)  # several regions: the ones a wrapped record is in go line by line
    with monkeypatch.context() as m:
        m.setattr(logread.Bulk, "__init__", counted)
        m.setattr(bulk, "entries", region)
        fast = to_dict(run(*paths))
    with monkeypatch.context() as m:
        m.setattr(engine, "_families", lambda *_: ({}, []))
        slow = to_dict(run(*paths))
    return fast, slow, taken, regions


@pytest.mark.parametrize(
    ("quoted", "other"), [(False, True), (True, True), (False, False)],
    ids=["plain", "prompts-quoting-anchors", "one-stats-process"],
)  # fmt: skip
def test_a_serving_log_reads_the_same_both_ways(run, tmp_path, monkeypatch, quoted, other):
    """Prompts that quote the families' anchors make a region's lines go one by one (_take);
    without them the region is read in bulk (read/bulk.py). With one stats process, a region's
    stats lines are one batch and its access lines one run, however they interleave (the
    times go back each minute: the lifetime must still end at the last line's)."""
    log = tmp_path / "serving.log"
    log.write_text(serving_log(quoted, other))
    merged, real = 0, bulk._merged

    def counted(*args):
        nonlocal merged
        merged += 1
        real(*args)

    monkeypatch.setattr(bulk, "_merged", counted)
    fast, slow, taken, regions = both_ways(run, [log], monkeypatch)
    assert (merged > 10) is not other
    assert taken > 200  # the access lines (in runs) and stats lines went the bulk way
    assert (regions > 0) is not quoted
    assert fast == slow
    assert len(fast["lifetimes"]) == 2


def stamped(text: str, cri: bool) -> str:
    """Each line behind docker's timestamp (`docker logs -t`), or a CRI log file's (/var/log/pods),
    a second apart."""
    out = []
    for i, line in enumerate(text.splitlines()):
        stamp = f"2024-11-30T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}.{i:09d}Z"
        out.append(f"{stamp} {'stdout F ' if cri else ''}{line}")
    return "\n".join(out) + "\n"


def two_pods() -> str:
    """Two containers' serving logs as `kubectl logs -l app=vllm --prefix` interleaves them: the
    same pids in each, the second's after the first's first thousand lines."""
    a, b = (serving_log(False, other=False).splitlines() for _ in range(2))
    b = [f"[pod/vllm-1/vllm] {line}" for line in b]
    out = [f"[pod/vllm-0/vllm] {line}" for line in a[:1000]]
    for x, y in zip(a[1000:], b, strict=False):
        out += [f"[pod/vllm-0/vllm] {x}", y]
    return "\n".join(out) + "\n"


COLOUR = "\x1b[1;36m{}\x1b[0;0m"


def v1_shaped(text: str, colour: float, bare: float, seed: int = 1) -> str:
    """The access lines behind the API server's prefix, as most V1 servers write them (a share
    `bare` left bare), and a share `colour` of every process prefix in ANSI colour, as a
    terminal-attached server writes it."""
    import random
    import re

    rng, out, server = random.Random(seed), [], "(APIServer pid=100)"
    for line in text.splitlines():
        m = re.match(r"\((?:APIServer|Other|EngineCore) pid=\d+\)", line)
        if m and m[0].startswith("(APIServer"):
            server = m[0]
        elif line.startswith("INFO:     ") and rng.random() >= bare:
            line, m = f"{server} {line}", re.match(".*?\\)", server)
        if m and rng.random() < colour:
            line = COLOUR.format(m[0]) + line[len(m[0]) :]
        out.append(line)
    return "\n".join(out) + "\n"


FORMS = {
    "docker-timestamps": lambda: stamped(serving_log(False, other=False), False),
    "cri-file": lambda: stamped(serving_log(False, other=False), True),
    "kubectl-two-pods": two_pods,
    "v1": lambda: v1_shaped(serving_log(False), 0, 0),
    "v1-colour": lambda: v1_shaped(serving_log(False), 1, 0),
    "v1-mixed": lambda: v1_shaped(serving_log(False), 0.25, 0.15),
    "v1-docker": lambda: stamped(v1_shaped(serving_log(False, other=False), 0, 0), False),
    "compose-v1": lambda: "".join(f"vllm-1  | {line}\n" for line in v1_shaped(serving_log(False), 0.5, 0).splitlines()),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_a_prefixed_serving_log_reads_the_same_both_ways(run, tmp_path, monkeypatch, form):
    """Behind a collector's prefix (a stamp, a pod's or service's name) and V1's process prefix
    (in colour or not, mixed with bare lines), a family's line is read in bulk, a region at a
    time, as parse() reads it (lineparse.plain agrees): the same report, two containers' or
    processes' lines two runs however they interleave."""
    from vllm_doctor.read import lineparse

    text = FORMS[form]()
    plain = 0
    for line in text.splitlines():
        read = lineparse.plain(lineparse.strip_colour(line))
        if read is not None:
            plain += 1
            assert read[1:] == lineparse.parse(lineparse.strip_colour(line)), line
    assert plain > 3000
    log = tmp_path / "serving.log"
    log.write_text(text)
    fast, slow, taken, regions = both_ways(run, [log], monkeypatch)
    assert taken > 200 and regions > 0  # read in bulk
    assert fast == slow
    assert len(fast["lifetimes"]) == (4 if form == "kubectl-two-pods" else 2)


BULKY = sorted(
    p for p in FIXTURES.rglob("*.log") if any(a in p.read_text(errors="replace") for a in (" /v1/", "Running: "))
)


@pytest.mark.parametrize("log", BULKY, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_recording_reads_the_same_both_ways(log, run, monkeypatch):
    fast, slow, _, _ = both_ways(run, [log], monkeypatch)
    assert fast == slow


def test_a_bulk_form_reads_what_the_rule_reads(rules):
    """Every line of a family's bulk form, in the fixtures and in a serving log's forms, is a plain
    line (lineparse.plain) whose message the rule's own pattern matches alone with the same groups."""
    from vllm_doctor.facts import line_time
    from vllm_doctor.read import lineparse

    eng = engine.Engine(rules)
    fams = eng.prefilter.families
    assert {rules[f.key].id for f in fams} == {"access-line", "stats-line"}
    extra = [ACCESS.format(port=1, status=503), STATS.format(proc="APIServer", pid=1, m=0, s=0, run=2, wait=0, kv=99),
             STATS.format(proc="EngineCore_DP0", pid=9, m=1, s=2, run=0, wait=5, kv=0).replace("Waiting: 5 reqs, ",
             "Waiting: 5 reqs, Preemptions: 2, ") + ", Prefix cache hit rate: 12.5%"]  # fmt: skip
    extra += [f"(APIServer pid=7) {extra[0]}", COLOUR.format("(APIServer pid=7)") + f" {extra[0]}",
              COLOUR.format("(APIServer pid=1)") + extra[1][len("(APIServer pid=1)"):],
              f"2024-11-30T00:00:00.123456789Z stdout F [pod/vllm-0/vllm] (APIServer pid=7) {extra[0]}",
              f"vllm-1  | 2024-11-30T00:00:00Z {extra[2]}"]  # fmt: skip
    texts = [p.read_bytes() for p in BULKY] + ["\n".join(extra).encode() + b"\n"]
    seen = 0
    for data in texts:
        for f in fams:
            for m in f.form.finditer(b"\n" + data):  # (the form takes the newline before a line)
                seen += 1
                line = m[1]
                text = bulk.text(line)  # (its colour undone)
                parsed = lineparse.plain(text)
                assert parsed is not None, text
                assert parsed[1:] == lineparse.parse(text), text
                want = eng._search(f.key, eng.rules[f.key].patterns[0], parsed[1], parsed[3])
                got = {k: v.decode() for k, v in m.groupdict().items() if v is not None and k[0] != "_"}
                assert want == [got], text
                assert any(a in line for a in f.anchors)  # found by its anchors (bulk._read_lines)
                if f.counted:  # a process's lines around it go where they went (bulk._merged)
                    assert (line_time(text)[0] is None) is (m["_t1"] is None and m["_t2"] is None)
                    assert (parsed[2] is None) is (m["_key"] is None)
                assert bulk.covered(bytearray(line + b"\n"), 0, len(line) + 1, fams) == [f]
    assert seen > 20


ROUTES = [
    f"(APIServer pid=100) INFO 11-30 01:00:00 [launcher.py:195] Route: /v1/{path}, Methods: POST"
    for path in ("models", "chat/completions", "completions", "responses")
]


def test_lines_out_of_a_form_that_hold_its_anchors_leave_the_region_in_bulk(run, tmp_path, monkeypatch):
    """A startup's "Route: /v1/models" lines hold the access lines' " /v1/": they are read as hit
    lines, and the rest of their region still in bulk (the same report); an access line of no
    form that the rule reads sends its region line by line, as before."""
    lines = serving_log(False).splitlines()
    lines[1:1] = ROUTES
    lines.insert(len(lines) // 4, 'INFO:     127.0.0.1:5 - "POST /v1/completions HTTP/2" 500 Internal Server Error')
    log = tmp_path / "serving.log"
    log.write_text("\n".join(lines) + "\n")
    took, real = [], engine.Engine._take

    def take(self, raw, ids):
        read = real(self, raw, ids)
        took.extend([raw] if read is not None else [])
        return read

    monkeypatch.setattr(logread, "REGION", 64 << 10)
    monkeypatch.setattr(engine.Engine, "_take", take)
    fast = to_dict(run(log))
    with monkeypatch.context() as m:
        m.setattr(engine, "_families", lambda *_: ({}, []))  # (no families: nothing is taken)
        slow = to_dict(run(log))
    assert fast == slow
    assert any(b"HTTP/2" in raw for raw in took)
    assert not any(b"127.0.0.1:300" in raw for raw in took)  # the first region's access lines
