"""Input that cannot break it: whatever arrives (random bytes, invalid UTF-8, NULs, a 10 MB
line, truncated gzip, a directory, an empty file, a FIFO, a file that vanishes mid-read, mixed
CR/LF), `explain` gives a report, or exits 2 with one clear line; never a traceback.

The seeded case generator here is also what `bench/fuzz.py` runs 10,000 times.
And rule files are data: one passed with --rules cannot run code or read files.
"""

from __future__ import annotations

import builtins
import contextlib
import gzip
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import shapes
from typer.testing import CliRunner

from conftest import ROOT, SAMPLE_RULE

LOGS = sorted((ROOT / "fixtures").rglob("*.log"))
ANCHOR_TEXT = [
    "CUDA out of memory. Tried to allocate 2.00 GiB",
    "Running: 3 reqs, Waiting: 7 reqs, GPU KV cache usage: 99.1%",
    "EngineDeadError",
    "KV cache size: 1,024 tokens",
    "Maximum concurrency for 4,096 tokens per request: 0.25x",
    "non-default args: {'model': 'x', 'max_model_len': 8192",
    "is not divisible by tensor parallel size",
    "version 0.32.0",
    "Loading model weights took 14.99 GiB",
    "Total number of attention heads (28) must be divisible by tensor parallel size (8).",
]


@dataclass
class Case:
    """One hostile input: the explain arguments, stdin bytes, and work to do around the run."""

    name: str
    args: list[str]
    stdin: bytes | None = None
    during: Callable[[], None] | None = None  # runs in a thread while explain reads
    cleanup: list[Callable[[], None]] = field(default_factory=list)
    blocker: bool = False  # an attack shape (shapes.py) that hides a blocker: the report must find it


def _real_log(rng: random.Random) -> bytes:
    return rng.choice(LOGS).read_bytes() if LOGS else b"INFO hello\n"


def _mutate(data: bytes, rng: random.Random) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 20)):
        if not data:
            break
        k = rng.random()
        at = rng.randrange(len(data))
        if k < 0.3:
            data[at] = rng.randrange(256)  # flip a byte (invalid UTF-8, a NUL, a stray CR)
        elif k < 0.5:
            del data[at : at + rng.randint(1, 400)]  # lose a piece
        elif k < 0.7:
            data[at:at] = data[at : at + rng.randint(1, 2000)]  # duplicate a piece
        elif k < 0.85:
            data[at:at] = rng.choice(ANCHOR_TEXT).encode()  # an anchor somewhere odd
        else:
            data[at:at] = bytes(rng.choice((0, 13, 10, 0xFF, 0xC3, 0x1B)) for _ in range(rng.randint(1, 50)))
    return bytes(data)


def _line_endings(data: bytes, rng: random.Random) -> bytes:
    out = []
    for line in data.split(b"\n"):
        out.append(line + rng.choice((b"\n", b"\r\n", b"\r", b"\n\r", b"\r\r\n")))
    return b"".join(out)


_EXAMPLES: list[str] = []
_NUMBER = re.compile(r"\d[\d,.]*")
_ODD_NUMBERS = ("0", "-1", "00", "99999999999999999999", "1" * 5000, "1e999", "nan", "0.0", "1,0,0", "4.2.1", "")


def _mangled_examples(rng: random.Random) -> bytes:
    """Real lines the rules match (their examples), with the numbers in them made absurd."""
    if not _EXAMPLES:
        from vllm_doctor.knowledge.checks import CHECKS
        from vllm_doctor.matching.loader import load

        _EXAMPLES.extend(p.example for r in load(checks=CHECKS) for p in r.patterns if p.example)
    lines = []
    for _ in range(rng.randint(1, 12)):
        line = rng.choice(_EXAMPLES)
        lines.append(_NUMBER.sub(lambda m: rng.choice(_ODD_NUMBERS) if rng.random() < 0.7 else m.group(), line))
    return "\n".join(lines).encode()


_ODD_NAMES = (
    "m" * 5000,
    "~nosuchuser/model",
    "a\x00b",
    "../../../../etc/passwd",
    "/dev/zero",
    "/proc/self",
    "-rf",
    "{model}",
    "%s%n",
    "org/" + "x" * 300,
    "",
    ".",
    "org//model",
    "https://example.invalid/x",
)


