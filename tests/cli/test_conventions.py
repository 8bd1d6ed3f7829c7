"""The conventions an SRE expects of a command line (issue 11): --version, completion, -o as
kubectl reads it, --color, defaults from variables and a config file, help with plain metavars
and the exit codes, a closed pipe, stdin that stays open, --follow, rules show's suggestions and
a bad --rules file. Process-level behaviour runs the real command in a subprocess."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import LAB, ROOT, SAMPLE_RULE, conforms
from vllm_doctor import __version__
from vllm_doctor.cli import app, settings
from vllm_doctor.cli.output import resolve
from vllm_doctor.read.source import STDIN_HINT

OOM = LAB / "cache-oom.log"
runner = CliRunner()


def env(**extra) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_DOCTOR_", "FORCE_COLOR", "NO_COLOR"))}
    out.update({"PYTHONPATH": str(ROOT / "src"), "VLLM_DOCTOR_CONFIG": "", **extra})
    return out


def doctor(*args, cwd=None, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("env", env())
    return subprocess.run(
        [sys.executable, "-m", "vllm_doctor", *map(str, args)], capture_output=True, cwd=cwd, timeout=60, **kwargs
    )


def start(*args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "vllm_doctor", *map(str, args)],
        env=env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,
    )


def test_version():
    p = doctor("--version")
    assert p.returncode == 0 and p.stdout.decode().strip() == f"vllm-doctor {__version__}"


def test_completion_is_enabled():
    # the shell named, not detected from the process tree (a test run reparented to init has no shell above it)
    script = doctor("--show-completion", "bash", env=env(_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1"))
    assert script.returncode == 0 and b"_VLLM_DOCTOR_COMPLETE" in script.stdout
    words = doctor(
        env=env(_VLLM_DOCTOR_COMPLETE="complete_bash", COMP_WORDS="vllm-doctor explain --fo", COMP_CWORD="2")
    )
    assert set(words.stdout.decode().split()) == {"--format", "--follow"}


# -o as kubectl reads it, the suffix, and --format winning
@pytest.mark.parametrize(
    ("fmt", "output", "want"),
    [
        (None, "json", ("json", None)),
        (None, "MD", ("markdown", None)),
        (None, "r.json", ("json", Path("r.json"))),
        (None, "r.md", ("markdown", Path("r.md"))),
        (None, "r.log", ("text", Path("r.log"))),
        ("markdown", "r.json", ("markdown", Path("r.json"))),
        ("json", "json", ("json", None)),
        (None, "./json", ("text", Path("json"))),
    ],
)
def test_output_target(fmt, output, want):
    assert resolve(fmt, output) == want


def test_o_json_prints_json_and_writes_no_file(tmp_path):
    p = doctor("explain", OOM, "--no-gpu", "-o", "json", cwd=tmp_path)
    assert p.returncode == 1 and conforms(p.stdout)["status"] == "failed"
    assert list(tmp_path.iterdir()) == []
    clash = doctor("explain", OOM, "--no-gpu", "-o", "json", "--format", "markdown", cwd=tmp_path)
    assert clash.returncode == 2 and b"-o json names the format json" in clash.stderr


def test_o_path_infers_the_format_and_format_wins(tmp_path):
    assert doctor("explain", OOM, "--no-gpu", "-o", tmp_path / "r.json").returncode == 1
    conforms((tmp_path / "r.json").read_text())
    assert doctor("explain", OOM, "--no-gpu", "-o", tmp_path / "r.md").returncode == 1
    assert (tmp_path / "r.md").read_text().startswith("## vllm-doctor: failed: cache-oom")
    assert doctor("explain", OOM, "--no-gpu", "-o", tmp_path / "x.json", "-f", "markdown").returncode == 1
    assert (tmp_path / "x.json").read_text().startswith("## vllm-doctor")
    assert doctor("plan", "--params", "7B", "--layers", "32", "--kv-heads", "8", "--head-dim", "128",
                  "--gpu-memory", "80GB", "--no-gpu", "-o", tmp_path / "p.json").returncode == 0  # fmt: skip
    conforms((tmp_path / "p.json").read_text(), "plan-1")


@pytest.mark.parametrize(("flag", "variables", "coloured"), [
    ("always", {"NO_COLOR": "1"}, True), ("never", {"FORCE_COLOR": "1"}, False), ("auto", {}, False),
    ("auto", {"FORCE_COLOR": "1"}, True),
])  # fmt: skip
def test_color(flag, variables, coloured):
    p = doctor("explain", OOM, "--no-gpu", "--color", flag, env=env(**variables))
    assert (b"\x1b[" in p.stdout) is coloured and p.returncode == 1


def test_plan_q_is_not_quantization():
    base = ["plan", "--params", "7B", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--gpu-memory", "80GB"]
    assert runner.invoke(app, [*base, "--no-gpu", "--quantization", "awq"]).exit_code == 0
    result = runner.invoke(app, [*base, "--no-gpu", "-q", "awq"])
    assert result.exit_code == 2 and "No such option: -q" in result.output


# defaults: flag > VLLM_DOCTOR_* > config file > built-in
def test_settings_precedence(tmp_path):
    (tmp_path / "vllm-doctor.toml").write_text('format = "markdown"\nfail-on = "warning"\nrules = ["mine"]\n')
    assert settings.load({}, tmp_path) == {
        "format": "markdown",
        "fail-on": "warning",
        "rules": [str(tmp_path / "mine")],
    }
    assert settings.load({"VLLM_DOCTOR_FORMAT": "json"}, tmp_path)["format"] == "markdown"  # click reads variables
    xdg = tmp_path / "xdg"
    (xdg / "vllm-doctor").mkdir(parents=True)
    (xdg / "vllm-doctor" / "config.toml").write_text('[tool.vllm-doctor]\ncolor = "never"\ntarget-len = 4096\n')
    assert settings.load({"XDG_CONFIG_HOME": str(xdg)}, xdg) == {"color": "never", "target-len": 4096}
    assert settings.load({"XDG_CONFIG_HOME": str(xdg)}, tmp_path)["format"] == "markdown"  # the cwd's file first


def test_each_setting_is_its_options_envvar_and_every_format_a_setting_too(tmp_path):
    import typer.main

    from vllm_doctor.render import FORMATS

    command = typer.main.get_command(app)
    for name, keys in settings.COMMANDS.items():
        params = {p.name: p for p in command.commands[name].params}  # type: ignore[attr-defined]
        for key in keys:
            assert params[settings.PARAM.get(key, key).replace("-", "_")].envvar == settings.KEYS[key][0], (name, key)
    for fmt in FORMATS:  # html was a --format but not a VLLM_DOCTOR_FORMAT
        got = runner.invoke(
            app, ["explain", str(OOM), "--no-gpu"], env={"VLLM_DOCTOR_FORMAT": fmt, "VLLM_DOCTOR_CONFIG": ""}
        )
        assert got.exit_code == 1 and got.output.strip(), fmt
    a, b = tmp_path / "a", tmp_path / "b"  # --rules from the variable: directories split at os.pathsep
    for d in (a, b):
        d.mkdir()
    (b / "my-rule.toml").write_text(SAMPLE_RULE)
    got = runner.invoke(app, ["rules"], env={"VLLM_DOCTOR_RULES": f"{a}{os.pathsep}{b}", "VLLM_DOCTOR_CONFIG": ""})
    assert got.exit_code == 0 and "my-rule" in got.output


@pytest.mark.parametrize(("variables", "text", "message"), [
    ({"VLLM_DOCTOR_FORMAT": "xml"}, None, "(env var: 'VLLM_DOCTOR_FORMAT'): 'xml' is not one of 'text', 'markdown', 'json', 'html'"),
    ({"VLLM_DOCTOR_TARGET_LEN": "0"}, None, "(env var: 'VLLM_DOCTOR_TARGET_LEN'): 0 is not in the range x>=1"),
    ({}, 'colour = "never"\n', "unknown key 'colour'"),
    ({}, "format = \n", "not valid TOML"),
])  # fmt: skip
def test_a_bad_setting_is_one_line_and_exit_2(tmp_path, variables, text, message):
    if text is not None:
        (tmp_path / "vllm-doctor.toml").write_text(text)
    variables = {**variables, "VLLM_DOCTOR_CONFIG": str(tmp_path / "vllm-doctor.toml") if text else ""}
    p = doctor("explain", OOM, cwd=tmp_path, env=env(**variables))
    [line] = p.stderr.decode().splitlines()
    assert p.returncode == 2 and message in line and line.startswith("vllm-doctor: ")


def test_settings_reach_the_commands_and_a_flag_wins(tmp_path):
    (tmp_path / "vllm-doctor.toml").write_text('format = "json"\nfail-on = "warning"\n')
    variables = env(VLLM_DOCTOR_CONFIG=str(tmp_path / "vllm-doctor.toml"))
    queue = LAB / "queue-saturation.log"  # a warning
    p = doctor("explain", queue, "--no-gpu", env=variables)
    assert p.returncode == 1 and conforms(p.stdout)["status"] == "degraded"
    p = doctor("explain", queue, "--no-gpu", "--fail-on", "blocker", "-f", "text", env=variables)
    assert p.returncode == 0 and p.stdout.startswith(b"vllm-doctor: degraded")
    p = doctor(
        "explain", queue, "--no-gpu", "-o", tmp_path / "r.md", env=variables
    )  # the suffix over the file's format
    assert (tmp_path / "r.md").read_text().startswith("## vllm-doctor: degraded")
    p = doctor("explain", queue, "--no-gpu", env={**variables, "VLLM_DOCTOR_FORMAT": "markdown"})
    assert p.stdout.startswith(b"## vllm-doctor: degraded")  # the variable over the file


def test_help_has_plain_metavars_and_the_exit_codes():
    top = runner.invoke(app, ["--help"]).output
    assert "Exit status: 0 no blocker, 1 a blocker" in top and "4 unknown" in top
    for command in (["explain"], ["watch"], ["plan"], ["check"], ["serve"], ["rules", "show"], ["rules", "check"]):
        text = runner.invoke(app, [*command, "--help"]).output
        assert not re.search(r"\{[A-Z_]+\}", text) and "range>" not in text and "<str>" not in text, (command, text)
    assert " explain [OPTIONS] [LOG]...\n" in runner.invoke(app, ["explain", "--help"]).output
    assert " serve [OPTIONS] -- MODEL [ARG]...\n" in runner.invoke(app, ["serve", "--help"]).output


# a closed stdout: the diagnosis's status (or SIGPIPE's 141), never 1 from a BrokenPipeError, no traceback
@pytest.mark.parametrize(("args", "status"), [
    (["explain", OOM, "--no-gpu"], 1), (["explain", OOM, "--no-gpu", "-f", "json"], 1),
    (["explain", LAB / "healthy.log", "--no-gpu", "-f", "markdown"], 0), (["rules"], 141), (["--help"], 141),
])  # fmt: skip
def test_a_closed_pipe_keeps_the_status(args, status):
    p = start(*args)
    p.stdout.close()  # the reader is gone before the first byte, as after `| head -1` has its line
    p.stdin.close()
    err = p.stderr.read()
    assert p.wait(timeout=60) == status and err == b"", err.decode()


def test_head_in_a_shell_pipeline():
    script = f'"{sys.executable}" -m vllm_doctor explain "{OOM}" --no-gpu -f json | head -1; echo "status ${{PIPESTATUS[0]}}"'
    p = subprocess.run(["bash", "-c", script], capture_output=True, env=env(), timeout=60)
    assert p.stdout.decode().splitlines() == ["{", "status 1"] and p.stderr == b""


# stdin that stays open
def test_a_quiet_pipe_gets_the_hint_once(tmp_path):
    p = start("explain", "-", "--no-gpu", "-f", "json")
    time.sleep(2.5)  # no data: past the quiet time
    out, err = p.communicate(OOM.read_bytes(), timeout=60)
    assert p.returncode == 1 and conforms(out)["status"] == "failed"
    assert err.decode().splitlines() == [STDIN_HINT]


def test_no_hint_when_data_comes_or_stdin_is_a_file():
    p = doctor("explain", "-", "--no-gpu", "-f", "json", input=OOM.read_bytes())
    assert p.returncode == 1 and p.stderr == b""
    with OOM.open("rb") as f:
        p = doctor("explain", "-", "--no-gpu", "-f", "json", stdin=f)
    assert p.returncode == 1 and p.stderr == b""


def _line_within(stream, seconds: float) -> bytes:
    """The next line of a pipe, or b"" when none comes in time."""
    end, got = time.monotonic() + seconds, b""
    while not got.endswith(b"\n") and time.monotonic() < end:
        if select.select([stream], [], [], max(0.0, end - time.monotonic()))[0]:
            byte = os.read(stream.fileno(), 1)
            if not byte:
                break
            got += byte
    return got


def test_follow_says_a_diagnosis_while_the_stream_is_open():
    lines = OOM.read_bytes().splitlines(keepends=True)
    cut = next(i for i, ln in enumerate(lines) if b"ValueError: To serve" in ln) + 1
    p = start("explain", "-", "--follow", "--no-gpu")
    for line in lines[:cut]:  # slowly, the way a server writes
        p.stdin.write(line)
        p.stdin.flush()
        time.sleep(0.005)
    said = _line_within(p.stdout, 20)  # stdin still open: the line comes before the end
    assert (
        said.startswith(b"vllm-doctor: line ")
        and b"blocker cache-oom" in said
        and b"Fix: Lower --max-model-len" in said
    )
    p.stdin.write(b"".join(lines[cut:]))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1 and out.startswith(b"vllm-doctor: failed: cache-oom")
    assert out.count(b"blocker cache-oom:") == 0  # said once, then the report


APPEND = """
import sys, time
with open(sys.argv[1], "ab") as out:
    for line in sys.stdin.buffer:  # slowly, the way a server writes its log
        out.write(line)
        out.flush()
        time.sleep(0.005)
