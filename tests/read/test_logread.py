"""The streaming reader: candidate lines and their context, numbered exactly as in the input,
whatever the block boundaries, compression, line lengths or source (file, gzip, stdin)."""

from __future__ import annotations

import gzip
import io
import random
import sys

import pytest

from vllm_doctor.data import Line
from vllm_doctor.read import logread, source
from vllm_doctor.read.lineparse import parse, strip_colour
from vllm_doctor.read.prefilter import Prefilter

ANCHORS = ["Running: ", "out of memory", "KV cache size:", "EngineDeadError", "model   "]
WORDS = ["foo", "bar ", "Running: ", "out of memory", "KV cache", " size:", "EngineDead", "Error",
         "model ", "  ", "\r", "\t", "x" * 50, "é", "\x1b[0;36m", "(APIServer pid=7) INFO 11-30 01:58:49 [a.py:1] "]  # fmt: skip


def naive(data: bytes, anchors: list[str]) -> tuple[list[tuple], int]:
    """The reader's contract, the slow way: every line holding an anchor, plus CONTEXT_BEFORE
    lines before and CONTEXT_AFTER after it as context, numbered from 1."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    first = data[: min(logread.BLOCK, logread.FIRST_BLOCK)]
    lf, bare_cr = first.count(b"\n"), first.count(b"\r") - first.count(b"\r\n")
    bars = max(first.count(b"/s]"), first.count(b"s/it]"), first.count(b"%|"))
    if (
        (len(first) == len(data) or len(first) >= source.CR_SAMPLE)
        and bare_cr > 8 * lf
        and lf * source.LONG_LINE < len(first)
        and 2 * bars < bare_cr
    ):
        data = data.replace(b"\r", b"\n")  # CR-only input: each CR ends a line
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    encoded = [a.encode() for a in anchors]
    hits = {i: tuple(k for k, a in enumerate(encoded) if a in line) for i, line in enumerate(lines)}
    hits = {i: ids for i, ids in hits.items() if ids}
    picked = dict.fromkeys(hits, True)
    for i in hits:
        for j in [*range(i - logread.CONTEXT_BEFORE, i), *range(i + 1, i + 1 + logread.CONTEXT_AFTER)]:
            if 0 <= j < len(lines):
                picked.setdefault(j, False)
    out = []
    for i in sorted(picked):
        body = lines[i].rstrip(b"\r")
        if b"\r" not in body:  # a short line without CRs inside is read whole
            pieces = [(lines[i], hits.get(i, ()))]
        elif picked[i]:  # a hit line a progress bar redrew: each CR-separated piece with an anchor
            pieces = [(p, ids) for p in body.split(b"\r") if (ids := tuple(k for k, a in enumerate(encoded) if a in p))]
        else:  # a context line: what the terminal shows, the piece after the last CR
            pieces = [(body.rsplit(b"\r", 1)[1], ())]
        for piece, ids in pieces:
            raw = strip_colour(piece.decode("utf-8", "replace"))
            text, process, level = parse(raw)
            out.append((i + 1, text, raw, process, level, picked[i], ids))
    return out, len(lines)


def read_bytes(data: bytes, anchors=ANCHORS, tmp_path=None, prefilter=None) -> tuple[list[tuple], logread.ReadStats]:
    stats = logread.ReadStats()
    pf = prefilter or Prefilter(anchors)
    got = [
        (x.no, x.text, x.raw, x.process, x.level, x.hit, x.anchors)
        for x in logread._read_one(io.BytesIO(data), "test.log", 0, pf, stats)
    ]
    return got, stats


def random_log(rng: random.Random) -> bytes:
    lines = ["".join(rng.choice(WORDS) for _ in range(rng.randint(0, 8))) for _ in range(rng.randint(0, 60))]
    text = "\n".join(lines) + ("\n" if rng.random() < 0.5 else "")
    data = text.encode()
    return gzip.compress(data) if rng.random() < 0.1 else data


@pytest.mark.parametrize("seed", range(4))
def test_line_numbers_and_context_match_a_naive_reader_across_block_boundaries(seed, monkeypatch):
    rng = random.Random(seed)
    for _ in range(75):
        data = random_log(rng)
        plain = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
        longest = max(map(len, plain.split(b"\n")))
        for block in (64, 100, 257, 1000):
            if longest >= block - 1:
                continue  # longer lines are cut into windows: tested below
            monkeypatch.setattr(logread, "BLOCK", block)
            monkeypatch.setattr(logread, "FIRST_BLOCK", rng.choice((block, 16, 40)))
            want, count = naive(data, ANCHORS)  # (whether it is CR-only input depends on the first block)
            got, stats = read_bytes(data)
            assert got == want, (block, data)
            assert stats.lines == count


def test_context_owed_to_a_hit_crosses_several_short_regions(monkeypatch):
    """A hit ends the first 16-byte fill; its context lines come one per later fill."""
    monkeypatch.setattr(logread, "BLOCK", 16)
    monkeypatch.setattr(logread, "FIRST_BLOCK", 16)
    monkeypatch.setattr(logread, "CONTEXT_AFTER", 2)
    data = b"a\n" * 3 + b"Running: \n" + b"b\n" + b"c" * 15 + b"\n" + b"d\n"
    got, stats = read_bytes(data)
    assert [(g[0], g[5]) for g in got] == [(3, False), (4, True), (5, False), (6, False)]
    assert got[3][2] == "c" * 15
    assert stats.lines == 7


def test_empty_first_line_is_context_of_a_hit_in_the_next_region(monkeypatch):
    monkeypatch.setattr(logread, "BLOCK", 64)
    monkeypatch.setattr(logread, "FIRST_BLOCK", 16)  # the first fill ends inside line 2
    got, _ = read_bytes(b"\n" + b"EngineDeadError " + b"z" * 30 + b"\n")
    assert [(g[0], g[2], g[5]) for g in got] == [(1, "", False), (2, "EngineDeadError " + "z" * 30, True)]


def test_last_line_without_newline_and_crlf():
    got, stats = read_bytes(b"one\r\ntwo out of memory\r\nthree\r\nRunning: 1 reqs")
    assert [(g[0], g[2], g[5]) for g in got] == [
        (1, "one", False),
        (2, "two out of memory", True),
        (3, "three", False),
        (4, "Running: 1 reqs", True),
    ]
    assert stats.lines == 4


def test_empty_input_and_blank_lines():
    assert read_bytes(b"")[0] == [] and read_bytes(b"")[1].lines == 0
    assert read_bytes(b"\n\n\n")[1].lines == 3


def test_a_context_line_reads_like_any_line():
    got = list(
        logread._read_one(
            io.BytesIO(b"\x1b[1;36m(APIServer pid=7)\x1b[0m INFO 11-30 01:58:49 [a.py:1] before\nout of memory\n"),
            "t",
            0,
            Prefilter(ANCHORS),
            logread.ReadStats(),
        )
    )
    context = got[0]
    assert not context.hit
    assert (context.text, context.process, context.level) == ("before", "APIServer", "INFO")
    assert context == Line(
        1, "before", "(APIServer pid=7) INFO 11-30 01:58:49 [a.py:1] before", 0, "APIServer", "INFO", False, ()
    )


def test_gzip_reads_like_the_plain_text(tmp_path):
    data = b"".join(b"line %d\n" % i + (b"Running: %d reqs\n" % i if i % 7 == 0 else b"") for i in range(3000))
    plain, gz = tmp_path / "a.log", tmp_path / "a.log.gz"
    plain.write_bytes(data)
    gz.write_bytes(gzip.compress(data))
    pf = Prefilter(ANCHORS)
    a_stats, b_stats = logread.ReadStats(), logread.ReadStats()
    a = list(logread.read([str(plain)], pf, a_stats))
    b = list(logread.read([str(gz)], pf, b_stats))
    assert a == b and a_stats.lines == b_stats.lines == data.count(b"\n")
    assert not b_stats.warnings


def test_truncated_gzip_keeps_what_came_before_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(logread, "FIRST_BLOCK", 4096)
    monkeypatch.setattr(logread, "BLOCK", 4096)
    rng = random.Random(1)
    data = b"".join(b"%x Running: %d reqs\n" % (rng.getrandbits(64), i) for i in range(20000))
    path = tmp_path / "cut.log.gz"
    path.write_bytes(gzip.compress(data)[:-5000])
    stats = logread.ReadStats()
    got = list(logread.read([str(path)], Prefilter(ANCHORS), stats))
    # every line is a hit but the last, which the cut ends mid-line: it comes as context, a prefix
    assert got and all(g.hit for g in got[:-1])
    assert got[-1].hit or data.split(b"\n")[len(got) - 1].decode().startswith(got[-1].raw)
    assert len(got) >= 19_500  # all but the few hundred lines in the 5,000 bytes cut off
    assert [g.no for g in got] == list(range(1, len(got) + 1))
    assert got[0].raw == data.split(b"\n")[0].decode()
    assert any("gzip stream is damaged or truncated" in w for w in stats.warnings)


class _Stdin:
    def __init__(self, data: bytes):
        self.buffer = io.BytesIO(data)


@pytest.mark.parametrize("compress", [False, True])
def test_stdin_plain_and_gzipped(monkeypatch, compress):
    data = b"a\nb out of memory\nc\n"
    monkeypatch.setattr(sys, "stdin", _Stdin(gzip.compress(data) if compress else data))
    stats = logread.ReadStats()
    got = list(logread.read(["-"], Prefilter(ANCHORS), stats))
    assert [(g.no, g.hit) for g in got] == [(1, False), (2, True), (3, False)]
    assert stats.lines == 3


def test_overlong_line_is_matched_in_a_window_around_its_anchor():
    long = b"y" * (logread.MAX_LINE * 3) + b" out of memory " + b"z" * 1000
    got, stats = read_bytes(b"first\n" + long + b"\nafter\nRunning: 2 reqs\n")
    by_no = {g[0]: g for g in got}
    assert by_no[2][5] and "out of memory" in by_no[2][2]
    assert len(by_no[2][2]) <= 2 * logread.WINDOW
    assert by_no[4][5] and by_no[4][2] == "Running: 2 reqs"
    assert stats.lines == 4


def test_line_longer_than_the_buffer_is_read_in_fragments(monkeypatch):
    monkeypatch.setattr(logread, "BLOCK", 4096)
    monkeypatch.setattr(logread, "FIRST_BLOCK", 1024)
    monkeypatch.setattr(logread, "WINDOW", 256)
    long = b"q" * 5000 + b"out of memory" + b"q" * 9000 + b"EngineDeadError" + b"q" * 3000
    got, stats = read_bytes(b"one\n" + long + b"\nthree out of memory\nfour\n")
    fragments = [g for g in got if g[0] == 2]
    assert [f[6] for f in fragments if f[5]] == [(1,), (3,)]
    assert [(g[0], g[5]) for g in got if g[0] != 2] == [(3, True), (4, False)]
    assert stats.lines == 4


@pytest.mark.parametrize("engine", ["pyahocorasick", "re"])
def test_the_fallback_engines_find_the_same_lines(monkeypatch, engine):
    """Where hyperscan has no wheel: pyahocorasick when installed, else one alternation."""
    if engine == "pyahocorasick":
        pytest.importorskip("ahocorasick")
    else:
        monkeypatch.setitem(sys.modules, "ahocorasick", None)
    rng = random.Random(7)
    for _ in range(50):
        data = random_log(rng)
        fast = Prefilter(ANCHORS)
        fast._build()
        with monkeypatch.context() as m:
            m.setitem(sys.modules, "hyperscan", None)  # as if not installed
            slow = Prefilter(ANCHORS)
            slow._build()  # use the engine even on small inputs
        assert slow.engine == engine
        assert read_bytes(data, prefilter=slow)[0] == read_bytes(data, prefilter=fast)[0]


def test_small_and_large_scans_agree():
    rng = random.Random(3)
    data = b"".join(rng.choice([w.encode() for w in WORDS]) for _ in range(5000))
    pf = Prefilter(ANCHORS)
    small = pf.scan(data)
    assert not pf._built  # short input: no engine built
    pf._build()
    assert pf.scan(data) == small
    assert pf.scan(memoryview(bytearray(data))) == small


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: None, "no such file"),
        (lambda p: p.write_bytes(b"\x00\x01\x02\x03" * 5000), "binary data"),
    ],
)
def test_unreadable_input_is_one_clear_error(tmp_path, setup, message):
    path = tmp_path / "input"
    setup(path)
    with pytest.raises(logread.ReadError, match=message):
        list(logread.read([str(path)], Prefilter(ANCHORS), logread.ReadStats()))


def test_a_read_error_mid_stream_is_a_read_error():
    class Failing(io.RawIOBase):
        def __init__(self):
            self.calls = 0

        def readable(self):
            return True

        def readinto(self, buf):
            self.calls += 1
            if self.calls > 2:
                raise OSError(5, "Input/output error")
            buf[:6] = b"hello\n"
            return 6

    with pytest.raises(logread.ReadError, match="read failed"):
        list(logread._read_one(io.BufferedReader(Failing(), 8), "disk.log", 0, Prefilter(ANCHORS), logread.ReadStats()))


def test_a_damaged_prefilter_cache_is_rebuilt(tmp_path, monkeypatch):
    pytest.importorskip("hyperscan")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    data = b"x" * 1000 + b"Running: 1 reqs" + b"y" * 1000
    first = Prefilter(ANCHORS)
    first._build()
    cached = tmp_path / "vllm-doctor" / "prefilter.hsdb"
    want = first.scan(data)
    second = Prefilter(ANCHORS)
    second._build()  # from the cache
    assert second.scan(data) == want
    cached.write_bytes(b"garbage" * 100)
    third = Prefilter(ANCHORS)
    third._build()
    assert third.scan(data) == want and third.engine == "hyperscan"


@pytest.mark.parametrize(
    "prefix",
    [b"\x1b[36mvllm-1  | \x1b[0m", b"[pod/vllm-0/vllm] ", b"2026-11-30T01:53:24.123456789Z stdout F "],
    ids=["compose", "kubectl", "cri"],
)
def test_every_piece_of_a_long_line_keeps_its_collector_prefix(prefix):
    """A piece cut from inside a line longer than MAX_LINE is given the line's collector prefix
    back: it is parsed as the line is, and keeps its container."""
    head = prefix + b"(APIServer pid=1) INFO 11-30 01:53:24 [a.py:1] "
    long = head + b"y" * (logread.MAX_LINE + 4000) + b" out of memory " + b"z" * 1000
    assert long.index(b"out of memory") > logread.MAX_LINE
    shown = strip_colour(prefix.decode())
    for data in (b"first\n" + long + b"\nlast\n", b"first\n" + long + b"\r" + b"w" * 20 + b"\n"):
        got, _ = read_bytes(data)
        pieces = [g for g in got if g[0] == 2]
        assert len(pieces) == 1 and pieces[0][5]
        no, text, raw, *_ = pieces[0]
        assert raw.startswith(shown) and "out of memory" in text
        assert not text.startswith(shown.strip()) and len(raw) <= 2 * logread.WINDOW + len(shown)
    chunks = logread.ChunkLines(Prefilter(ANCHORS))
    lines = chunks.feed(b"first\n" + long[:9000]) + chunks.feed(long[9000:] + b"\n")
    assert [x.raw[: len(shown)] for x in lines] == [shown]


def test_every_piece_of_a_line_longer_than_the_buffer_keeps_its_collector_prefix(monkeypatch):
    monkeypatch.setattr(logread, "BLOCK", 4096)
    monkeypatch.setattr(logread, "FIRST_BLOCK", 1024)
    monkeypatch.setattr(logread, "WINDOW", 256)
    long = b"[pod/vllm-0/vllm] " + b"q" * 5000 + b"out of memory" + b"q" * 9000 + b"EngineDeadError" + b"q" * 900
    got, _ = read_bytes(b"one\n" + long + b"\nthree\n")
    pieces = [g for g in got if g[0] == 2 and g[5]]
    assert [p[6] for p in pieces] == [(1,), (3,)]
    assert all(p[2].startswith("[pod/vllm-0/vllm] ") for p in pieces)
