"""Reports are safe to attach: secrets seeded in every position are masked in report.md,
report.json, server.log, env.txt and `explain --format markdown|json`; line numbers stay."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import LAB
from vllm_doctor.cli import app
from vllm_doctor.render.redact import FORMS, MASK, Redactor, flag_values, is_secret_name, redact, secret_values

HF = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
HF2 = "hf_ZyXwVuTsRqPoNmLkJiHgFeDcBa9876543210"
SK = "sk-live-3f9a8b7c6d5e4f3a2b1c"
BEARER = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.sig"
PASSWORD = "correct-horse-battery-staple"
ENV_SECRET = "s3cr3t-from-the-environment-only"
CLI_ONLY = "cli-only-api-key-0123456789"
SECRETS = [HF, HF2, SK, BEARER, PASSWORD, ENV_SECRET, CLI_ONLY]


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        # Hugging Face tokens: alone, at the start, the end, inside words of a traceback
        (f"{HF}", ""),
        (f"token {HF} at the start", "at the start"),
        (f"OSError: 401 for url with token={HF}", "OSError: 401 for url"),
        # --api-key / --hf-token, both spellings, first and last on the line
        (f"vllm serve /m --api-key {SK} --port 8000", "--port 8000"),
        (f"vllm serve /m --port 8000 --api-key={SK}", "--port 8000"),
        (f"vllm serve /m --hf-token {HF} --max-model-len 1024", "--max-model-len 1024"),
        (f"vllm serve /m --api-key '{SK}'", "vllm serve /m"),
        # printed args, dict form (vLLM's "non-default args"), strings and lists
        (
            f"non-default args: {{'model_tag': '/m', 'api_key': ['{SK}'], 'max_num_batched_tokens': 8192}}",
            "'max_num_batched_tokens': 8192",
        ),
        (f"non-default args: {{'hf_token': '{HF}', 'tokenizer': '/t'}}", "'tokenizer': '/t'"),
        (f'{{"api_key": "{SK}", "enable_lora": true}}', '"enable_lora": true'),
        # Namespace form (older vLLM "args: Namespace(...)")
        (f"args: Namespace(model='/m', api_key='{SK}', hf_token=None, tokenizer='/t')", "tokenizer='/t'"),
        (f"Namespace(api_key=['{SK}', 'other-key-value'], port=8000)", "port=8000"),
        # Authorization headers
        (
            f"curl -H 'Authorization: Bearer {BEARER}' http://127.0.0.1:8000/v1/models",
            "http://127.0.0.1:8000/v1/models",
        ),
        (f"headers={{'authorization': 'Bearer {BEARER}'}}", "headers="),
        # environment variables, as NAME=value and NAME: value
        (f"HF_TOKEN={HF} vllm serve /m", "vllm serve /m"),
        (f"export OPENAI_API_KEY={SK}", "export OPENAI_API_KEY="),
        (f"VLLM_API_KEY='{SK}'", "VLLM_API_KEY="),
        (f"DB_PASSWORD={PASSWORD} S3_SECRET={PASSWORD} GITHUB_TOKEN={SK} AWS_ACCESS_KEY={SK}", "DB_PASSWORD="),
        (f"  HF_TOKEN: {HF}", "HF_TOKEN: "),
    ],
)
def test_patterns(line, kept):
    out = redact(line)
    for s in SECRETS + ["other-key-value"]:
        assert s not in out
    assert MASK in out
    assert kept in out


@pytest.mark.parametrize(
    "line",
    [
        "(APIServer pid=1) INFO non-default args: {'max_num_batched_tokens': 8192, 'tokenizer': '/t', 'hf_token': None}",
        "vllm serve /m --max-num-batched-tokens 8192 --tokenizer /t --ssl-keyfile /k.pem",
        "VLLM_CPU_KVCACHE_SPACE=1 CUDA_VISIBLE_DEVICES=0,1 NCCL_DEBUG=INFO",
        "Engine 000: Avg prompt throughput: 657.3 tokens/s, Running: 7 reqs, Waiting: 9 reqs",
        "hf_overrides={}, hf_config_path=None",
        "Maximum concurrency for 1,024 tokens per request: 1024.00x",
    ],
)
def test_ordinary_lines_stay(line):
    assert redact(line) == line


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.name)
def test_each_form_of_the_library(form):
    """Every form masks its own example, alone and among the others, line count kept."""
    assert form.secret in form.example
    out = redact(form.example)
    assert form.secret not in out and MASK in out
    assert form.pattern.sub(form.repl, form.example) != form.example  # this form, not another
    two = f"{form.example}\nplain\n{form.example}"
    assert redact(two).count("\n") == 2 and form.secret not in redact(two)


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ("git clone https://user:hunter2@hf.co/org/m", "hunter2"),
        ("redis://:pw-0123456@cache:6379/0", "pw-0123456"),
        ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCY"),
        ("AWS_SECRET_ACCESS_KEY: wJalrXUtnFEMI/K7MDENG", "wJalrXUtnFEMI/K7MDENG"),
        ("aws_access_key_id=AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
        ("password: hunter2hunter2", "hunter2hunter2"),
        ('"password" = "hunter2 with spaces"', "hunter2 with spaces"),
        ("passwd=hunter2", "hunter2"),
        ("x-api-key: 0123456789abcdef", "0123456789abcdef"),
        ("X-Api-Key:0123456789abcdef", "0123456789abcdef"),
        ("api-key = 0123456789abcdef", "0123456789abcdef"),
        ("client_secret: 's3cr3t value'", "s3cr3t value"),
        ("\x1b[32mhf_AbCdEfGhIjKlMnOpQrStUvWxYz01\x1b[0m loaded", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01"),
        ("\x1b[1m--api-key\x1b[0m sk-colour-0123456789", "sk-colour-0123456789"),
        ('vllm serve /m --api-key "first second" --port 1', "second"),
        ("vllm serve /m --api-key 'first second'", "second"),
    ],
)
def test_issue_10_forms(line, secret):
    out = redact(line)
    assert secret not in out and MASK in out
    assert out.count("\n") == line.count("\n")


def test_a_known_value_split_over_two_lines():
    r = Redactor([ENV_SECRET])
    for cut in range(1, len(ENV_SECRET)):
        text = f"a line ending in {ENV_SECRET[:cut]}\n{ENV_SECRET[cut:]} and the next one\nplain"
        assert r.text(text) == f"a line ending in {MASK}\n{MASK} and the next one\nplain", cut
    # a piece of 6 or more on its own (a report quotes one line of the two)
    assert r.line(f"line 7: {ENV_SECRET[10:]} rest") == f"line 7: {MASK} rest"
    assert r.line(f"line 6: ends with {ENV_SECRET[:10]}") == f"line 6: ends with {MASK}"


def test_flag_values_become_known_values():
    args = ["vllm", "serve", "/m", "--api-key", CLI_ONLY, f"--hf-token={HF}", "--api-key", "a b", "--port", "8"]
    assert flag_values(args) == [CLI_ONLY, HF]  # "a b" is too short to mask on its own
    assert Redactor(flag_values(args)).line(f"echo {CLI_ONLY}") == f"echo {MASK}"


def test_literals_from_the_environment():
    env = {"HF_TOKEN": HF, "MY_SERVICE_SECRET": ENV_SECRET, "HOME": "/root", "VLLM_PORT": "8000", "SHORT_KEY": "1"}
    values = secret_values(env)
    assert set(values) == {HF, ENV_SECRET}
    r = Redactor(values)
    assert r.line(f"the engine saw {ENV_SECRET} somewhere") == f"the engine saw {MASK} somewhere"
    assert is_secret_name("HF_TOKEN") and is_secret_name("X_PASSWORD") and not is_secret_name("VLLM_PORT")


def test_argv_lists():
    args = ["vllm", "serve", "/m", "--api-key", CLI_ONLY, "--port", "8000", f"--hf-token={HF}", "--api-key", "--x"]
    assert Redactor().argv(args) == [
        "vllm",
        "serve",
        "/m",
        "--api-key",
        MASK,
        "--port",
        "8000",
        f"--hf-token={MASK}",
        "--api-key",
        "--x",
    ]


def test_newlines_never_move():
    text = "\n".join([f"a {HF}", "", f"--api-key {SK}", "plain", ""])
    out = redact(text)
    assert out.count("\n") == text.count("\n")
    assert out.split("\n")[3] == "plain"


def test_bytes_lines_keep_their_ending_and_bad_bytes():
    r = Redactor()
    assert r.bytes_line(f"x --api-key {SK}\r\n".encode()) == f"x --api-key {MASK}\r\n".encode()
    raw = b"\xff\xfe not utf-8 " + HF.encode() + b"\n"
    assert r.bytes_line(raw) == b"\xff\xfe not utf-8 " + MASK.encode() + b"\n"
    assert r.bytes_line(b"no newline at the end") == b"no newline at the end"


def test_obj_redacts_keys_and_values():
    data = {"evidence": [{"line": 3, "text": f"--api-key {SK}"}], f"odd {HF}": 1, "n": 2}
    out = Redactor().obj(data)
    assert SK not in json.dumps(out) and HF not in json.dumps(out)
    assert out["n"] == 2 and out["evidence"][0]["line"] == 3


# --------------------------------------------------------------------------------------------
# the seeded log: secrets on the first line, in the args dump, in the evidence line, at the end
# --------------------------------------------------------------------------------------------
def seeded_log(tmp_path: Path) -> Path:
    lines = (LAB / "tp-divisibility.log").read_text().split("\n")
    out = []
    for line in lines:
        if "non-default args:" in line:
            line = line.replace("{", f"{{'api_key': ['{SK}'], 'hf_token': '{HF}', ", 1)
        if "must be divisible by tensor parallel size" in line:
            line = line.replace("[type=value_error", f"api_key='{SK}' [type=value_error")
        out.append(line)
    out.insert(0, f"HF_TOKEN={HF} DB_PASSWORD={PASSWORD} vllm serve /models/tiny-llama --api-key {SK}")
    out.insert(5, f'INFO: 127.0.0.1 - "GET /v1/models HTTP/1.1" Authorization: Bearer {BEARER}')
    out.append(f"token in a traceback: {HF2}")
    path = tmp_path / "seeded.log"
    path.write_text("\n".join(out) + "\n")
    return path


def _clean(text: str) -> None:
    for s in SECRETS:
        assert s not in text, s


def test_explain_markdown_and_json_redact_by_default(tmp_path):
    log = seeded_log(tmp_path)
    runner = CliRunner()
    for fmt in ("markdown", "json"):
        r = runner.invoke(app, ["explain", str(log), "--format", fmt])
        assert r.exit_code == 1, r.output
        _clean(r.output)
        assert MASK in r.output
        r = runner.invoke(app, ["explain", str(log), "--format", fmt, "--no-redact"])
        assert SK in r.output
    data = json.loads(runner.invoke(app, ["explain", str(log), "--format", "json"]).output)
    lines = log.read_text().split("\n")
    top = data["diagnoses"][0]
    assert top["category"] == "tp-divisibility"
    for e in top["evidence"]:  # line numbers unchanged: the evidence is the (redacted) line there
        assert Redactor().line(lines[e["line"] - 1]).strip()[:80] == e["text"][:80]


def test_serve_report_directory_is_redacted(tmp_path, fake_bin):
    log = seeded_log(tmp_path)
    vllm = fake_bin
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env.update(
        FAKE_REPLAY=str(log),
        FAKE_END="exit:1",
        HF_TOKEN=HF,
        VLLM_API_KEY=SK,
        MY_DB_PASSWORD=PASSWORD,
        VLLM_SOMETHING_SECRET=ENV_SECRET,
        VLLM_CPU_KVCACHE_SPACE="1",
    )

    def run(*extra):
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "vllm_doctor",
                "serve",
                "--vllm-bin",
                str(vllm),
                *extra,
                "--",
                "/models/tiny-llama",
                "--api-key",
                SK,
                "--hf-token",
                HF,
                "--api-key",
                CLI_ONLY,
            ],
            env=env,
            cwd=tmp_path,
            capture_output=True,
        )

    p = run("--report-dir", "redacted")
    assert p.returncode == 1
    # the pass-through is the operator's own output: untouched
    assert p.stdout + p.stderr.split(b"vllm-doctor:")[0] != b""
    (d,) = (tmp_path / "redacted").iterdir()
    assert {f.name for f in d.iterdir()} == {"report.md", "report.json", "server.log", "env.txt", "report.html"}
    for f in d.iterdir():
        _clean(f.read_text(errors="replace"))
    server = (d / "server.log").read_text()
    assert server.count("\n") == log.read_text().count("\n")  # line for line
    env_txt = (d / "env.txt").read_text()
    assert f"HF_TOKEN={MASK}" in env_txt and "VLLM_CPU_KVCACHE_SPACE=1" in env_txt
    assert f"--api-key {MASK}" in env_txt
    data = json.loads((d / "report.json").read_text())
    assert data["diagnoses"][0]["category"] == "tp-divisibility"
    server_lines = server.split("\n")
    for e in data["diagnoses"][0]["evidence"]:
        assert server_lines[e["line"] - 1].strip()[:80] == e["text"][:80]
    assert MASK in json.dumps(data["serve"]["command"])
    md = (d / "report.md").read_text().split("\n")
    at = md.index("```sh", md.index("**Command**"))  # the command line in a fenced block, whole, its fence closed
    assert md[at + 1].endswith(f"--api-key {MASK}") and md[at + 2] == "```"
    assert "<details>" not in "\n".join(md)  # plain Markdown: Jira and GitLab render it too

    p = run("--report-dir", "raw", "--no-redact")
    (raw,) = (tmp_path / "raw").iterdir()
    assert SK in (raw / "server.log").read_text()
    assert HF in (raw / "env.txt").read_text()


def test_prose_with_secret_looking_words_is_left_alone():
    from vllm_doctor.render.redact import redact

    for text in ("KV bytes per token = 131,072", "the key = the model's name", "max_num_batched_tokens: 8192"):
        assert redact(text) == text


def test_every_format_a_person_reads_is_redacted(tmp_path):
    """Text (default and -v), markdown (plain and github) and JSON: none of the seeded secrets,
    which sit in the evidence line itself; --no-redact keeps them all."""
    url = "https://ops:Pa55-in-the-url@mirror.internal/models"
    basic = "dXNlcjpodW50ZXIyLWJhc2lj"
    seeded = [HF, SK, "Pa55-in-the-url", basic, PASSWORD]
    lines = (LAB / "cache-oom.log").read_text().split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("ValueError: To serve at least one request"))
    lines[at] = (
        f"ValueError: token {HF} from {url} (Authorization: Basic {basic}) --api-key {PASSWORD} key {SK}: "
        + lines[at][len("ValueError: ") :]
    )
    log = tmp_path / "seeded-cache-oom.log"
    log.write_text("\n".join(lines))
    runner = CliRunner()
    env = {"NO_COLOR": "1", "COLUMNS": "400"}
    runs = [[], ["-v"], ["-f", "markdown"], ["-f", "markdown", "--flavor", "github"], ["-f", "json"]]
    for extra in runs:
        out = runner.invoke(app, ["explain", str(log), "--no-gpu", *extra], env=env).output
        assert "cache-oom" in out and MASK in out, extra
        for s in seeded:
            assert s not in out, (extra, s)
    kept = runner.invoke(app, ["explain", str(log), "--no-gpu", "-v", "--no-redact"], env=env).output
    assert all(s in kept for s in seeded)


def test_a_masked_value_keeps_the_backtick_that_closes_its_code_span():
    assert Redactor().text("run `vllm serve /m --api-key abc` again") == f"run `vllm serve /m --api-key {MASK}` again"


# --------------------------------------------------------------------------------------------
# issue 25, class 3: what hid a secret from the forms, and the forms that were missing
# --------------------------------------------------------------------------------------------
HIDERS = {
    "charset ESC(B": "\x1b(B",
    "colon SGR 256": "\x1b[38:5:196m",
    "colon SGR rgb": "\x1b[38:2::255:0:0m",
    "8-bit CSI": "\x9b31m",
    "ZWSP": "\u200b",
    "ZWNJ": "\u200c",
    "ZWJ": "\u200d",
    "word joiner": "\u2060",
    "BOM": "\ufeff",
}


@pytest.mark.parametrize("hider", HIDERS.values(), ids=HIDERS.keys())
@pytest.mark.parametrize("cut", [1, 2, 10])
def test_a_token_split_by_an_escape_or_an_invisible_character(hider, cut):
    line = f"INFO token {HF[:cut]}{hider}{HF[cut:]} loaded"
    for out in (redact(line), Redactor([ENV_SECRET]).line(line)):
        assert HF[cut:] not in out and MASK in out and out.endswith(" loaded"), out
    # in a copied log too (a lone 0x9b byte, not UTF-8, is an 8-bit CSI as well)
    raw = line.encode("utf-8").replace("\x9b".encode(), b"\x9b") + b"\n"
    assert HF[cut:].encode() not in Redactor().bytes_line(raw)
    assert Redactor().bytes_line(raw).endswith(b" loaded\n")


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ("GET /v1/x?Authorization=Bearer%20eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.sig HTTP/1.1", "eyJhbGciOiJIUzI1NiJ9"),
        ("headers: Authorization%3A%20Basic%20dXNlcjpodW50ZXIy", "dXNlcjpodW50ZXIy"),
        ('{"msg": "request {\\"model\\": \\"m\\", \\"password\\": \\"hunter2-inner\\"}"}', "hunter2-inner"),
        ('{"msg": "{\\"api_key\\": \\"sk-inner-json-value\\"}"}', "sk-inner-json-value"),
        ("PGPASSWORD=pg-secret-value psql -h db", "pg-secret-value"),
        ("env: MYSQL_PWD=my-secret-value mysql -u root", "my-secret-value"),
        ("export VLLM_DB_PASS=db-pass-value-0", "db-pass-value-0"),
        ("remote: ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789 rejected", "ghp_AbCdEfGhIjKlMnOp"),
        ("gho_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "gho_AbCdEfGhIjKlMnOp"),
        ("token ghs_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789.", "ghs_AbCdEfGhIjKlMnOp"),
        ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789", "github_pat_11ABCDEFG"),
        ("hf_token: hf-yaml-unquoted-value", "hf-yaml-unquoted-value"),
        ("  api_token: yaml-api-token-value", "yaml-api-token-value"),
        ("non-default args: {'api_key': b'bytes-secret-value-1', 'port': 8000}", "bytes-secret-value-1"),
        ('Namespace(api_key=b"bytes-secret-value-2", port=8000)', "bytes-secret-value-2"),
        ("GET https://bucket.s3/x?X-Amz-Credential=AKID&X-Amz-Signature=9f8e7d6c5b4a3f2e", "9f8e7d6c5b4a3f2e"),
        ("loading with token hf_AbCdEfGhIj", "hf_AbCdEfGhIj"),  # the first piece of a wrapped token
    ],
)
def test_issue_25_forms(line, secret):
    out = redact(line)
    assert secret not in out and MASK in out, out
    assert out.count("\n") == 0


@pytest.mark.parametrize(
    "line",
    [
        "INFO 12-03 non-default args: {'hf_overrides': {}, 'tokenizer': 'hf_config'}",
        "special tokens: eos_token: </s>, bos_token: <s>",
        "VLLM_MAX_TOKENS_PER_EXPERT=64 OLDPWD=/home/u PWD=/srv",
        "loading hf_overrides",
        "Avg prompt throughput: 657.3 tokens/s, Avg generation throughput: 12.0 tokens/s",
    ],
)
def test_issue_25_ordinary_lines_stay(line):
    assert redact(line) == line


def test_a_token_cut_by_a_terminal_wrap():
    """A hard-wrap at the terminal's width cuts a token: both pieces masked, in a copied log,
    in text and in evidence rows (the lines next to each other); a short line ends itself."""
    head = "(APIServer pid=1) INFO 12-03 10:00:00 [hub.py:12] fetching with "
    for cut in (4, 12, 30):
        text = f"{head}{HF[:cut]}\n{HF[cut:]} (continued)\nnext line"
        out = redact(text)
        assert out == f"{head}{MASK}\n{MASK} (continued)\nnext line", cut
        copied = io.BytesIO()
        Redactor().copy(io.BytesIO(text.encode()), copied)
        assert copied.getvalue().decode() == out
        rows = [{"line": 7, "text": f"{head}{HF[:cut]}"}, {"line": 8, "text": f"{HF[cut:]} (continued)"}]
        masked = Redactor().obj({"evidence": rows})["evidence"]
        assert [r["text"] for r in masked] == [f"{head}{MASK}", f"{MASK} (continued)"]
        assert [r["line"] for r in masked] == [7, 8]
    # a whole token ending a line: the next line is its own
    assert redact(f"{head}{HF}\nnext line") == f"{head}{MASK}\nnext line"
    assert redact(f"--api-key {SK}\nplain") == f"--api-key {MASK}\nplain"


def test_a_wrapped_token_in_a_report_evidence():
    from vllm_doctor.data import Diagnosis, Evidence, Report
    from vllm_doctor.render.redact import report as masked

    head = "OSError: 401 Client Error for url https://huggingface.co/api/models/org/m with token "
    d = Diagnosis(rule="r", category="c", severity="blocker", confidence="high", title="t", summary="s",
                  explanation="", evidence=[Evidence(3, head + HF[:20]), Evidence(4, HF[20:] + " rest")],
                  numbers={}, fixes=[])  # fmt: skip
    out = masked(Report(paths=["x"], lines=4, status="failed", diagnoses=[d], facts={}))
    assert [e.text for e in out.diagnoses[0].evidence] == [head + MASK, f"{MASK} rest"]


def test_variables_that_hide_a_secret_by_name_or_by_value():
    for name in ("VLLM_DB_PASS", "HF_HUB_AUTH", "HF_TOKEN_B64", "MYSQL_PWD", "PGPASSWORD", "X_CREDENTIALS_JSON",
                 "MY_TOKEN_FILE", "VLLM_SECRET_X", "A_PASSWORD_B", "hf_token"):  # fmt: skip
        assert is_secret_name(name), name
    for name in ("VLLM_PORT", "HF_HOME", "VLLM_MAX_TOKENS", "TOKENIZERS_PARALLELISM", "CUDA_VISIBLE_DEVICES"):
        assert not is_secret_name(name), name
    from vllm_doctor.render.redact import is_secret

    assert is_secret("VLLM_ANYTHING", HF) and is_secret("VLLM_MIRROR", "https://u:pa55word@mirror/x")
    assert not is_secret("VLLM_PORT", "8000")
    env = {"VLLM_DB_PASS": "db-pass-value-0", "VLLM_EXTRA": SK, "HF_HUB_AUTH": "enabled", "VLLM_PORT": "8000"}
    assert set(secret_values(env)) == {"db-pass-value-0", SK}  # "enabled" would mask ordinary words


def test_a_copied_log_is_masked_as_each_line_is_among_long_runs_of_plain_lines():
    """The copy passes runs of lines that hold nothing to mask as they are, a block at a time:
    whatever sits among them (a token, one cut by a wrap, a known value split over two lines,
    one hidden by an escape, a non-ASCII line), wherever the blocks end, it masks what masking
    each line against its neighbours masks, and counts the lines."""
    known = "SECRETVALUE123"
    odd = [
        f"fetching with {HF}",
        "(APIServer pid=1) INFO 12-03 10:00:00 [hub.py:12] fetching with the token " + HF[:12],
        HF[12:] + " (continued)",
        f"value {known[:8]}",
        f"{known[8:]} went on",
        f"Authorization: Bearer {SK}",
        f"hf_\x1b[0m{HF[3:]}",
        f"café {HF}",
        "Avg prompt throughput: 657.3 tokens/s, Avg generation throughput: 12.0 tokens/s",
    ]
    lines = []
    for n in range(30_000):
        lines.append(odd[n // 997 % len(odd)] if n % 997 == 0 or n % 997 == 1 else f"INFO 127.0.0.1:{n} - GET /v1 200")
    text = "\n".join(lines) + "\n"
    red = Redactor([known])
    copied = io.BytesIO()
    assert red.copy(io.BytesIO(text.encode()), copied) == len(lines)
    assert copied.getvalue().decode() == red.text(text)
    assert MASK in copied.getvalue().decode()


def test_stats_lines_are_copied_as_they_are():
    """A stats line's "tokens/s" starts no form (each form's name ends at "token", then a quote,
    "=", ":" or a space): a block of them has no line to mask one by one, and one that does
    hold a token is still masked."""
    from vllm_doctor.render.logcopy import slow

    stats = (
        "(APIServer pid=1) INFO 12-03 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 657.3 tokens/s,"
        " Avg generation throughput: 12.0 tokens/s, Running: 7 reqs, Waiting: 0 reqs, max_num_batched_tokens=8192\n"
    )
    red = Redactor([])
    assert slow(red, b"", (stats * 50).encode()) == []
    token = "the token=abcdefgh1234\n"
    block = stats * 3 + token + stats
    assert slow(red, b"", block.encode()) == [3 * len(stats), 3 * len(stats) + len(token)]  # it, and the next
    assert red.text(block) == block.replace("abcdefgh1234", MASK)


def test_request_log_lines_are_copied_as_they_are():
    """A request log line's "prompt_token_ids" and "max_tokens" start no form (a name that goes on
    past "token" ends at another quick word): a serving log's request lines go out a block at a
    time (issue 37: 1 GiB of them took minutes), and `token_key=`, `token_secret:` still mask."""
    from vllm_doctor.render.logcopy import slow

    head = (
        "(APIServer pid=1) INFO 12-03 10:00:00 [logger.py:43] Received request chatcmpl-1: prompt: 'hi', params:"
        " SamplingParams(n=1, max_tokens=512), prompt_token_ids: None, lora_request: None.\n"
    )
    red = Redactor([])
    assert slow(red, b"", (head * 50).encode()) == []
    for line in ("auth token_key=abcdefgh1234\n", "the session_token: abcdefgh1234\n", "TOKEN-SECRET=abcdefgh1234\n"):
        block = head * 2 + line + head
        assert 2 * len(head) in slow(red, b"", block.encode()), line
        assert red.text(block) == block.replace("abcdefgh1234", MASK), line
