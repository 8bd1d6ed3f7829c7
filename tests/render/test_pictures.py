"""The pictures (issue 14): the terminal's memory bar and sparklines, the SVG charts and the HTML
report, on the lab's real recordings and the fixtures; every number drawn is the report's."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from conftest import FIXTURES, LAB
from vllm_doctor.cli import app
from vllm_doctor.knowledge.checks import Options
from vllm_doctor.pipeline import explain
from vllm_doctor.render import bars, html, svg
from vllm_doctor.render.text import render as to_text

SVG = "{http://www.w3.org/2000/svg}"
V0_PROFILE = FIXTURES / "logs/kv-capacity/0.6.6_v0-memory-profiling-takes-three-lines.log"
OCCUPIED = FIXTURES / "logs/gpu-memory-occupied/0.9.2_free-memory-below-utilization.log"


def report_of(*paths: Path):
    return explain([str(p) for p in paths], options=Options())


def restarts(tmp_path: Path) -> Path:
    out = tmp_path / "restarts.log"
    names = ("startup-port-in-use.log", "cache-oom.log", "queue-saturation.log")
    out.write_bytes(b"".join((LAB / n).read_bytes() for n in names))
    return out


def drawn(text: str) -> list[str]:
    """The terminal's picture lines: the bars, their legends, the sparklines."""
    pic = re.compile(r"^  (Memory|KV cache|Waiting|KV usage) +\S|^  [WANGKkO!.|] \S")
    return [line for line in text.splitlines() if pic.match(line)]


def diag(report, category: str):
    return next(d for d in report.diagnoses if d.category == category)


# ---- the terminal ------------------------------------------------------------------------------


def test_cache_oom_bar_is_the_cache_against_one_sequence():
    report = report_of(LAB / "cache-oom.log")
    d = diag(report, "cache-oom")
    bar = bars.memory_bars(report, d)[0]
    assert bar is not None and bar.total == d.numbers["needed_gib"] == 4.0
    assert [(s.key, s.value) for s in bar.segments] == [
        ("kv", d.numbers["available_gib"]),
        ("missing", d.numbers["missing_gib"]),
    ]
    lines = drawn(to_text(report))
    assert lines[0].startswith("  KV cache  KKKKKKKKKKKK!!!") and lines[0].endswith("!  4 GiB")
    assert lines[1] == "  K KV cache available 0.98 GiB   ! short of one sequence 3.02 GiB"
    assert all(len(line) <= 80 for line in lines)


def test_a_v0_memory_profile_is_drawn_from_vllms_own_numbers():
    report = report_of(V0_PROFILE)
    (bar,) = bars.memory_bars(report, diag(report, "kv-capacity"))
    mem = report.facts["memory"]
    assert (
        bar is not None
        and bar.total == mem["total_gib"]
        and bar.mark == ("total x utilization 71.24 GiB", mem["requested_gib"])
    )
    got = {s.key: s.value for s in bar.segments}
    assert got == {"weights": mem["weights_gib"], "activation": mem["activation_gib"], "non_torch": mem["non_torch_gib"],
                   "kv": mem["kv_gib"], "free": round(mem["total_gib"] - mem["requested_gib"], 2)}  # fmt: skip
    lines = drawn(to_text(report))
    assert lines[0].startswith("  Memory    WWWWWWWW") and len(lines) == 4 and all(len(x) <= 80 for x in lines)


def test_a_torch_oom_is_the_gpu_at_the_error_in_its_own_figures():
    report = report_of(FIXTURES / "logs/weights-oom/0.10.1_v1-oom-in-load-model-tp1.log")
    d = diag(report, "weights-oom")
    assert (d.numbers["alloc"], d.numbers["total"], d.numbers["free"], d.numbers["free_unit"]) == (
        1.16,
        79.19,
        846.0,
        "MiB",
    )
    (bar,) = bars.memory_bars(report, d)
    assert [(s.key, s.label, s.value) for s in bar.segments] == [
        ("other", "in use (total - free)", 78.36),
        ("free", "free (846 MiB)", 0.83),
        ("missing", "short of the 1.16 GiB allocation", 0.33),
    ]
    assert bar.mark == ("GPU total 79.19 GiB", 79.19)
    line = drawn(to_text(report))[0]
    assert line.endswith("O.!") and "79.52" not in line  # the segments' sum is no figure of vLLM's: not printed


