"""A few NULs do not reject a log (issue 10, class 4): logrotate's copytruncate leaves the
writer's old offset as a hole that reads as NULs, a thousand or megabytes of them, before the
text. NUL runs are skipped with a warning; binary files (scattered NULs, undecodable bytes,
NUL padding everywhere) are still refused with one line and exit 2."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys

import pytest
import shapes
from typer.testing import CliRunner

from conftest import conforms
from vllm_doctor.cli import app
from vllm_doctor.read import logread, source
from vllm_doctor.read.prefilter import Prefilter


def explain(tmp_path, data: bytes, name: str = "server.log"):
    path = tmp_path / name
    path.write_bytes(data)
    return CliRunner().invoke(app, ["explain", str(path), "--format", "json", "--no-gpu"])


def failed_at(result, line: int) -> list[str]:
    assert result.exit_code == 1, result.output[-2000:]
    report = conforms(result.stdout)
    [d] = [d for d in report["diagnoses"] if d["severity"] == "blocker"]
    assert d["evidence"][0]["line"] == line and "CUDA out of memory" in d["evidence"][0]["text"]
    return report["input"]["warnings"]


@pytest.mark.parametrize("nuls", [16, 1000, 70_000, 8 << 20])
def test_leading_nuls_are_a_hole_not_binary(tmp_path, nuls):
    warnings = failed_at(explain(tmp_path, shapes.nul_lead(nuls)), 4)
    assert [w for w in warnings if f"skipped {nuls:,} NUL bytes in 1 run(s)" in w and "copytruncate" in w]


def test_holes_between_lines_keep_the_line_numbers(tmp_path):
    """A hole has no newline in it: the lines around it keep the numbers grep -n gives them."""
    data = shapes.nul_holes(holes=5)
    want = data.count(b"\n")
    warnings = failed_at(explain(tmp_path, data), want)
    assert any("in 5 run(s)" in w for w in warnings)


def test_a_hole_in_a_gzipped_log(tmp_path):
    warnings = failed_at(explain(tmp_path, gzip.compress(shapes.nul_lead(3 << 20)), "server.log.gz"), 4)
    assert any("skipped 3,145,728 NUL bytes" in w for w in warnings)


@pytest.mark.parametrize("piece", [7, 100, 4096])
def test_a_hole_across_reads_is_dropped_whole(monkeypatch, piece):
    """The runs that a read boundary cuts are still one hole, with no stray NULs left at the cut."""
    monkeypatch.setattr(source.Source, "PIECE", piece)
    monkeypatch.setattr(logread, "FIRST_BLOCK", 4096)
    data = b"a line\n" + b"\0" * 10_000 + b"b out of memory\n" + b"\0" * 5 + b"c\n"
    stats = logread.ReadStats()
    lines = list(logread._read_one(io.BytesIO(data), "x.log", 0, Prefilter(["out of memory"]), stats))
    assert [(ln.no, ln.raw) for ln in lines] == [(1, "a line"), (2, "b out of memory"), (3, "\0" * 5 + "c")]
    assert stats.lines == 3 and any("skipped 10,000 NUL bytes in 1 run(s)" in w for w in stats.warnings)


def test_a_file_of_nuls_only_is_an_empty_log_with_a_warning(tmp_path):
    result = explain(tmp_path, b"\0" * 100_000)
    assert result.exit_code == 4  # status unknown: no vLLM output at all (issue 9)
    report = conforms(result.stdout)
    assert report["input"]["lines"] == 0 and report["status"] == "unknown"
    assert any("skipped 100,000 NUL bytes" in w for w in report["input"]["warnings"])


def _tar_like() -> bytes:
    """An archive's headers and NUL padding: many holes, however textual the members."""
    member = (shapes.STARTUP[0] + "\n").encode()
    return b"".join(b"name\0" + b"\0" * 500 + member + b"\0" * (512 - len(member)) for _ in range(40))


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(os.urandom(70_000), id="random"),
        pytest.param("INFO CUDA out of memory\n".encode("utf-16") * 100, id="utf16"),
        pytest.param(b"\x7fELF\2\1\1" + b"\0" * 9 + bytes(range(256)) * 200, id="elf-like"),
        pytest.param(_tar_like(), id="tar-like"),
        pytest.param(b"\0" * 50_000 + os.urandom(20_000), id="hole-then-binary"),
    ],
)
def test_real_binary_files_are_still_refused(tmp_path, data):
    path = tmp_path / "input.log"
    path.write_bytes(data)
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "explain", str(path), "--no-gpu"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "binary data" in proc.stderr, proc.stderr


HOLE = 100_000  # NULs a write: 38 MB of them in all, far past what the watch queues (watch.QUEUED)


def test_serve_watch_drops_the_nul_holes_a_child_prints(tmp_path, fake_bin):
    """A child that prints NUL runs between its stats lines: the live watch reads past them as
    a file's reader does (and warns), while the operator's output keeps every byte."""
    from conftest import LAB

    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env.update(FAKE_REPLAY=str(LAB / "queue-saturation.log"), FAKE_ALL_STDOUT="1", FAKE_NULS=str(HOLE), NO_COLOR="1")
    p = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "serve", "--vllm-bin", str(fake_bin), "--preflight", "off", "--", "m"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert p.returncode == 0
    recording = (LAB / "queue-saturation.log").read_bytes()
    assert p.stdout == b"".join(ln + b"\n" + b"\0" * 2 * HOLE for ln in recording.split(b"\n")[:-1])
    warnings = [ln for ln in p.stderr.decode().splitlines() if "[vllm-doctor] warning" in ln]
    assert len(warnings) == 1 and "queue-saturation" in warnings[0]


def test_chunk_lines_drop_a_nul_hole_cut_between_chunks():
    pf = Prefilter(["Running: "])
    reader = logread.ChunkLines(pf)
    got = reader.feed(b"a\n" + b"\0" * 10) + reader.feed(b"\0" * 10 + b"Running: 1 reqs\n\0\0\0x Running: 2\n")
    assert [(x.no, x.raw) for x in got] == [(2, "Running: 1 reqs"), (3, "\0\0\0x Running: 2")]
