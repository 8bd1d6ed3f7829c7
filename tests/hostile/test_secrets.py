"""Class 8 of issue 10: the secrets that survived, planted where a real log puts them (the
evidence line, the args dump, a colour-coded line, a wrapped line) and in vLLM's own command
line; none may reach server.log, report.md, report.json, env.txt or explain's markdown/json,
and server.log keeps the capture's line count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from typer.testing import CliRunner

from conftest import FIXTURES, LAB, conforms
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


# --------------------------------------------------------------------------------------------
# issue 25, class 3: the secrets that still leaked (round 2)
# --------------------------------------------------------------------------------------------
HF_SGR = "hf_ColonSgrColonSgrColonSgr0123"
HF_CHARSET = "hf_CharsetCharsetCharset012345"
HF_CSI8 = "hf_EightBitEightBitEightBit0123"
HF_ZW = "hf_ZeroWidthZeroWidthZeroWidth01"
HF_WRAP = "hf_WrappedWrappedWrappedWrap0123"
HIDDEN = {  # the token as the log writes it: split by something a terminal does not show
    HF_SGR: f"{HF_SGR[:9]}\x1b[38:5:196m{HF_SGR[9:]}\x1b[0m",
    HF_CHARSET: f"{HF_CHARSET[:1]}\x1b(B{HF_CHARSET[1:]}",
    HF_CSI8: f"{HF_CSI8[:6]}\u009b1m{HF_CSI8[6:]}",
    HF_ZW: f"{HF_ZW[:5]}\u200b{HF_ZW[5:]}",
}
FORM_SECRETS = {  # a line of the log -> the secret in it
    "GET /v1/models?Authorization=Bearer%20eyJbearerInTheQuery0.c2Vj.sig HTTP/1.1": "eyJbearerInTheQuery0",
    '{"event": "config {\\"password\\": \\"json-in-json-pass\\"}"}': "json-in-json-pass",
    "PGPASSWORD=pg-pass-value-01 psql -h db": "pg-pass-value-01",
    "MYSQL_PWD=mysql-pwd-value-01 mysql -u root": "mysql-pwd-value-01",
    "git clone with ghp_GithubGithubGithubGithubGithub012345": "ghp_GithubGithubGithub",
    "hf_token: hf-yaml-token-value-01": "hf-yaml-token-value-01",
    "api_token: api-yaml-token-value-01": "api-yaml-token-value-01",
    "extra: {'api_key': b'bytes-key-value-01', 'port': 8000}": "bytes-key-value-01",
}
ENV_HIDDEN = {  # variables whose name hides the secret, and one that looks like a token
    "VLLM_DB_PASS": "vllm-db-pass-value-01",
    "HF_HUB_AUTH": "hf-hub-auth-value-01",
    "HF_TOKEN_B64": "aGZfdG9rZW5iNjR2YWx1ZQ==",
    "VLLM_MIRROR_SETTING": "hf_ValueShapeValueShapeValue0123",
}
URL_PASSWORD = "model-url-pass-01"


def _planted_round_2(tmp_path):
    lines = (LAB / "tp-divisibility.log").read_text().split("\n")
    out = []
    for line in lines:
        if "must be divisible by tensor parallel size" in line:
            line += f" token {HIDDEN[HF_SGR]}"  # the evidence line: every format shows it
        out.append(line)
    pad = "(APIServer pid=1) INFO 12-03 10:00:00 [hub.py:12] fetching weights with token "
    planted = [f"INFO token {shown} loaded" for shown in HIDDEN.values()]
    planted += list(FORM_SECRETS) + [pad + HF_WRAP[:12], HF_WRAP[12:] + " (the terminal wrapped it)"]
    out[3:3] = planted
    path = tmp_path / "hostile-2.log"
    path.write_text("\n".join(out) + "\n")
    return path


def _secrets_round_2() -> list[str]:
    return [*HIDDEN, HF_SGR[9:], *FORM_SECRETS.values(), HF_WRAP[:12], HF_WRAP[12:], *ENV_HIDDEN.values()]


def test_serve_round_2_holds_none_of_them(tmp_path, fake_bin):
    """Split tokens, the new forms, a wrapped token, variables named to hide, and the password of
    the model's URL: in no file of the report, nor in the preflight note on stderr."""
    log = _planted_round_2(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env.update(FAKE_REPLAY=str(log), FAKE_END="exit:1", **ENV_HIDDEN)
    model = f"https://ops:{URL_PASSWORD}@models.internal/org/m"
    p = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "serve", "--vllm-bin", str(fake_bin), "--", model],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )
    assert p.returncode == 1, p.stderr[-2000:]
    notes = [line for line in p.stderr.decode(errors="replace").splitlines() if line.startswith("[vllm-doctor]")]
    assert any("preflight" in n and "[REDACTED]@models.internal" in n for n in notes), notes
    assert not [n for n in notes if URL_PASSWORD in n]
    (d,) = (tmp_path / "vllm-doctor-reports").iterdir()
    for f in d.iterdir():
        text = f.read_text(errors="replace")
        for s in [*_secrets_round_2(), URL_PASSWORD]:
            assert s not in text, (f.name, s)
    assert (d / "server.log").read_text().count("\n") == log.read_text().count("\n")
    env_txt = (d / "env.txt").read_text()
    for name in ENV_HIDDEN:
        assert f"  {name}=[REDACTED]\n" in env_txt, name


