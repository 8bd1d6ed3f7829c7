"""Issue 35: a serving server's stats lines, generated in every era's form, any length (1 to a few
thousand samples), constant or varying, saturated, idle, full with nothing waiting, waiting with an
empty cache, one or two engines, access lines between them, a real start before them or none.

Properties: no exception escapes and every format renders (as UTF-8); the same input gives the
same report; the bulk reader and the line-by-line path give the same report; the columns
(StatsSeries.add_many) sum up what the samples one by one (add) do; a saturated series is
diagnosed as queue saturation, an idle one as a stall. The plain examples at the end are the
crash the properties found first (a run of 64 or more samples all waiting with the cache full:
max() of one argument in the runs' code, exit 3)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
    ERAS,
    NUMBER_WORDS,
    Sample,
    Serving,
    runs,
    samples_of,
    serving_log,
    servings,
    start_lines,
    stats_line,
)

from conftest import ROOT
from vllm_doctor.facts import MANY, POINTS_KEPT, StatsSeries
from vllm_doctor.matching import engine
from vllm_doctor.render import FORMATS, render
from vllm_doctor.render.json import to_dict

STATUSES = {"failed", "degraded", "unknown", "healthy"}
SATURATED = Sample(running=6, waiting=10, kv=99.5, prompt=100.0, gen=50.0)  # the line


LOG = Path(tempfile.mkdtemp(prefix="vllm-doctor-properties-")) / "server.log"  # one name: reports compare whole


def explained(run, text: str):
    LOG.write_text(text, encoding="utf-8")
    return run(LOG)


def every_format(report) -> dict[str, str]:
    """The report in every format, each of which a UTF-8 file or terminal takes (strict)."""
    out = {fmt: render(report, fmt) for fmt in FORMATS}
    for text in out.values():
        text.encode("utf-8")
    return out


FIELDS = {"running": "running", "waiting": "waiting", "kv_usage_pct": "kv", "prompt_tps": "prompt", "gen_tps": "gen"}


def _columns(samples: list[Sample]) -> dict[str, list]:
    return {name: [getattr(s, attr) for s in samples] for name, attr in FIELDS.items()}


@given(runs(longest=150), st.integers(1, 3))
def test_the_columns_sum_up_what_the_samples_one_by_one_do(series, batches):
    """add_many (the bulk reader's batches) is add() on each sample, in every aggregate and point:
    whatever the series, in one batch or several (a run going on across a batch's end)."""
    samples = samples_of(series)
    one = StatsSeries()
    for j, s in enumerate(samples):
        one.add({name: getattr(s, attr) for name, attr in FIELDS.items()}, j + 1, 0, f"line {j}")
    many, cut = StatsSeries(), [len(samples) * k // batches for k in range(batches + 1)]
    for a, b in zip(cut, cut[1:], strict=False):
        if a < b:
            many.add_many(_columns(samples[a:b]), list(range(a + 1, b + 1)), 0, lambda j, a=a: f"line {a + j}")
    assert dataclasses.asdict(many) == dataclasses.asdict(one)


@given(servings, runs())
def test_a_serving_log_gives_a_report_in_every_format(run, layout, series):
    """And its memory is bounded by construction: the points drawn and the evidence kept stay
    under their caps however many samples there are."""
    report = explained(run, serving_log(layout, series))
    assert report.status in STATUSES
    every_format(report)
    assert len(report.facts["stats"]["series"]) <= POINTS_KEPT + 1
    assert all(len(d.evidence) <= 40 for d in report.diagnoses)


@given(st.sampled_from(sorted(ERAS)), st.lists(st.sampled_from([*NUMBER_WORDS, "1" * 40, "-3", "0.0.0"]), min_size=1))
def test_any_number_in_a_stats_line(run, era, words):
    """Each number of a stats line spelled any way a mangled line can: past any int, NaN, signs."""
    lines = [*start_lines()]
    for i, word in enumerate(words * 40):
        line = stats_line(era, SATURATED, i)
        field = ("6 reqs", "10 reqs", "99.5%", "100.0 tokens")[i % 4]
        lines.append(line.replace(field, f"{word}{field[field.index(' ') :] if ' ' in field else '%'}"))
    report = explained(run, "\n".join(lines) + "\n")
    assert report.status in STATUSES
    every_format(report)


@given(servings, runs(longest=200))
def test_the_same_log_gives_the_same_report(run, layout, series):
    text = serving_log(layout, series)
    assert to_dict(explained(run, text)) == to_dict(explained(run, text))


@given(servings, runs(longest=300))
def test_the_bulk_reader_and_the_line_path_agree(run, layout, series):
    text = serving_log(layout, series)
    fast = to_dict(explained(run, text))
    real = engine._families
    try:
        engine._families = lambda *_: ({}, [])  # every line through the general path
        slow = to_dict(explained(run, text))
    finally:
        engine._families = real
    assert fast == slow


SATURATED_ERAS = sorted(set(ERAS) - {"v1-0.7.0"})  # (0.7.0's line prints no KV usage)


@given(st.sampled_from(SATURATED_ERAS), st.booleans(), runs(st.just("saturated")))
def test_a_saturated_series_is_queue_saturation(run, era, start, series):
    """Every sample waiting with the cache near full, constant or varying, short or thousands long."""
    report = explained(run, serving_log(Serving(era, start, 1, 0), series))
    assert "queue-saturation" in {d.category for d in report.diagnoses}, report.diagnoses
    assert report.status in ("degraded", "failed")
    every_format(report)


@given(st.sampled_from(SATURATED_ERAS), st.booleans(), runs(st.just("idle-waiting")))
def test_requests_waiting_while_nothing_runs_is_a_stall_or_a_full_cache(run, era, start, series):
    samples = samples_of(series)
    report = explained(run, serving_log(Serving(era, start, 1, 0), series))
    full = any(float(f"{s.kv:.1f}") >= 80.0 for s in samples)  # (as printed) a full cache is the cause
    assert ("queue-saturation" if full else "queue-stall") in {d.category for d in report.diagnoses}


@given(st.sampled_from(SATURATED_ERAS), runs(st.sampled_from(["full-nothing-waiting", "quiet"])))
def test_a_full_cache_with_nothing_waiting_is_no_queue(run, era, series):
    report = explained(run, serving_log(Serving(era, True, 1, 0), series))
    assert not {d.category for d in report.diagnoses} & {"queue-saturation", "queue-stall", "queue-sequence-cap"}


# --- the crash itself, as the issue showed it --------------------------------------------------------


def saturated_log(samples: int) -> str:
    return "\n".join([*start_lines(), *(stats_line("v1-device", SATURATED, i) for i in range(samples))]) + "\n"


@pytest.mark.parametrize("samples", [1, MANY - 1, MANY, 100, 3000])
def test_a_constant_saturated_series_of_any_length_is_diagnosed(run, samples):
    """64 or more samples, all waiting with the cache full, were exit 3 (facts._runs: max(head))."""
    report = explained(run, saturated_log(samples))
    top = next(d for d in report.diagnoses if d.severity != "info")
    assert top.category == "queue-saturation" and report.facts["stats"]["samples"] == samples
    every_format(report)


def test_the_saturated_server_through_the_command_line_in_every_format_and_follow(tmp_path):
    log = tmp_path / "sat.log"
    log.write_text(saturated_log(100))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_COLOR": "1"}
    for args in (*(["-f", fmt] for fmt in FORMATS), ["--follow", "-f", "json"]):
        source = ["-"] if "--follow" in args else [str(log)]
        p = subprocess.run(
            [sys.executable, "-m", "vllm_doctor", "explain", *source, *args, "--no-gpu"],
            input=log.read_bytes() if "--follow" in args else None,
            capture_output=True,
            timeout=120,
            env=env,
        )
        assert p.returncode in (0, 1), (args, p.stderr.decode())
        assert b"queue-saturation" in p.stdout + p.stderr and b"internal error" not in p.stderr, args