def test_a_cache_oom_with_a_profile_shows_both_what_failed_and_where_memory_went():
    report = report_of(FIXTURES / "logs/cache-oom/0.6.3_v0-profile-summary-and-multiline-command.log")
    assert [b.name for b in bars.all_bars(report)] == ["KV cache", "Memory"]
    assert bars.all_bars(report)[0].total == diag(report, "cache-oom").numbers["max_model_len"] == 131072
    text = to_text(report)
    assert (
        text.count("  KV cache  KKKK") == 1 and text.count("  Memory    WWWW") == 1
    )  # the profile once, for two diagnoses


def test_memory_held_by_other_processes_is_vllms_figure():
    report = report_of(OCCUPIED)
    d = diag(report, "gpu-memory-occupied")
    bar = bars.memory_bars(report, d)[0]
    assert bar is not None
    assert [(s.key, s.value) for s in bar.segments] == [
        ("other", d.numbers["held_by_others_gib"]),
        ("free", d.numbers["free_gib"]),
    ]


def test_this_machines_gpu_is_drawn_only_when_the_log_is_from_it():
    """NVML's snapshot (the one faked adapter's data) as its own bar, in NVML's MiB, beside the log's profile."""
    from vllm_doctor.capacity.gpu import GpuDevice, GpuProcess, GpuSnapshot

    dev = GpuDevice(0, "NVIDIA L4", 23034, 20790, 2244, [GpuProcess(4242, "python3", 20480)])
    snap = GpuSnapshot(True, devices=[dev], driver_version="550.54.15", cuda_version="12.4")
    log = FIXTURES / "logs/cache-oom/0.6.3_v0-profile-summary-and-multiline-command.log"
    here = explain([str(log)], options=Options(gpu_snapshot=snap, this_host=True))
    bar = bars.gpu_bar(here)
    assert bar is not None and bar.total == 23034 and bar.unit == "MiB"
    assert [(s.label, s.value) for s in bar.segments] == [
        ("pid 4242 python3", 20480),
        ("used, by no process listed", 310),
        ("free", 2244),
    ]
    text = to_text(here)
    assert (
        text.count("  GPU now   OOOO") == 1 and text.count("  Memory    WWWW") == 1
    )  # once, for two capacity diagnoses
    assert "NVIDIA L4 now" in (svg.memory(here) or "")
    elsewhere = explain([str(log)], options=Options(gpu_snapshot=snap, this_host=False))
    assert bars.gpu_bar(elsewhere) is None and "GPU now" not in to_text(elsewhere)


def test_queue_saturation_sparklines_follow_the_samples():
    report = report_of(LAB / "queue-saturation.log")
    waiting = [p["waiting"] for p in report.series]
    assert len(waiting) == report.facts["stats"]["samples"] == 11 and max(waiting) == 12
    lines = bars.queue_lines(report, colour=False)
    assert (
        lines[0]
        == f"  Waiting   {bars.spark(bars.points(report, 'waiting'), 12, colour=False)}  max 12, 01:58:49 to 02:00:29"
    )
    assert lines[1].startswith("  KV usage  ") and lines[1].endswith("  max 100%")
    spark = lines[0].split()[1]
    assert len(spark) == 11 and spark[waiting.index(12)] == "#" and spark[0] != "#"  # 9 of 12 is not the top
    assert set(lines) <= set(to_text(report).splitlines())  # under the diagnosis, in the report


def test_colour_on_a_terminal_letters_in_a_pipe():
    report = report_of(LAB / "cache-oom.log")
    d = diag(report, "cache-oom")
    for kw, want, unwanted in ((dict(force_terminal=True, color_system="truecolor"), "█", "KKK"), ({}, "KKK", "█")):
        buf = io.StringIO()
        bars.show(Console(file=buf, width=200, **kw), report, d)
        assert want in buf.getvalue() and unwanted not in buf.getvalue()
    buf = io.StringIO()
    bars.show(Console(file=buf, force_terminal=True, no_color=True), report, d)  # NO_COLOR
    assert "KKK" in buf.getvalue()


