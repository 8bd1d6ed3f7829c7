"""A dense log cannot starve a rule (issue 10, class 3): lines full of common anchor words, or a
million stats lines, used up a rule's time budget, the rule was dropped, and the blocker at the
end was missed (exit 0). Every pattern now matches in linear time (RE2), with no time budget to
spend, and the stats series is aggregated as it streams, in memory that does not grow with the
samples."""

from __future__ import annotations

import io
import tracemalloc

import shapes

from vllm_doctor.facts import POINTS_KEPT as KEPT
from vllm_doctor.facts import Facts, StatsSeries
from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.matching.engine import Engine
from vllm_doctor.pipeline import explain
from vllm_doctor.read import logread


def _explain(tmp_path, data: bytes):
    path = tmp_path / "dense.log"
    path.write_bytes(data)
    return explain([str(path)])


def _blocker_line(report) -> int:
    [d] = [d for d in report.diagnoses if d.severity == "blocker"]
    assert d.numbers["alloc"] == 2.0
    return d.evidence[0].line


def test_dense_anchor_words_and_the_blocker_at_the_end_is_found(tmp_path):
    report = _explain(tmp_path, shapes.dense(3000))
    assert report.status == "failed" and _blocker_line(report) == 3004
    assert not any("time limit" in w or "dropped" in w for w in report.warnings), report.warnings


def test_every_stats_sample_is_counted(tmp_path):
    report = _explain(tmp_path, shapes.stats(20_000))
    assert report.facts["stats"]["samples"] == 20_000  # the stats rule was dropped after 223,022 of 1,000,000
    assert report.facts["stats"]["running_max"] == 8
    assert _blocker_line(report) == 20_004


def test_the_stats_series_holds_the_same_whatever_the_count():
    series = StatsSeries()
    for i in range(200_000):
        series.add(
            {"running": i % 7, "waiting": 1 + i % 3, "kv_usage_pct": 90.0 + i % 5, "gen_tps": 1.0}, i, 0, "x" * 400
        )
    assert series.samples == 200_000 and len(series.evidence) <= 40
    # the pictures' samples (facts.py: keep_point) have their own bound
    bound = {"points": KEPT + 1}
    assert all(not isinstance(v, list | dict | set) or len(v) <= bound.get(k, 40) for k, v in vars(series).items())
    assert series.waiting_max == 3 and series.full_run_max == 200_000


def _peak(data: bytes) -> tuple[int, int]:
    eng, facts = Engine(_rules()), Facts()
    tracemalloc.start()
    eng.run(logread._read_one(io.BytesIO(data), "x.log", 0, eng.prefilter, logread.ReadStats()), facts)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, facts.stats.samples


_RULES: list = []


def _rules():
    if not _RULES:
        from vllm_doctor.matching.loader import load

        _RULES.extend(load(checks=CHECKS))
    return _RULES


def test_memory_is_flat_in_the_number_of_stats_lines(monkeypatch):
    """Four times the stats lines, the same peak: the buffer is the same size (BLOCK), a region's
    hits are bounded (REGION), and the series is running aggregates."""
    monkeypatch.setattr(logread, "BLOCK", 1 << 20)
    monkeypatch.setattr(logread, "REGION", 256 << 10)
    small, n_small = _peak(shapes.stats(4000))
    large, n_large = _peak(shapes.stats(16_000))
    assert (n_small, n_large) == (4000, 16_000)
    assert large < small + (512 << 10), (small, large)
