"""Histogram maths on the lab's recorded scrapes (vLLM 0.32 CPU, fixtures/lab): increases over a
window, a counter reset (a restart inside the series), the renames by version, and the quantile
as Prometheus' histogram_quantile() computes it."""

from __future__ import annotations

import pytest

from conftest import LAB
from vllm_doctor.read import metrics
from vllm_doctor.read.histogram import Histogram, hist_increase, increase
from vllm_doctor.read.window import window


def scrape(name: str, i: int, at: float | None = None, edit=None) -> metrics.Scrape:
    text = (LAB / f"{name}.metrics-{i}.txt").read_text()
    return metrics.parse(edit(text) if edit else text, name, at=at)


SAT, CAP = "queue-saturation", "queue-saturation-max-num-seqs"


def test_quantile_interpolates_within_the_bucket_as_prometheus_does():
    h = Histogram(10, 0.0, [(0.1, 0.0), (0.2, 10.0), (float("inf"), 10.0)])
    assert h.quantile(0.5) == pytest.approx(0.15)  # halfway through (0.1, 0.2]
    assert h.quantile(0.95) == pytest.approx(0.195)
    assert Histogram(4, 0, [(1.0, 0.0), (float("inf"), 4.0)]).quantile(0.5) == 1.0  # in +Inf: the top finite bound
    assert Histogram().quantile(0.5) is None


def test_window_is_the_difference_of_the_first_and_last_scrape():
    first, last = scrape(SAT, 0), scrape(SAT, 11)
    w = window([first, scrape(SAT, 5), last])
    itl_last = last.hists["itl"]
    assert w["itl"]["count"] == itl_last.count - first.hists["itl"].count == 5093
    assert w["preemptions"] == 4 and w["finished"]["length"] == 4
    assert w["prefix_queries"] == 7971 and w["prefix_hits"] == 0
    assert window([last]) == {}  # one cumulative scrape is no window


def test_a_counter_reset_counts_the_increase_since_the_restart():
    # the saturated server's first 7 scrapes, then a restarted server (the sequence-cap run): counters drop
    series = [scrape(SAT, i, at=10.0 * i) for i in range(7)] + [scrape(CAP, i, at=70.0 + 10 * i) for i in range(1, 7)]
    w = window(series)
    sat = series[6].hists["itl"].count - series[0].hists["itl"].count
    cap = series[-1].hists["itl"].count  # the restarted server's whole count: all of it is in the window
    assert w["resets"] == 1
    assert w["itl"]["count"] == sat + cap == 3179 + 4069
    gen = [s.generation_tokens_total for s in series]
    assert w["generation_tokens"] == increase(gen) == (gen[6] - gen[0]) + gen[-1]
    merged = hist_increase([s.hists["itl"] for s in series])
    assert merged is not None and merged.buckets[-1][1] == merged.count  # +Inf holds every observation


def _old(text: str) -> str:
    text = text.replace("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
    return text.replace("vllm:prefix_cache_", "vllm:gpu_prefix_cache_")


def test_the_renamed_metrics_give_the_same_window():
    new = window([scrape(SAT, 0), scrape(SAT, 11)])
    old = window([scrape(SAT, 0, edit=_old), scrape(SAT, 11, edit=_old)])
    assert old["itl"] == new["itl"] and old["prefix_queries"] == new["prefix_queries"] == 7971


def test_the_current_name_wins_where_both_are_exposed():
    # 0.10.2-0.14 expose both names; the old one here is given other numbers, which must not be read
    def both(text: str) -> str:
        return text + 'vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 1.0\n'

    s = scrape(SAT, 11, edit=both)
    assert s.hists["itl"].count == 5093


def test_prompt_lengths_are_the_window_increase_at_vllms_bucket_bounds():
    w = window([scrape(SAT, 0), scrape(SAT, 11)])
    # 4 requests finished: 2 at most 1000 prompt tokens, 2 in (1000, 2000]
    assert w["prompt_len"] == {"count": 4, "median_le": 1000, "over_median": 2}
    assert window([scrape(SAT, 11), scrape(SAT, 11)])["prompt_len"] is None  # no request finished in it
