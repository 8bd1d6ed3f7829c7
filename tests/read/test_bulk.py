"""The stats lines of a covered region go by column batches (read/bulk.py's Columns, the engine's
_columns, StatsSeries.add_many): the very series, points, evidence and lifetimes the per-line path
gives, on regions that mix them with gaps, other lines, access runs, malformed lines, several
processes and a restart, with region boundaries inside a run."""

from __future__ import annotations

import random

import pytest

from vllm_doctor.facts import POINTS_KEPT, StatsSeries, convert
from vllm_doctor.matching import engine
from vllm_doctor.matching.engine import convert_column
from vllm_doctor.read import logread
from vllm_doctor.render.json import to_dict

STATS = (
    "({proc} pid={pid}) INFO 11-30 {h:02d}:{m:02d}:{s:02d} [loggers.py:236] Engine 000: Avg prompt throughput:"
    " {p} tokens/s, Avg generation throughput: {g} tokens/s, Running: {run} reqs, Waiting: {wait} reqs,"
    "{pre} GPU KV cache usage: {kv}%{prefix}"
)
ACCESS = 'INFO:     127.0.0.1:{port} - "POST /v1/completions HTTP/1.1" {status} OK'


def stats_line(rng: random.Random, i: int, proc: str = "APIServer", pid: int = 100) -> str:
    wait = rng.choice([0, 0, 1, 3, 12])
    return STATS.format(
        proc=proc, pid=pid, h=i // 3600 % 24, m=i // 60 % 60, s=i % 60,
        p=rng.choice(["0.0", "0.0", "12.0", "1532.4"]), g=rng.choice(["0.0", "40.5", "410.7"]),
        run=rng.choice([0, 1, 7, 48]), wait=wait, pre=rng.choice(["", "", " Preemptions: 2,", " Preemptions: 0,"]),
        kv=rng.choice(["0.0", "12.5", "79.9", "80.0", "98.7"]), prefix=rng.choice(["", ", Prefix cache hit rate: 41.3%"]),
    )  # fmt: skip


