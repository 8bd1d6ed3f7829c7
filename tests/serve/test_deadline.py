"""Issue 37: serve's exit diagnosis within --diagnose-timeout (a pod has 30 s before SIGKILL). Past
the reading's share of it, the capture's start and end are read and the report says which lines
were not; server.log is still the whole output; a redacted copy that cannot finish in time is
ended and said to be, and the capture kept."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from conftest import LAB
from vllm_doctor.read import budget, logread
from vllm_doctor.serve import incident
from vllm_doctor.serve import options as options_mod
from vllm_doctor.serve import wrapper as serve_mod

ACCESS = '(APIServer pid=12761) INFO:     127.0.0.1:{port} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'


def test_a_late_diagnosis_reads_the_start_and_the_end(tmp_path, fake_bin, monkeypatch):
    monkeypatch.setattr(budget, "LEAST_HEAD", 256 << 10)
    monkeypatch.setattr(budget, "LEAST_TAIL", 256 << 10)
    monkeypatch.setattr(logread, "BLOCK", 256 << 10)  # (what a buffer holds is read: a small one, a small log)
    now = time.monotonic()  # the reading's share is over at once; the copy's is not
    monkeypatch.setattr(
        budget.Budget, "within", staticmethod(lambda seconds: budget.Budget(now - 1, now - 1, seconds, now))
    )
    log = tmp_path / "replay.log"
    body = "".join(ACCESS.format(port=30000 + i % 30000) for i in range(20_000))
    log.write_text((LAB / "healthy.log").read_text() + body + (LAB / "cache-oom.log").read_text())
    for k, v in {"FAKE_REPLAY": log, "FAKE_ALL_STDOUT": 1, "FAKE_END": "exit:1"}.items():
        monkeypatch.setenv(k, str(v))
    monkeypatch.chdir(tmp_path)
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        o = serve_mod.run(options_mod.ServeOptions(["/m"], vllm_bin=str(fake_bin), stdout_fd=out.fileno(),
                                                   stderr_fd=err.fileno(), termination_log=tmp_path / "term"))  # fmt: skip
    assert o.status == 1 and o.report_dir is not None
    said = (tmp_path / "err").read_text()
    assert "(read within --diagnose-timeout 20 s: the middle of the output was not)" in said
    report = json.loads((o.report_dir / "report.json").read_text())
    [note] = [w for w in report["input"]["warnings"] if "were not read" in w]
    assert note.startswith("server.log: the diagnosis had 20 s") and "/tmp" not in note
    assert report["diagnoses"][0]["category"] == "cache-oom"
    assert report["input"]["lines"] == len(log.read_bytes().splitlines())
    assert (o.report_dir / "server.log").read_bytes() == log.read_bytes()  # the whole output, still
    assert "cache-oom" in (tmp_path / "term").read_text()


def test_a_copy_past_its_time_is_ended_and_said(tmp_path):
    capture = tmp_path / "capture.log"
    capture.write_bytes(b"x" * (1 << 20))
    w = SimpleNamespace(capture_path=capture, opts=SimpleNamespace(diagnose_timeout=20.0))
    for name, by, said in (("late", time.monotonic() - 1, "not copied within --diagnose-timeout 20 s"),
                           ("in-time", time.monotonic() + 60, None)):  # fmt: skip
        (tmp_path / name).mkdir()
        files = incident.ReportFiles(tmp_path / name)
        try:
            assert incident._copy_aside(w, files, None, by)() == said
        finally:
            files.close()
    assert (tmp_path / "in-time" / "server.log").read_bytes() == capture.read_bytes()
