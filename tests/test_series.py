"""The stats samples kept for the pictures (facts.py: point, keep_point): bounded, real samples only, the
peak and the latest kept however long the log."""

from __future__ import annotations

from vllm_doctor import facts as series
from vllm_doctor.facts import StatsSeries

LINE = "(APIServer pid=1) INFO 11-30 01:58:49 [loggers.py:335] Engine 000: Running: 7 reqs, Waiting: 9 reqs"


def test_a_point_is_the_sample_as_printed_with_its_time():
    p = series.point({"running": 7, "waiting": 9, "kv_usage_pct": 98.4, "gen_tps": 3.0}, 101, 0, LINE)
    assert p == {"line": 101, "source": 0, "time": "11-30 01:58:49", "running": 7, "waiting": 9,
                 "kv_usage_pct": 98.4, "preemptions": None}  # fmt: skip
    assert series.point({"waiting": 1}, 5, 0, "no time here")["time"] is None


def test_a_week_of_samples_stays_bounded_and_keeps_the_peak_and_the_last():
    stats = StatsSeries()
    for i in range(10_000):
        waiting = 500 if i == 4321 else i % 7
        stats.add({"running": 1, "waiting": waiting, "kv_usage_pct": 50.0}, i + 1, 0, "")
    pts = stats.points
    assert len(pts) <= series.POINTS_KEPT + 1
    assert max(p["waiting"] for p in pts) == 500 == stats.waiting_max
    assert pts[-1]["line"] == 10_000
    assert [p["line"] for p in pts] == sorted(p["line"] for p in pts)  # still in order


def test_a_preemption_warning_is_no_sample():
    stats = StatsSeries()
    stats.add({"preempted": "RECOMPUTE"}, 3, 0, "WARNING preempted")
    assert stats.points == []


def test_a_point_takes_vllms_own_time_as_the_lifetimes_do():
    """A collector's timestamp heads the line; vLLM's own time after the level is the one drawn,
    the same the restart timeline dates the start by."""
    from vllm_doctor.facts import line_time, point

    text = "2026-11-30T01:59:10.123456789Z INFO 11-30 01:58:49 [loggers.py:123] Engine 000: Running: 2 reqs"
    assert point({"running": 2}, 7, 0, text)["time"] == "11-30 01:58:49" == line_time(text)[0]
    assert line_time("2026-11-30T01:59:10Z plain text") == ("11-30 01:59:10", False)