def serving_log(rng: random.Random, lines: int) -> str:
    out = ["(APIServer pid=100) INFO 11-30 00:00:00 [api_server.py:1] vLLM API server version 0.10.1"]
    pid = 100
    for i in range(lines):
        r = rng.random() * (0.94 if i // 300 % 2 else 1.0)  # calm stretches (stats, gaps), then busy ones
        if i == lines // 2:  # a restart with a new pid inside a run of stats lines
            pid = 300
            out.append("(APIServer pid=300) INFO 11-30 05:00:00 [api_server.py:1] vLLM API server version 0.10.1")
        if r < 0.80:
            out.append(stats_line(rng, i, pid=pid))
        elif r < 0.86:
            out.append(stats_line(rng, i, proc="EngineCore_DP1", pid=pid + 1))  # another process's run
        elif r < 0.90:
            out.append(ACCESS.format(port=30000 + i, status=rng.choice([200, 200, 500])))
        elif r < 0.94:
            out.append(f"(APIServer pid={pid}) INFO 11-30 01:00:00 [metrics.py:1] nothing a rule reads")  # a gap
        elif r < 0.95:
            out.append(f"(APIServer pid={pid}) INFO 11-30 01:00:00 [metrics.py:1] Running: 4 reqs, Waiting: x reqs")
        elif r < 0.955:
            out.append("Running: 4 reqs, Waiting: 2 reqs,")  # a stats record cut by a terminal wrap
            out.append("GPU KV cache usage: 91.0%")
        elif r < 0.96:
            out.append(f"(EngineCore pid={pid + 1}) WARNING 11-30 01:00:00 [core.py:1] Sequence group preempted")
        else:
            out.append("")
    out.append(
        f"(EngineCore pid={pid + 1}) ERROR 11-30 06:00:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory."
    )
    return "\n".join(out) + "\n"


def both_ways(run, path, monkeypatch) -> tuple[dict, dict, list[int]]:
    """The report with the column path, the report line by line, and the sizes of the batches."""
    sizes: list[int] = []
    real = engine.Engine._columns

    def counted(self, index, batch, *args):
        sizes.append(len(batch.nos))
        real(self, index, batch, *args)

    monkeypatch.setattr(logread, "REGION", 64 << 10)  # region boundaries inside the runs
    with monkeypatch.context() as m:
        m.setattr(engine.Engine, "_columns", counted)
        fast = to_dict(run(path))
    with monkeypatch.context() as m:
        m.setattr(engine, "_families", lambda *_: ({}, []))
        slow = to_dict(run(path))
    return fast, slow, sizes


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_mixed_log_reads_the_same_by_columns(run, tmp_path, monkeypatch, seed):
    log = tmp_path / "serving.log"
    log.write_text(serving_log(random.Random(seed), 6000))
    fast, slow, sizes = both_ways(run, log, monkeypatch)
    assert max(sizes) >= 64  # batches long enough for add_many's columns
    assert fast == slow
    assert fast["diagnoses"][0]["category"] == "cache-oom"


def test_runs_of_stats_lines_alone_read_the_same_by_columns(run, tmp_path, monkeypatch):
    """Regions of nothing but stats lines (one batch each, consecutive lines), then a failure."""
    rng = random.Random(7)
    log = tmp_path / "stats.log"
    lines = [stats_line(rng, i) for i in range(3000)]
    log.write_text("\n".join([*lines, "(EngineCore pid=101) ERROR 11-30 06:00:00 [core.py:1] CUDA out of memory."]))
    fast, slow, sizes = both_ways(run, log, monkeypatch)
    assert len(sizes) > 3 and sum(sizes) == 3000  # a batch per region, every line in one
    assert fast == slow
    stats = fast["facts"]["stats"]
    assert stats["samples"] == 3000 and len(stats["series"]) <= POINTS_KEPT


def samples(rng: random.Random, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        s = {"prompt_tps": rng.choice([0.0, 5.0, None]), "gen_tps": rng.choice([0.0, 9.5]),
             "running": rng.choice([0, 2, 30]), "waiting": rng.choice([0, 0, 1, 4]),
             "kv_usage_pct": rng.choice([None, 10.0, 80.0, 99.0]), "preemptions": rng.choice([None, None, 0, 3]),
             "prefix_hit_pct": rng.choice([None, 40.0, 12.5]), "swapped": rng.choice([None, 1])}  # fmt: skip
        out.append({k: v for k, v in s.items() if v is not None})
    return out


@pytest.mark.parametrize("sizes", [[64], [1000], [70, 500, 64, 3000], [241], [5, 99, 400]])
def test_add_many_is_add_on_each(sizes):
    """The aggregates, runs, evidence, last sample and bounded points of add_many on columns are
    those of add() on each sample, from a series that already holds some (its runs and points)."""
    rng = random.Random(sum(sizes))
    one, many = StatsSeries(), StatsSeries()
    for i, s in enumerate(samples(rng, 300)):
        one.add(s, i + 1, 0, f"line {i + 1} INFO 11-30 01:00:{i % 60:02d}")
        many.add(s, i + 1, 0, f"line {i + 1} INFO 11-30 01:00:{i % 60:02d}")
    no = 301
    for size in sizes:
        batch = samples(rng, size)
        nos = list(range(no, no + size))
        names = sorted({k for s in batch for k in s})
        texts = [f"line {n} INFO 11-30 02:{n // 60 % 60:02d}:{n % 60:02d}" for n in nos]
        for s, n, t in zip(batch, nos, texts, strict=True):
            one.add(s, n, 0, t)
        many.add_many({k: [s.get(k) for s in batch] for k in names}, nos, 0, texts.__getitem__)
        no += size
        assert many == one


def test_add_many_of_v0_lines_goes_one_by_one():
    """A V0 hit-rate line (no running) or a preemption warning among the samples: add() on each."""
    rows = [{"running": 1, "waiting": 2, "prompt_tps": 3.0}, {"prefix_hit_pct": 50.0}, {"preempted": "recompute"}] * 40
    one, many = StatsSeries(), StatsSeries()
    for i, s in enumerate(rows):
        one.add(s, i + 1, 0, "t")
    names = ["running", "waiting", "prompt_tps", "prefix_hit_pct", "preempted"]
    many.add_many({k: [s.get(k) for s in rows] for k in names}, list(range(1, len(rows) + 1)), 0, lambda _: "t")
    assert many == one and one.prefix_traffic_samples == 40 and one.preemptions == 1


@pytest.mark.parametrize("kind", [int, float, str, bool])
def test_a_column_converts_as_each_value_does(kind):
    values = [b"12", b"", None, b"1,024", b"1e999", b"99.x", b"1234567890123456789", b" 5", b"0.5", b"007"]
    assert convert_column(kind, values) == [None if v is None else convert(kind, v.decode()) for v in values]
    plain = [b"12", b"7", b"300"]
    assert convert_column(kind, plain) == [convert(kind, v.decode()) for v in plain]