def _odd_model_names(rng: random.Random) -> bytes:
    """The lines a log names its model in, naming something that is no model."""
    name = rng.choice(_ODD_NAMES)
    lines = [
        f"(APIServer pid=1) INFO 11-30 01:48:17 [api_utils.py:286] non-default args: {{'model_tag': {name!r}, 'model': {name!r}}}",
        f"(APIServer pid=1) INFO 11-30 01:48:17 [api_utils.py:347]   █▄█▀ █     █     █     █  model   {name}",
        f"INFO 05-01 10:00:00 api_server.py:1] args: Namespace(model={name!r}, max_model_len=4096)",
        f"vllm serve {name} --max-model-len 4096",
    ]
    return "\n".join(rng.sample(lines, rng.randint(1, len(lines)))).encode("utf-8", "surrogatepass")


def _random_bytes(rng: random.Random, size: int) -> bytes:
    return rng.getrandbits(8 * size).to_bytes(size, "little") if size else b""


def _long_line(rng: random.Random, size: int) -> bytes:
    piece = rng.choice((b"x", b"\xff", b" ", b"1/2 [", b"%|", b"(", b"\x00", b"a,"))
    line = bytearray(piece * (size // len(piece)))
    for _ in range(rng.randint(0, 5)):
        at = rng.randrange(len(line) or 1)
        line[at:at] = rng.choice(ANCHOR_TEXT).encode()
    return bytes(line)


def make_case(rng: random.Random, tmp: Path, index: int, heavy: bool = False) -> Case:
    """A random hostile input under tmp. `heavy` allows the 10 MB single line and other big ones."""
    path = tmp / f"case{index}.log"
    fmt = rng.choice(("json", "text", "markdown"))
    tail = ["--format", fmt]
    kinds = [
        "random-bytes", "mutated-log", "invalid-utf8", "nuls", "line-endings", "truncated-gzip",
        "damaged-gzip", "gzip-magic-garbage", "long-line", "empty", "directory", "missing",
        "fifo", "vanishing", "stdin", "stdin-gzip", "several", "symlink-loop", "dev-null", "binary-then-log",
        "mangled-examples", "mangled-examples-in-log", "odd-model-names", "real-log-cr-only", "real-log-nul-holes",
    ]  # fmt: skip
    kinds += ["attack-shape"] * 5  # issue 10's shapes (shapes.py), each hiding a blocker
    if heavy:
        kinds += ["ten-mb-line"]
    kind = rng.choice(kinds)
    log = _real_log(rng)
    if kind == "attack-shape":
        name, data, suffix = shapes.random_shape(rng, heavy)
        path = path.with_suffix(suffix)
        path.write_bytes(data)
        return Case(name, ["explain", str(path), *tail], blocker=True)
    if kind == "real-log-cr-only":
        path.write_bytes(log.replace(b"\r\n", b"\n").replace(b"\n", b"\r"))
    elif kind == "real-log-nul-holes":
        lines = log.split(b"\n")
        for _ in range(rng.randint(1, 8)):  # a hole where a line starts, or inside one
            at = rng.randrange(len(lines))
            lines[at] = b"\0" * rng.choice((16, 500, 70_000)) + lines[at]
        path.write_bytes(b"\n".join(lines))
    elif kind == "random-bytes":
        path.write_bytes(_random_bytes(rng, rng.choice((1, 10, 1000, 70000))))
    elif kind == "mutated-log":
        path.write_bytes(_mutate(log, rng))
    elif kind == "invalid-utf8":
        path.write_bytes(log.replace(b"e", bytes([rng.choice((0x80, 0xC3, 0xE2, 0xF0, 0xFF))]), rng.randint(1, 200)))
    elif kind == "nuls":
        data = bytearray(log)
        for _ in range(rng.randint(1, 2000)):
            data[rng.randrange(len(data) or 1) : 0] = b"\x00"
        path.write_bytes(bytes(data))
    elif kind == "line-endings":
        path.write_bytes(_line_endings(log, rng))
    elif kind == "truncated-gzip":
        blob = gzip.compress(log)
        path = path.with_suffix(".log.gz")
        path.write_bytes(blob[: rng.randrange(len(blob))])
    elif kind == "damaged-gzip":
        blob = bytearray(gzip.compress(_mutate(log, rng)))
        for _ in range(rng.randint(1, 5)):
            blob[rng.randrange(10, len(blob))] = rng.randrange(256)
        path.write_bytes(bytes(blob))
    elif kind == "gzip-magic-garbage":
        path.write_bytes(b"\x1f\x8b" + _random_bytes(rng, rng.randint(0, 5000)))
    elif kind == "long-line":
        size = rng.choice((20_000, 70_000, 300_000)) * (4 if heavy else 1)
        path.write_bytes(log[:2000] + _long_line(rng, size) + rng.choice((b"", b"\n")) + log[-2000:])
    elif kind == "ten-mb-line":
        path.write_bytes(_long_line(rng, 10 << 20))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
    elif kind == "missing":
        pass
    elif kind == "fifo":
        os.mkfifo(path)
        data = _mutate(log, rng)

        def write(p=path, data=data):
            with open(p, "wb") as f:
                f.write(data)

        return Case(kind, ["explain", str(path), *tail], during=write)
    elif kind == "vanishing":
        path.write_bytes(log * rng.randint(50, 400))

        def vanish(p=path, how=rng.random()):  # noqa: B008 (bound per case on purpose)
            time.sleep(0.001)
            try:
                if how < 0.5:
                    os.truncate(p, 0)
                else:
                    os.unlink(p)
            except OSError:
                pass

        return Case(kind, ["explain", str(path), *tail], during=vanish)
    elif kind in ("stdin", "stdin-gzip"):
        data = _mutate(log, rng)
        return Case(kind, ["explain", "-", *tail], stdin=gzip.compress(data) if kind == "stdin-gzip" else data)
    elif kind == "several":
        a, b = tmp / f"case{index}a.log", tmp / f"case{index}b.log.gz"
        a.write_bytes(_mutate(log, rng))
        b.write_bytes(gzip.compress(_real_log(rng))[: rng.randint(20, 3000)])
        return Case(kind, ["explain", str(a), str(b), *tail])
    elif kind == "symlink-loop":
        other = tmp / f"case{index}.other"
        os.symlink(other, path)
        os.symlink(path, other)
    elif kind == "dev-null":
        return Case(kind, ["explain", "/dev/null", *tail])
    elif kind == "mangled-examples":
        path.write_bytes(_mangled_examples(rng))
    elif kind == "mangled-examples-in-log":
        lines = log.split(b"\n")
        at = rng.randrange(len(lines))
        path.write_bytes(b"\n".join(lines[:at] + [_mangled_examples(rng)] + lines[at:]))
    elif kind == "odd-model-names":
        path.write_bytes(_odd_model_names(rng))
    elif kind == "binary-then-log":
        path.write_bytes(_random_bytes(rng, 100_000) + log)
    return Case(kind, ["explain", str(path), *tail])


def check(case: Case, exit_code: int, stdout: str, stderr: str, exception: BaseException | None) -> str | None:
    """Why the outcome breaks the contract, or None when it keeps it."""
    if exception is not None and not isinstance(exception, SystemExit):
        import traceback

        return "traceback:\n" + "".join(traceback.format_exception(exception))
    if exit_code not in (0, 1, 2, 4):  # 4: unknown (no vLLM output in random bytes)
        return f"exit status {exit_code}"
    if case.blocker and exit_code != 1:
        return f"missed blocker: exit {exit_code}, {stderr.strip()[-300:]!r}"
    if exit_code == 2:
        lines = stderr.strip("\n").split("\n")
        if len(lines) != 1 or not lines[0].startswith("vllm-doctor: "):
            return f"exit 2 without one clear line: {stderr!r}"
        return None
    if "--format" in case.args and case.args[case.args.index("--format") + 1] == "json":
        try:
            report = json.loads(stdout)
        except ValueError as e:
            return f"not JSON: {e}"
        if report.get("schema") != "vllm-doctor/report/1":
            return "no schema"
        if case.blocker and not any(
            d["severity"] == "blocker" and d["numbers"].get("alloc") == 2.0 for d in report["diagnoses"]
        ):
            return f"missed blocker: {[(d['rule'], d['numbers']) for d in report['diagnoses']]}"
    elif not stdout.strip():
        return "empty report"
    return None


@contextlib.contextmanager
def memory_limit(limit: int = 4 << 30):
    """A case that allocates without bound raises MemoryError (exit 3, a failed case) instead of
    taking the machine down with the fuzzer."""
    try:
        import resource
    except ImportError:  # not POSIX
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run_case(case: Case) -> tuple[str | None, float]:
    """Run one case in-process through the real CLI; (problem or None, seconds)."""
    from vllm_doctor.cli import app

    runner = CliRunner()
    thread = threading.Thread(target=case.during, daemon=True) if case.during else None
    start = time.perf_counter()
    if thread:
        thread.start()
    try:
        result = runner.invoke(app, case.args, input=case.stdin)
    finally:
        if thread:
            thread.join(10)
        for undo in case.cleanup:
            undo()
    took = time.perf_counter() - start
    return check(case, result.exit_code, result.stdout, result.stderr, result.exception), took


def test_fuzz_never_a_traceback(tmp_path):
    rng = random.Random(20260530)
    failures = []
    with memory_limit():
        for i in range(300):
            case = make_case(rng, tmp_path, i)
            problem, _took = run_case(case)
            if problem:
                failures.append(f"{case.name} {case.args}: {problem}")
    assert failures == []


@pytest.mark.parametrize(
    ("name", "make", "want"),
    [
        ("directory", lambda p: p.mkdir(), "is a directory"),
        ("missing", lambda p: None, "no such file"),
        ("binary", lambda p: p.write_bytes(bytes(range(256)) * 400), "binary data"),
        ("utf16", lambda p: p.write_bytes("INFO CUDA out of memory\n".encode("utf-16") * 100), "binary data"),
    ],
)
def test_unreadable_input_exits_2_with_one_line(tmp_path, name, make, want):
    """Through a real process: exit status 2 and one line on stderr, nothing on stdout."""
    path = tmp_path / "input.log"
    make(path)
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "explain", str(path), "--format", "json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and want in proc.stderr and proc.stderr.startswith("vllm-doctor: ")


def test_empty_file_is_a_report(tmp_path):
    path = tmp_path / "empty.log"
    path.write_bytes(b"")
    problem, _ = run_case(Case("empty", ["explain", str(path), "--format", "json"]))
    assert problem is None


def test_fifo_is_read_like_a_file(tmp_path):
    """`vllm-doctor explain <(kubectl logs ...)` hands it a pipe."""
    path = tmp_path / "pipe"
    os.mkfifo(path)
    log = (ROOT / "fixtures" / "lab" / "cache-oom.log").read_bytes()

    def write():
        with open(path, "wb") as f:
            f.write(log)

    from vllm_doctor.cli import app

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    result = CliRunner().invoke(app, ["explain", str(path), "--format", "json"])
    thread.join(10)
    report = json.loads(result.stdout)
    assert report["diagnoses"][0]["category"] == "cache-oom"


def test_ten_megabyte_single_line(tmp_path):
    path = tmp_path / "one-line.log"
    line = b"x" * (5 << 20) + b" CUDA out of memory. Tried to allocate 2.00 GiB " + b"y" * (5 << 20)
    path.write_bytes(line)
    problem, _ = run_case(Case("ten-mb-line", ["explain", str(path), "--format", "json"]))
    assert problem is None


def test_file_that_vanishes_mid_read(tmp_path):
    """Truncated or unlinked while being read: a report of what was read, no traceback."""
    log = (ROOT / "fixtures" / "lab" / "queue-saturation.log").read_bytes() * 3000
    for how in ("truncate", "unlink"):
        path = tmp_path / f"{how}.log"
        path.write_bytes(log)

        def vanish(p=path, how=how):
            time.sleep(0.002)
            os.truncate(p, 0) if how == "truncate" else os.unlink(p)

        problem, _ = run_case(Case("vanishing", ["explain", str(path), "--format", "json"], during=vanish))
        assert problem is None


# --- rule files are data -------------------------------------------------------------------


def _rules_dir(tmp_path: Path, text: str, name: str = "my-rule") -> Path:
    d = tmp_path / "rules"
    d.mkdir(exist_ok=True)
    (d / f"{name}.toml").write_text(text)
    return d


def _explain_with(tmp_path: Path, rules: Path, log: str = "it happened 3\n"):
    from vllm_doctor.cli import app

    path = tmp_path / "x.log"
    path.write_text(log)
    return CliRunner().invoke(app, ["explain", str(path), "--rules", str(rules), "--format", "json", "--strict-rules"])


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("when", "\"__import__('os').system('touch PWNED')\""),
        ("when", "\"open('/etc/passwd').read()\""),
        ("checks", '["os.system"]'),
        ("python", "\"import os; os.system('touch PWNED')\""),
        ("facts", '{ n = "__builtins__" }'),
    ],
)
def test_a_rule_cannot_run_code(tmp_path, monkeypatch, key, value):
    monkeypatch.chdir(tmp_path)
    text = SAMPLE_RULE.replace("[[patterns]]", f"{key} = {value}\n[[patterns]]")
    result = _explain_with(tmp_path, _rules_dir(tmp_path, text))
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith("vllm-doctor: ") and "my-rule.toml" in result.stderr
    assert not (tmp_path / "PWNED").exists()