"""


def _append(log: Path, data: bytes) -> None:
    """Another process appends `data` to `log` and is gone: the writer's end is not the log's end."""
    subprocess.run([sys.executable, "-c", APPEND, str(log)], input=data, check=True, timeout=60)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_follow_reads_a_file_as_tail_f_until_interrupted(tmp_path, sig):
    """`explain --follow server.log` while the server writes it: the diagnosis line comes while the
    file grows, the end of the file (and of its writer) ends nothing, and Ctrl-C or SIGTERM
    prints the report of everything appended, the part after the diagnosis too."""
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    lines = OOM.read_bytes().splitlines(keepends=True)
    cut = next(i for i, ln in enumerate(lines) if b"ValueError: To serve" in ln) + 1
    p = start("explain", "--follow", log, "--no-gpu")
    _append(log, b"".join(lines[:cut]))
    said = _line_within(p.stdout, 20)
    assert said.startswith(b"vllm-doctor: line ") and b"blocker cache-oom" in said, said
    time.sleep(1)
    assert p.poll() is None  # at the file's end, its writer gone: still following
    _append(log, b"".join(lines[cut:]))  # the rest, written whole before the signal
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    assert out.startswith(b"vllm-doctor: failed: cache-oom"), out  # the report, after the line said
    said = b" ".join(out.split())  # the input line wraps at the terminal's width when the path is long
    assert b"%s (%d lines)" % (bytes(log), OOM.read_bytes().count(b"\n")) in said  # all of it, the rest too
    assert b"Traceback" not in err


def test_follow_needs_one_stream():
    result = runner.invoke(app, ["explain", str(OOM), str(OOM), "--follow"])
    assert result.exit_code == 2 and "--follow reads one stream" in result.output


# rules show
def test_rules_show_suggests_close_ids_and_lists_a_category():
    near = runner.invoke(app, ["rules", "show", "kv-cache-too-smal"])
    assert near.exit_code == 2 and "did you mean kv-cache-too-small-for-max-len" in near.output
    category = runner.invoke(app, ["rules", "show", "cache-oom"])
    assert category.exit_code == 0 and "kv-cache-too-small-for-max-len" in category.output
    assert category.output.startswith("cache-oom: ")
    assert "did you mean cache-oom" in runner.invoke(app, ["rules", "show", "cach-oom"]).output


# a bad --rules file
def test_a_bad_rule_file_is_one_warning_and_the_built_in_rules_still_run(tmp_path):
    d = tmp_path / "rules"
    d.mkdir()
    (d / "my-rule.toml").write_text(SAMPLE_RULE)
    (d / "broken.toml").write_text(
        SAMPLE_RULE.replace('id = "my-rule"', 'id = "broken"').replace('severity = "warning"', 'severity = "bad"')
    )
    log = tmp_path / "x.log"
    log.write_bytes(OOM.read_bytes() + b"it happened 3\n")
    p = doctor("explain", log, "--rules", d, "--no-gpu", "-f", "json")
    line, named = p.stderr.decode().splitlines()  # the bad file, then the directory that added a rule
    assert line.startswith(f"vllm-doctor: {d / 'broken.toml'}: key 'severity'") and "--strict-rules" in line
    assert named == f"vllm-doctor: rules from {d} (1 rule)"
    rules = {x["rule"] for x in conforms(p.stdout)["diagnoses"]}
    assert p.returncode == 1 and {"kv-cache-too-small-for-max-len", "my-rule"} <= rules
    strict = doctor("explain", log, "--rules", d, "--no-gpu", "--strict-rules")
    assert strict.returncode == 2 and strict.stdout == b"" and len(strict.stderr.splitlines()) == 1


def test_a_terminal_gets_the_hint_at_once_and_ctrl_d_ends_it():
    import pty

    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "vllm_doctor", "explain", "-", "--no-gpu", "-f", "json"],
                             env=env(), stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        assert _line_within(p.stderr, 20).decode().rstrip("\n") == STDIN_HINT  # no quiet time for a terminal
        os.write(master, b"\x04")  # Ctrl-D: the end of the input
        out, err = p.communicate(timeout=60)
    finally:
        os.close(master)
        os.close(slave)
    assert p.returncode == 4 and conforms(out)["input"]["empty"] is True and err == b""