def test_explain_round_2_every_format(tmp_path):
    log = _planted_round_2(tmp_path)
    runner = CliRunner()
    for extra in ([], ["-v"], ["-f", "markdown"], ["-f", "json"], ["-f", "html"]):
        r = runner.invoke(app, ["explain", str(log), "--no-gpu", "--offline", *extra], env={"COLUMNS": "400"})
        assert r.exit_code == 1 and "tp-divisibility" in r.output, r.output
        for s in (HF_SGR, HF_SGR[9:]):
            assert s not in r.output, (extra, s)


def test_a_wrapped_token_shown_as_evidence(tmp_path):
    """The evidence line ends in the first piece of a token a terminal wrapped: masked in every format."""
    lines = (LAB / "tp-divisibility.log").read_text().split("\n")
    at = next(i for i, line in enumerate(lines) if "must be divisible by tensor parallel size" in line)
    lines[at] += f" token {HF_WRAP[:12]}"
    lines.insert(at + 1, HF_WRAP[12:])
    log = tmp_path / "wrapped.log"
    log.write_text("\n".join(lines) + "\n")
    for extra in ([], ["-v"], ["-f", "markdown"], ["-f", "json"]):
        r = CliRunner().invoke(app, ["explain", str(log), "--no-gpu", "--offline", *extra], env={"COLUMNS": "400"})
        assert r.exit_code == 1 and "[REDACTED]" in r.output, (extra, r.output)
        assert HF_WRAP[:12] not in r.output and HF_WRAP[12:] not in r.output, extra


def _doctor(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_doctor", *args], capture_output=True, timeout=timeout)


def test_cannot_connect_lines_hold_no_url_secret():
    """--metrics, --prometheus and watch name the URL that failed without its password or its
    secret query values (nothing listens on port 9 of this host)."""
    urls = [
        f"http://ops:{URL_PASSWORD}@127.0.0.1:9/metrics",
        "http://127.0.0.1:9/metrics?token=query-token-value-01&access_token=query-access-value-01",
    ]
    for url in urls:
        for args in (["explain", "--metrics", url], ["explain", "--prometheus", url], ["watch", url]):
            p = _doctor(*args, "--no-gpu") if args[0] == "explain" else _doctor(*args, "--samples", "1")
            err = p.stderr.decode()
            assert p.returncode == 2 and err.startswith("vllm-doctor: ") and err.count("\n") == 1, (args, err)
            for s in (URL_PASSWORD, "query-token-value-01", "query-access-value-01"):
                assert s not in err, (args, err)
            assert "[REDACTED]" in err, (args, err)


def test_follow_masks_its_live_lines(tmp_path):
    """--follow says a diagnosis while the stream is open: masked as its final report is."""
    import select

    token = "hf_FollowFollowFollowFollow012345"
    src = FIXTURES / "logs" / "model-not-found" / "0.14.0_revision-not-found-compose.log"
    data = src.read_text().replace("revision/v2.0", f"revision/{token}").encode()
    p = subprocess.Popen(
        [sys.executable, "-m", "vllm_doctor", "explain", "-", "--follow", "--no-gpu"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(data)
        p.stdin.flush()
        said, end = b"", time.monotonic() + 60  # a safety net: the line comes within the first look
        while not said.endswith(b"\n") and time.monotonic() < end:
            if select.select([p.stdout], [], [], 1.0)[0]:
                byte = os.read(p.stdout.fileno(), 1)
                if not byte:
                    break
                said += byte
        assert said.startswith(b"vllm-doctor: line ") and b"model-not-found" in said, said
        assert token.encode() not in said and b"[REDACTED]" in said, said
        out, _ = p.communicate(timeout=60)  # stdin closed: the final report
        assert p.returncode == 1 and token.encode() not in out
    finally:
        p.kill()
        p.wait()


def test_follow_keeps_its_live_lines_whole_under_no_redact():
    """--no-redact keeps everything, the live lines too (they were masked whatever the flag)."""
    token = "hf_FollowFollowFollowFollow012345"
    src = FIXTURES / "logs" / "model-not-found" / "0.14.0_revision-not-found-compose.log"
    data = src.read_text().replace("revision/v2.0", f"revision/{token}").encode()
    argv = [sys.executable, "-m", "vllm_doctor", "explain", "-", "--follow", "--no-gpu", "-f", "json"]
    masked = subprocess.run(argv, input=data, capture_output=True, timeout=120)
    whole = subprocess.run([*argv, "--no-redact"], input=data, capture_output=True, timeout=120)
    assert b"model-not-found" in masked.stderr and token.encode() not in masked.stderr, masked.stderr
    assert b"model-not-found" in whole.stderr and token.encode() in whole.stderr, whole.stderr
