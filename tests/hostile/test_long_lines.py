"""Long lines are matched around every anchor, not only near the first (issue 10, class 2): a log
with CR-only line ends, a failure glued after hundreds of progress-bar redraws, or a megabyte
line with the failure at its end, all come out failed, with the blocker's line number."""

from __future__ import annotations

import pytest
import shapes
from typer.testing import CliRunner

from conftest import conforms
from vllm_doctor.cli import app
from vllm_doctor.read import logread
from vllm_doctor.read.prefilter import Prefilter


def explain(tmp_path, data: bytes, name: str = "server.log") -> dict:
    path = tmp_path / name
    path.write_bytes(data)
    result = CliRunner().invoke(app, ["explain", str(path), "--format", "json", "--no-gpu"])
    assert result.exit_code == 1, (result.exit_code, result.output[-2000:])
    return conforms(result.stdout)


def blocker(report: dict) -> dict:
    """The one blocker, shapes.BLOCKER's CUDA OOM with its numbers (its evidence is the first
    EVIDENCE_CHARS of the piece it was found in, which on a long line starts before it)."""
    [d] = [d for d in report["diagnoses"] if d["severity"] == "blocker"]
    assert d["category"] in ("weights-oom", "cache-oom") and d["numbers"]["alloc"] == 2.0, d
    return d


def test_cr_only_line_ends_are_lines(tmp_path):
    report = explain(tmp_path, shapes.cr_only(2000))
    assert report["status"] == "failed"
    assert report["input"]["lines"] == 2004  # each CR ends a line, so the numbers are an editor's
    assert blocker(report)["evidence"][0]["line"] == 2004
    assert any("bare CR" in w for w in report["input"]["warnings"])


def test_a_short_cr_only_log_is_read_by_lines_too(tmp_path):
    report = explain(tmp_path, (shapes.STARTUP[0] + "\r" + shapes.BLOCKER + "\r").encode())
    assert report["input"]["lines"] == 2 and blocker(report)["evidence"][0]["line"] == 2


def test_crlf_and_progress_bars_are_no_cr_only_log(tmp_path):
    """A CRLF log, or an LF log with a tqdm bar in it, keeps its LF line numbers."""
    crlf = "".join(line + "\r\n" for line in [*shapes.STARTUP, shapes.BLOCKER]).encode()
    report = explain(tmp_path, crlf, "crlf.log")
    assert report["input"]["lines"] == 4 and blocker(report)["evidence"][0]["line"] == 4
    assert report["input"]["warnings"] == []
    report = explain(tmp_path, shapes.tqdm_glued(200), "tqdm.log")
    assert report["input"]["lines"] == 5 and report["input"]["warnings"] == []


@pytest.mark.parametrize("updates", [1, 200, 5000])
def test_a_failure_glued_after_progress_bar_redraws(tmp_path, updates):
    """The process died mid-bar: the record follows the last redraw on the same line. It is
    matched as the record it is (its process and level read), on the bar's line."""
    report = explain(tmp_path, shapes.tqdm_glued(updates))
    d = blocker(report)
    assert d["evidence"][0]["line"] == 4
    assert d["evidence"][0]["text"].startswith("Loading safetensors checkpoint shards: 100%")


def test_the_record_after_the_last_redraw_is_read_with_its_prefix():
    bar = "".join(f"\rLoading: {k}/300 [00:01<00:00, 3.1it/s]" for k in range(301))
    data = (bar + shapes.BLOCKER + "\n").encode()
    pf = Prefilter(["out of memory"])
    import io

    lines = list(logread._read_one(io.BytesIO(data), "x.log", 0, pf, logread.ReadStats()))
    [line] = [ln for ln in lines if ln.hit]
    assert (line.no, line.level, line.process) == (1, "ERROR", "EngineCore_DP0")
    assert line.text.startswith("torch.OutOfMemoryError: CUDA out of memory.")


@pytest.mark.parametrize("size", [64 << 10, 1 << 20, 4 << 20])
def test_a_megabyte_line_full_of_anchors_with_the_failure_at_its_end(tmp_path, size):
    report = explain(tmp_path, shapes.megaline(size))
    assert blocker(report)["evidence"][0]["line"] == 4


def test_a_failure_in_the_middle_of_a_long_line_of_anchors(tmp_path):
    piece = shapes.GLUED
    line = piece * 3000 + shapes.BLOCKER + " " + piece * 3000
    report = explain(tmp_path, (line + "\n").encode())
    assert blocker(report)["evidence"][0]["line"] == 1


def test_a_line_longer_than_the_buffer_keeps_its_failure_at_the_end(tmp_path, monkeypatch):
    """Past BLOCK a line is read in fragments; the pieces of each are cut around every anchor too."""
    monkeypatch.setattr(logread, "BLOCK", 256 << 10)
    monkeypatch.setattr(logread, "FIRST_BLOCK", 64 << 10)
    report = explain(tmp_path, shapes.megaline(2 << 20))
    assert blocker(report)["evidence"][0]["line"] == 4 and report["input"]["lines"] == 4


def test_every_piece_is_bounded_and_holds_its_anchor_with_a_margin():
    piece = b"x" * 700 + b"out of memory"
    data = piece * 2000 + b"\rtail out of memory\r\n"
    pf = Prefilter(["out of memory"])
    spans = list(logread._spans(data, 0, len(data.rstrip(b"\r\n")), pf))
    assert all(e - s <= 2 * logread.WINDOW for s, e, _ in spans)
    covered = [(s, e) for s, e, _ in spans]
    cr = data.index(b"\r")
    for hit_end, _ in pf.scan(data):
        before = hit_end - 13 - logread.MARGIN
        after = hit_end + logread.MARGIN
        # MARGIN bytes either side, unless the line's start or the CR comes first
        assert any(s <= max(before, 0) and min(after, cr) <= e for s, e in covered if hit_end <= cr) or hit_end > cr
    assert data[spans[-1][0] : spans[-1][1]] == b"tail out of memory"
