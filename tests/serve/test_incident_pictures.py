"""serve's incident directory gets the pictures (issue 14): memory.svg and queue.svg beside
report.md when there is something to draw, linked from it, and report.html with them inline."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from conftest import LAB
from vllm_doctor.serve import options as options_mod
from vllm_doctor.serve import wrapper as serve_mod


def serve(tmp_path, fake_bin, monkeypatch, recording: str):
    monkeypatch.setenv("FAKE_REPLAY", str(LAB / recording))
    monkeypatch.setenv("FAKE_END", "exit:1")
    monkeypatch.chdir(tmp_path)
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        opts = options_mod.ServeOptions(["/m"], vllm_bin=str(fake_bin), stdout_fd=out.fileno(), stderr_fd=err.fileno())
        o = serve_mod.run(opts)
    assert o.report_dir is not None, (tmp_path / "err").read_text()
    return o.report_dir


@pytest.mark.parametrize(
    ("recording", "pictures", "inside"),
    [
        ("cache-oom.log", {"memory.svg"}, "KV cache available: 0.98 GiB"),
        ("queue-saturation.log", {"memory.svg", "queue.svg"}, "queue-saturation from 01:58:49"),
        ("tp-divisibility.log", set(), None),
    ],
)
def test_the_incident_directory_has_the_pictures_report_md_links(
    tmp_path, fake_bin, monkeypatch, recording, pictures, inside
):
    d = serve(tmp_path, fake_bin, monkeypatch, recording)
    names = {p.name for p in d.iterdir()}
    assert names & {"memory.svg", "queue.svg"} == pictures and "report.html" in names
    md = (d / "report.md").read_text()
    for name in ("memory.svg", "queue.svg"):
        assert (f"]({name})" in md) is (name in pictures)
    for name in pictures:
        root = ET.parse(d / name).getroot()  # well-formed XML, an <svg>
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
    html = (d / "report.html").read_text()
    assert "How the server ended" in html and "<script" not in html  # report.md's whole text, and no script
    assert html.count("<svg") == len(pictures)
    if inside:
        assert inside in html