def test_a_long_series_fills_the_sparkline_width_with_its_peaks():
    series = [(i, float(i % 10)) for i in range(1, 1001)]
    series[500] = (501, 40.0)
    line = bars.spark(series, 40.0, width=32)
    assert len(line) == 32 and line.count("█") == 1


@pytest.mark.parametrize("name", ["tp-divisibility.log", "startup-port-in-use.log"])
def test_nothing_is_drawn_when_there_is_nothing_to_draw(name):
    report = report_of(LAB / name)
    assert drawn(to_text(report)) == []
    assert svg.memory(report) is None and svg.queue(report) is None and svg.restarts(report) is None
    assert html.links(report) == [] and [n for n, _ in html.attachments(report, lambda: "")] == ["report.html"]


# ---- SVG and HTML ------------------------------------------------------------------------------


def classes(root: ET.Element) -> list[str]:
    return [c for e in root.iter() for c in (e.get("class") or "").split()]


def test_the_queue_chart_marks_the_failure_and_draws_vllms_samples(tmp_path):
    report = report_of(LAB / "queue-saturation.log")
    root = ET.fromstring(svg.queue(report) or "")
    cls = classes(root)
    assert {"axis", "legend", "failure-marker", "series-waiting", "series-kv_usage_pct"} <= set(cls)
    marker = next(e for e in root.iter(f"{SVG}g") if e.get("class") == "failure-marker")
    assert "".join(marker.itertext()) == "queue-saturation from 01:58:49"  # the diagnosis's first evidence line's time
    tips = [t.text for t in root.iter(f"{SVG}title") if t.text and t.text.startswith("line ") and "Waiting" in t.text]
    want = [f"line {p['line']} {p['time']}: Waiting {p['waiting']}" for p in report.series]
    assert tips == want


def test_the_restart_timeline_shows_every_start_and_where_each_died(tmp_path):
    report = report_of(restarts(tmp_path))
    root = ET.fromstring(svg.restarts(report) or "")
    lives = [e for e in root.iter(f"{SVG}rect") if "life" in (e.get("class") or "").split()]
    by_time = sorted(report.lifetimes, key=lambda life: life.started or "")  # the port-in-use start is the latest
    assert [e.get("class") for e in lives] == [f"life status-{life.report.status}" for life in by_time]
    assert [life.index for life in by_time] == [2, 3, 1]
    fatal = sum(1 for life in report.lifetimes if life.end == "fatal")
    assert classes(root).count("failure-marker") == fatal == 2
    legend = "".join(next(e for e in root.iter(f"{SVG}g") if e.get("class") == "legend").itertext())
    for life in report.lifetimes:
        assert f"#{life.index} {life.started}" in legend and life.outcome in legend


def test_the_html_report_is_self_contained_and_built_from_the_report(tmp_path):
    report = report_of(restarts(tmp_path))
    page = html.render(report)
    assert page.startswith("<!DOCTYPE html>") and "default-src 'none'" in page
    assert "<script" not in page and not re.search(r"""\s(src|href)=""", page) and "@import" not in page
    assert page.count("<svg") == 3  # restarts, memory, queue
    assert "```" not in page and "**" not in page and "|---" not in page  # HTML, not the Markdown text
    from html import unescape

    d = report.diagnoses[0]
    assert unescape(page).count(d.summary) == 1 and page.count('<ol class="fixes">') >= 1
    for f in d.fixes:
        assert f'<li value="{f.rank}"><strong>' in page
    assert f"line {d.evidence[0].line}:</span>" in page
    ET.fromstring(svg.memory(report) or "")  # each chart is well-formed XML alone too


