"""Classes 1 and 2 of issue 25: what the input holds is shown, never obeyed. A terminal escape, an
8-bit C1 control, DEL or a bidi control in a log line, a model path, a /metrics body, Prometheus'
error, a --follow live line or a `check --` argument reaches no output raw: every human-readable
format shows it as its escape (`\\x1b`, `\\x9b`, `\\u202e`), JSON as a \\u escape, and the only
colour codes are rich's own. In Markdown a word from the input is text: no raw HTML, no image, no
link, no emphasis of its own (parsed with markdown-it-py, CommonMark with tables as GitHub has)."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import regex

from conftest import LAB, local_http
from vllm_doctor.render.visible import HIDDEN

RAW = regex.compile(r"[[\p{Cc}\p{Bidi_Control}\p{Cs}]--[\t\n]]", regex.V1)  # what no output may carry
SGR = re.compile(r"\x1b\[[0-9;]*m")  # rich's own colour codes
# the attack forms: each one reached stdout raw before
FORMS = {
    "ris": "\x1bc",  # ESC c: the terminal resets, the report above is gone
    "osc-unterminated": "\x1b]0;title",  # swallows what follows into the window title
    "dcs": "\x1bP1$r\x1b\\",
    "apc": "\x1b_payload\x1b\\",
    "save-cursor": "\x1b7",
    "restore-cursor": "\x1b8",
    "reverse-index": "\x1bM",
    "csi-8bit": "\x9b2J",
    "osc-8bit": "\x9d0;title\x07",
    "c1": "".join(map(chr, range(0x80, 0xA0))),
    "del": "\x7f",
    "c0": "".join(chr(c) for c in range(1, 0x20) if chr(c) not in "\t\n\r"),
    "bidi": "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c",
}
MARKUP = "<img src=x onerror=alert(1)>![](http://evil/x.png)[link](http://evil/)*em*_em_`code`|cell|&#x202e;"
HOSTILE = "".join(FORMS.values()) + MARKUP


def _log(tmp_path: Path, model: str) -> Path:
    """A log whose model path is `model`: in the Input line, the summary, a fix, a number and the evidence."""
    path = tmp_path / "server.log"
    path.write_bytes(
        "INFO 07-28 08:10:03 [api_server.py:1755] vLLM API server version 0.10.0\n"
        f"INFO 07-28 08:10:03 [cli_args.py:261] non-default args: {{'model': '/m/{model}'}}\n"
        "ERROR 07-28 08:10:05 [core.py:1] OSError: Repo id must be in the form 'repo_name' or "
        f"'namespace/repo_name': '/m/{model}'. Use `repo_type` argument if needed.\n".encode()
    )
    return path


def _run(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    environ.update({"COLUMNS": "100", **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "vllm_doctor", *args], input=stdin, capture_output=True, timeout=120, env=environ
    )


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _escapes(form: str) -> list[str]:
    """How a form's hidden characters are shown."""
    return [f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" for c in form if RAW.match(c)]


def test_the_hidden_characters_are_cc_bidi_control_and_surrogates_less_tab_and_newline():
    every = "".join(map(chr, range(0x30000)))
    assert HIDDEN.findall(every) == RAW.findall(every)


@pytest.mark.parametrize("name", FORMS)
def test_a_form_in_the_model_path_and_evidence_reaches_the_screen_as_escapes(tmp_path, name):
    p = _run("explain", str(_log(tmp_path, FORMS[name])), "--no-gpu", "-v")
    out = _text(p.stdout)
    assert p.returncode == 1, p.stderr
    assert not RAW.findall(out), f"{name}: raw {RAW.findall(out)!r}"
    assert all(e in out for e in _escapes(FORMS[name]))


def test_with_colour_the_only_escape_sequences_are_riches_own(tmp_path):
    p = _run("explain", str(_log(tmp_path, HOSTILE)), "--no-gpu", "-v", "--color", "always")
    out = _text(p.stdout)
    assert SGR.search(out), "no colour at all: the test shows nothing"
    assert not RAW.findall(SGR.sub("", out))


@pytest.mark.parametrize("args", [["-f", "markdown"], ["-f", "markdown", "--flavor", "github"], ["-f", "html"]])
def test_markdown_and_html_carry_no_raw_control(tmp_path, args):
    out = _text(_run("explain", str(_log(tmp_path, HOSTILE)), "--no-gpu", *args).stdout)
    assert "\\x1bc" in out and "\\u202e" in out
    assert not RAW.findall(out)


def test_json_escapes_every_control_and_keeps_the_value(tmp_path):
    out = _text(_run("explain", str(_log(tmp_path, HOSTILE)), "--no-gpu", "-f", "json").stdout)
    assert not RAW.findall(out)  # json.dumps escapes C0; DEL, C1 and bidi were raw
    assert FORMS["bidi"] in json.loads(out)["facts"]["model"]  # the same value for a reader of the JSON


def _tokens(markdown: str):
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark").enable(["table", "strikethrough"])  # html on, as GitHub's renderer
    for block in parser.parse(markdown):
        yield block
        yield from block.children or []


def _assert_text_only(markdown: str) -> None:
    from markdown_it import MarkdownIt

    kinds = [t.type for t in _tokens(markdown)]
    held = {"html_inline", "image", "link_open", "em_open", "s_open"} & set(kinds)
    assert not held, f"markup from the input: {held}"
    blocks = [t.content.strip() for t in _tokens(markdown) if t.type == "html_block"]
    assert all(re.fullmatch(r"(<details><summary>Evidence \(\d+ lines?\)</summary>|</details>)", b) for b in blocks)
    page = MarkdownIt("commonmark").enable("table").render(markdown)
    assert "<img" not in page and "<a " not in page
    assert "&lt;img src=x onerror=alert(1)&gt;![](http://evil/x.png)[link](http://evil/)*em*_em_" in page


@pytest.mark.parametrize("flavor", ["plain", "github"])
def test_markdown_words_from_the_log_are_text(tmp_path, flavor):
    out = _text(_run("explain", str(_log(tmp_path, MARKUP)), "--no-gpu", "-f", "markdown", "--flavor", flavor).stdout)
    assert out.count("onerror") >= 4  # the Input line, the summary, the fix, the numbers' table, the evidence
    _assert_text_only(out)


def test_html_is_autoescaped(tmp_path):
    out = _text(_run("explain", str(_log(tmp_path, MARKUP)), "--no-gpu", "-f", "html").stdout)
    assert "<img" not in out and "&lt;img src=x onerror=alert(1)&gt;" in out


def _metrics(tmp_path: Path, label: str) -> Path:
    body = (LAB / "queue-saturation.metrics-1.txt").read_text()
    path = tmp_path / "scrape.txt"
    path.write_text(body.replace('model_name="/models/wide-llama"', f'model_name="/models/{label}"'))
    return path


def test_a_hostile_metrics_body_reaches_no_output_raw(tmp_path):
    scrape = str(_metrics(tmp_path, HOSTILE.replace('"', "").replace("\\", "")))
    text = _text(_run("explain", "--metrics", scrape, "--no-gpu").stdout)
    assert "\\x1bc" in text and not RAW.findall(text)
    md = _text(_run("explain", "--metrics", scrape, "--no-gpu", "-f", "markdown").stdout)
    assert not RAW.findall(md)
    _assert_text_only(md)


class _Prometheus(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = json.dumps({"status": "error", "errorType": "bad_data", "error": "no " + HOSTILE}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def prometheus():
    with local_http(_Prometheus) as url:
        yield url


def test_prometheus_error_json_reaches_stderr_as_escapes(prometheus):
    p = _run("explain", "--prometheus", prometheus, "--since", "1h", "--no-gpu")
    err = _text(p.stderr)
    assert p.returncode == 2 and "the query failed" in err
    assert "\\x1b" in err and not RAW.findall(err)


def test_follow_live_lines_show_escapes(tmp_path):
    log = _log(tmp_path, HOSTILE).read_bytes()
    p = _run("explain", "-", "--follow", "--no-gpu", "-f", "json", stdin=log)  # the live lines on stderr
    err = _text(p.stderr)
    assert "vllm-doctor: line 3: blocker model-not-found" in err, err
    assert "\\x1bc" in err and not RAW.findall(err)
    assert not RAW.findall(_text(p.stdout))


def test_a_check_argument_reaches_no_output_raw():
    model = "/m/" + HOSTILE.replace("'", "")
    text = _run("check", "--no-gpu", "--offline", "--", model)
    assert "\\x1bc" in _text(text.stdout) and not RAW.findall(_text(text.stdout + text.stderr))
    md = _text(_run("check", "--no-gpu", "--offline", "-f", "markdown", "--", model).stdout)
    assert not RAW.findall(md)
    _assert_text_only(md)


def test_an_error_quoting_an_argument_reaches_stderr_as_escapes():
    p = _run("plan", "/m/" + HOSTILE, "--params", "7B", "--gpu-memory", "80GB", "--no-gpu")
    err = _text(p.stderr)
    assert p.returncode == 2 and "\\x1bc" in err and not RAW.findall(err)


@pytest.mark.skipif(sys.platform != "linux", reason="serve's wrapper is Linux's")
def test_serves_incident_report_shows_the_log_as_text(tmp_path, fake_bin):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env.update(FAKE_REPLAY=str(_log(tmp_path, HOSTILE)), FAKE_END="exit:1")
    p = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "serve", "--vllm-bin", str(fake_bin), "--", "/m/" + MARKUP],
        cwd=tmp_path, env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    assert not RAW.findall(_text(p.stderr))
    (d,) = (tmp_path / "vllm-doctor-reports").iterdir()
    md = (d / "report.md").read_text()
    assert "\\x1bc" in md and not RAW.findall(md)
    assert not RAW.findall((d / "report.html").read_text() + (d / "report.json").read_text())
    _assert_text_only(md.split("### Pictures")[0])  # the pictures' own images end it


@pytest.mark.skipif(sys.platform != "linux", reason="serve's wrapper is Linux's")
def test_serve_masks_a_secret_before_escaping_its_markup(tmp_path, fake_bin):
    """A known secret with Markdown punctuation in it: masked before the escapes, which would hide it."""
    secret = "s3*cr_[e]t<x>!Qz9"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env.update(FAKE_REPLAY=str(_log(tmp_path, secret)), FAKE_END="exit:1", VLLM_API_KEY=secret)
    p = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "serve", "--vllm-bin", str(fake_bin), "--", "/m/model"],
        cwd=tmp_path, env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    (d,) = (tmp_path / "vllm-doctor-reports").iterdir()
    md = (d / "report.md").read_text()
    assert "is not an existing directory" in md and "Qz9" not in md