def test_templates_only_read_values_by_name(tmp_path):
    hostile = ["{n.__class__.__init__.__globals__}", "{__builtins__}", "{n.real}", "Plain: {n}."]
    text = SAMPLE_RULE.replace('summary = ["It happened: {n}."]', f"summary = {json.dumps(hostile)}")
    # names that no group, fact or check gives are refused when a --rules file loads ...
    refused = _explain_with(tmp_path, _rules_dir(tmp_path, text))
    assert refused.exit_code == 2 and "is not a named group, a fact or a return" in refused.output
    # ... and a rule that got past loading still only reads values by name
    from vllm_doctor.knowledge.checks import CHECKS
    from vllm_doctor.matching.loader import load
    from vllm_doctor.pipeline import explain
    from vllm_doctor.render.json import to_dict

    [rule] = load([_rules_dir(tmp_path, SAMPLE_RULE)], builtin=False, checks=CHECKS)
    rule.summary = hostile
    log = tmp_path / "x.log"
    log.write_text("it happened 3\n")
    report = to_dict(explain([str(log)], [rule]))
    [d] = [d for d in report["diagnoses"] if d["rule"] == "my-rule"]
    assert d["summary"] == "Plain: 3."
    assert "class" not in json.dumps(report) and "globals" not in json.dumps(report)