def test_the_html_page_escapes_what_the_log_says(tmp_path):
    """A log line with HTML in it is text on the page: autoescaped by the template, in the
    evidence, the summary's quotes and the pictures' labels alike."""
    log = tmp_path / "hostile.log"
    text = (LAB / "cache-oom.log").read_text(encoding="utf-8")
    log.write_text(text.replace("/models/wide-llama", "/models/<script>alert(1)</script>&<b>x</b>"), encoding="utf-8")
    page = html.render(report_of(log))
    assert "<script" not in page and "<b>" not in page and "&lt;script&gt;" in page


def test_explain_writes_html(tmp_path):
    out = tmp_path / "report.html"
    r = CliRunner().invoke(app, ["explain", str(LAB / "cache-oom.log"), "--no-gpu", "--format", "html", "-o", str(out)])
    assert r.exit_code in (0, 1), r.output
    page = out.read_text()
    assert 'class="segment seg-missing"' in page and "short of one sequence: 3.02 GiB" in page


def test_a_plan_as_html_is_its_markdown_in_a_page():
    args = ["plan", "--params", "7B", "--layers", "32", "--heads", "32", "--kv-heads", "8", "--head-dim", "128"]
    r = CliRunner().invoke(app, [*args, "--gpu-memory", "80GiB", "--format", "html"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("<!DOCTYPE html>") and "Valid `--tensor-parallel-size`: 1, 2, 4, 8" in r.output


def test_a_negative_kv_cache_is_not_drawn_as_a_negative_bar(tmp_path):
    """V0 prints a negative rest for the KV cache when the weights and activations take it all."""
    src = FIXTURES / "logs/cache-oom/0.6.3_v0-profile-summary-and-multiline-command.log"
    log = tmp_path / "negative.log"
    log.write_text(src.read_text().replace("reserved for KV Cache is 2.25GiB", "reserved for KV Cache is -1.25GiB"))
    report = report_of(log)
    assert report.facts["memory"]["kv_gib"] == -1.25
    profile = next(b for b in bars.all_bars(report) if b.name == "Memory")
    assert "kv" not in {s.key for s in profile.segments} and all(s.value > 0 for s in profile.segments)
    picture = svg.memory(report) or ""
    ET.fromstring(picture)
    assert not re.search(r'width="-', picture)


@pytest.mark.parametrize("name", ["queue-saturation.log", "cache-oom.log"])
def test_the_json_holds_the_samples_drawn_each_as_vllm_printed_it(name):
    import json

    from vllm_doctor.render.json import render as to_json

    report = report_of(LAB / name)
    series = json.loads(to_json(report))["facts"]["stats"]["series"]
    assert len(series) == len(report.series) == report.facts["stats"]["samples"]
    lines = (LAB / name).read_bytes().decode().split("\n")  # vLLM's line numbers: LF only
    for p in series:
        text = lines[p["line"] - 1]
        assert p["source"] == 0 and p["time"] in text
        assert f"Running: {p['running']} reqs, Waiting: {p['waiting']} reqs" in text
        assert f"KV cache usage: {p['kv_usage_pct']}%" in text
    assert [p["waiting"] for p in series] == [p["waiting"] for p in report.series]


def test_explain_writes_the_pictures_beside_a_markdown_file_and_links_them(tmp_path):
    log = restarts(tmp_path)
    out = tmp_path / "out" / "incident.md"
    out.parent.mkdir()
    r = CliRunner().invoke(app, ["explain", str(log), "--no-gpu", "--format", "markdown", "-o", str(out)])
    assert r.exit_code in (0, 1), r.output
    names = ["incident.restarts.svg", "incident.memory.svg", "incident.queue.svg"]
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([*names, "incident.md"])
    md = out.read_text()
    stdout = CliRunner().invoke(app, ["explain", str(log), "--no-gpu", "--format", "markdown"])
    assert "### Pictures" not in stdout.stdout and "pictures written" not in stdout.stderr
    assert md.startswith(stdout.stdout.rstrip("\n") + "\n\n### Pictures")  # the ticket, then its pictures
    assert md.endswith("### Pictures\n\n" + "".join(f"![{n.split('.')[1]}]({n})\n" for n in names))
    assert f"pictures written to {', '.join(str(out.parent / n) for n in names)}" in r.stderr
    for n in names:
        assert ET.parse(out.parent / n).getroot().tag == f"{SVG}svg"
    assert "incident.memory.svg" not in r.stdout


def test_a_markdown_file_with_nothing_to_draw_gets_no_pictures(tmp_path):
    out = tmp_path / "report.md"
    r = CliRunner().invoke(app, ["explain", str(LAB / "startup-port-in-use.log"), "--no-gpu", "-o", str(out)])
    assert r.exit_code in (0, 1), r.output
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"] and "### Pictures" not in out.read_text()
    assert "pictures written" not in r.stderr
    one = tmp_path / "oom" / "report.md"
    one.parent.mkdir()
    CliRunner().invoke(app, ["explain", str(LAB / "cache-oom.log"), "--no-gpu", "-o", str(one)])
    assert sorted(p.name for p in one.parent.iterdir()) == ["report.md", "report.memory.svg"]


def lanes(picture: str) -> list[tuple[float, float]]:
    """The restart timeline's starts as drawn, left to right: (x, x + width)."""
    rects = [e for e in ET.fromstring(picture).iter(f"{SVG}rect") if "life" in (e.get("class") or "").split()]
    return [(float(e.get("x") or 0), float(e.get("x") or 0) + float(e.get("width") or 0)) for e in rects]


def untimed(tmp_path: Path, name: str) -> Path:
    """A lab recording with vLLM's times taken out of its lines: the timeline can only go by lines."""
    out = tmp_path / name
    out.write_bytes(re.sub(rb"(INFO|WARNING|ERROR|DEBUG) \d\d-\d\d \d\d:\d\d:\d\d", rb"\1", (LAB / name).read_bytes()))
    return out


def test_starts_from_two_files_are_laid_out_one_after_the_other(tmp_path):
    """`explain a.log b.log`, cat-style: each file's lines count from 1, so laid out by line alone
    the second file's start would sit on the first's."""
    timed = report_of(LAB / "cache-oom.log", LAB / "queue-saturation.log")
    assert [(life.sources, life.lines[0]) for life in timed.lifetimes] == [((0, 0), 4), ((1, 1), 4)]
    plain = report_of(untimed(tmp_path, "cache-oom.log"), untimed(tmp_path, "queue-saturation.log"))
    assert [life.started for life in plain.lifetimes] == [None, None]
    for report in (timed, plain):
        picture = svg.restarts(report) or ""
        spans = lanes(picture)
        assert len(spans) == 2 and all(a < b for a, b in spans)
        assert spans[0][0] == 10 and abs(spans[-1][1] - (svg.WIDTH - 10)) < 0.2  # the whole lane
        assert all(b0 < a1 for (_, b0), (a1, _) in zip(spans, spans[1:], strict=False)), spans  # strictly left to right
        assert "#1 " in picture and "cache-oom.log lines 4-" in picture
    axis = "".join(
        next(e for e in ET.fromstring(svg.restarts(plain) or "").iter(f"{SVG}g") if e.get("class") == "axis").itertext()
    )
    assert axis.startswith("cache-oom.log line 4") and "queue-saturation.log line " in axis
    assert 'class="input-edge"' in (svg.restarts(plain) or "") and 'class="input-edge"' not in (
        svg.restarts(timed) or ""
    )


def test_starts_go_by_the_clock_when_every_one_has_its_times():
    """The port-in-use recording is the latest (02:11): given first, it is still drawn last."""
    report = report_of(LAB / "startup-port-in-use.log", LAB / "cache-oom.log", LAB / "queue-saturation.log")
    legend = next(e for e in ET.fromstring(svg.restarts(report) or "").iter(f"{SVG}g") if e.get("class") == "legend")
    rows = [t.text or "" for t in legend.iter(f"{SVG}text") if (t.text or "").startswith("#")]
    assert [row.split()[0] for row in rows] == ["#2", "#3", "#1"]
    spans = lanes(svg.restarts(report) or "")
    assert all(b0 < a1 for (_, b0), (a1, _) in zip(spans, spans[1:], strict=False))
