"""A damaged or truncated .gz keeps everything before the damage: the failure is usually at the
end of a log, so losing the tail would hide it (issue 10, class 1)."""

from __future__ import annotations

import gzip

import pytest

from conftest import LAB
from vllm_doctor.read import logread


def _lines(path) -> tuple[int, list[str]]:
    stats = logread.ReadStats()
    from vllm_doctor.read.prefilter import Prefilter

    list(logread.read([str(path)], Prefilter([]), stats))
    return stats.lines, stats.warnings


@pytest.mark.parametrize("damage", [b"\x00", b"garbage", b"\x1f\x8b\x08\x00broken"])
def test_a_gzip_member_followed_by_damage_keeps_every_line(tmp_path, damage):
    text = "".join(f"INFO 01-01 00:00:00 line {i} of a long server log\n" for i in range(200_000))
    path = tmp_path / "server.log.gz"
    path.write_bytes(gzip.compress(text.encode()) + damage)
    lines, warnings = _lines(path)
    assert lines == 200_000
    # trailing NULs are padding to gzip (tape blocks), not damage: nothing to warn about
    assert any("damaged or truncated" in w for w in warnings) == (not damage.startswith(b"\x00"))


def test_a_truncated_gzip_keeps_what_came_before_and_the_blocker_in_it(tmp_path, run):
    log = (LAB / "cache-oom.log").read_bytes()
    packed = gzip.compress(log * 50)
    path = tmp_path / "cut.log.gz"
    path.write_bytes(packed[: len(packed) - 7])  # the trailer (CRC, size) and a little data gone
    report = run(path)
    assert report.lines >= log.count(b"\n") * 49
    assert report.status == "failed" and report.diagnoses[0].category == "cache-oom"
    assert any("damaged or truncated" in w for w in report.warnings)