def test_a_rule_cannot_read_files(tmp_path):
    """A rule file linked to a secret, or naming one, shows nothing of it."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-4711 = 1\nhunter2\n")
    d = _rules_dir(tmp_path, SAMPLE_RULE.replace("it happened (?P<n>", str(secret) + " (?P<n>"))
    (d / "linked.toml").symlink_to(secret)
    result = _explain_with(tmp_path, d, log="it happened 3\n")
    assert result.exit_code == 2
    assert "TOPSECRET" not in result.stderr + result.stdout and "hunter2" not in result.stderr + result.stdout


def test_loading_and_running_a_rule_opens_only_the_rule_files_and_runs_nothing(tmp_path, monkeypatch):
    """Watch every open() and eval/exec while rules load and run: only the rule files and the
    log are opened, nothing is evaluated."""
    from vllm_doctor.knowledge.checks import CHECKS
    from vllm_doctor.matching.loader import load
    from vllm_doctor.pipeline import explain

    rules_dir = _rules_dir(tmp_path, SAMPLE_RULE)
    log = tmp_path / "x.log"
    log.write_text("it happened 3\n")
    explain([str(log)], load([rules_dir], builtin=False, checks=CHECKS))  # import every module first: imports exec
    opened: list[str] = []
    real_open = builtins.open

    def spy_open(file, *a, **k):
        opened.append(str(file))
        return real_open(file, *a, **k)

    def spy_read_text(self, *a, **k):
        opened.append(str(self))
        with real_open(self, encoding="utf-8") as f:
            return f.read()

    def forbidden(*a, **k):
        raise AssertionError("a rule made something evaluate code")

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(Path, "read_text", spy_read_text)
    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    rules = load([rules_dir], builtin=False, checks=CHECKS)
    report = explain([str(log)], rules)
    assert [d.rule for d in report.diagnoses] == ["my-rule"]
    assert set(opened) <= {str(rules_dir / "my-rule.toml"), str(log)}


def test_builtin_rules_load_the_same_from_the_cache_a_damaged_cache_or_in_full(tmp_path, monkeypatch):
    """The fast path for the built-in rules (kept parsed, regexes compiled on first use) gives
    exactly the rules a full, validating load gives; a damaged cache, or one that would build
    anything but a rule, is parsed anew."""
    import io
    import pickle

    from vllm_doctor.knowledge.checks import CHECKS
    from vllm_doctor.matching import loader as rules

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    full = [rules.load_file(p, checks=CHECKS) for p in rules.rule_files(rules.builtin_dir())]
    assert rules.load(checks=CHECKS) == full  # writes the cache
    cache = tmp_path / "vllm-doctor" / "builtin-rules.pickle"
    written = cache.read_bytes()
    with monkeypatch.context() as m:
        m.setattr(rules, "_read_toml", None)  # no file is parsed: the rules come from the cache
        assert rules.load(checks=CHECKS) == full
    key = pickle.loads(written)  # the stamp, first in the stream

    class Planted:
        def __reduce__(self):
            return os.mkdir, (str(tmp_path / "planted"),)

    def stream(*objects):
        out = io.BytesIO()
        pickler = pickle.Pickler(out)
        for o in objects:
            pickler.dump(o)
        return out.getvalue()

    planted = stream(key, [Planted()])  # a cache that would run something
    for damage in (b"{not json", b"", stream(key), stream(key, 5), stream(key, [5]), planted):
        cache.write_bytes(damage)
        assert rules.load(checks=CHECKS) == full
        assert cache.read_bytes() == written  # parsed in full and kept again
    assert not (tmp_path / "planted").exists()
    cache.write_bytes(written[:-100])  # cut short
    assert rules.load(checks=CHECKS) == full
