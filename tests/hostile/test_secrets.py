"""Class 8 of issue 10: the secrets that survived, planted where a real log puts them (the
evidence line, the args dump, a colour-coded line, a wrapped line) and in vLLM's own command
line; none may reach server.log, report.md, report.json, env.txt or explain's markdown/json,
and server.log keeps the capture's line count."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from typer.testing import CliRunner

from conftest import LAB, conforms
from vllm_doctor.cli import app

URL_PASS = "urlpass-7d1e2f"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzz"
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
PASSWORD = "hunter2-hunter2"
API_HEADER = "x-api-key-value-0a1b2c"
HF_COLOUR = "hf_ColourColourColourColour0123"
SPLIT = "split-environment-secret-0123456789"
SECOND_WORD = "secondword42"
PATTERN_SECRETS = [URL_PASS, AWS_SECRET, AWS_ID, PASSWORD, API_HEADER, HF_COLOUR]


def _planted(tmp_path):
    lines = (LAB / "tp-divisibility.log").read_text().split("\n")
    hostile = (
        f" https://user:{URL_PASS}@mirror.internal aws_secret_access_key = {AWS_SECRET} {AWS_ID}"
        f" password: {PASSWORD} x-api-key: {API_HEADER} \x1b[32m{HF_COLOUR}\x1b[0m"
    )
    out = []
    for line in lines:
        if "must be divisible by tensor parallel size" in line:
            line += hostile  # the evidence line: quoted in report.md and report.json
        out.append(line)
    out.insert(3, f"INFO loading with token {SPLIT[:14]}")  # a wrapped line: the value goes on below
    out.insert(4, f"{SPLIT[14:]} (continued)")
    path = tmp_path / "hostile.log"
    path.write_text("\n".join(out) + "\n")
    return path


def test_serve_report_directory_holds_none_of_them(tmp_path, fake_bin):
    log = _planted(tmp_path)
    vllm = fake_bin
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env.update(FAKE_REPLAY=str(log), FAKE_END="exit:1", VLLM_LOADER_SECRET=SPLIT)
    p = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "serve", "--vllm-bin", str(vllm), "--", "/m"]
        + ["--api-key", f"first {SECOND_WORD}"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
    )
    assert p.returncode == 1
    (d,) = (tmp_path / "vllm-doctor-reports").iterdir()
    assert {f.name for f in d.iterdir()} == {"report.md", "report.json", "server.log", "env.txt", "report.html"}
    for f in d.iterdir():
        text = f.read_text(errors="replace")
        for s in [*PATTERN_SECRETS, SPLIT[:14], SPLIT[14:], SECOND_WORD]:
            assert s not in text, (f.name, s)
    assert (d / "server.log").read_text().count("\n") == log.read_text().count("\n")
    data = conforms((d / "report.json").read_text(), "serve-report-1")
    assert data["diagnoses"][0]["category"] == "tp-divisibility"
    assert "[REDACTED]" in json.dumps(data["diagnoses"][0]["evidence"])


def test_explain_markdown_json_and_html_hold_none_of_them(tmp_path):
    log = _planted(tmp_path)
    for fmt in ("markdown", "json", "html"):
        r = CliRunner().invoke(app, ["explain", str(log), "--format", fmt, "--no-gpu", "--offline"])
        assert r.exit_code == 1, r.output
        assert "tp-divisibility" in r.output
        for s in PATTERN_SECRETS:
            assert s not in r.output, (fmt, s)
