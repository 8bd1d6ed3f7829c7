"""More conventions (issue 24): serve refuses an option of its own it does not know before `--`
(a typo must not reach vLLM), -o - is stdout, an -o word that names no format is refused, -v
shows evidence whole, --metrics scrapes in natural order with their own sources, completion."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from conftest import LAB
from vllm_doctor.cli import app

OOM = LAB / "cache-oom.log"
runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--reprot-dir", "x", "--", "m"], "no such option --reprot-dir; did you mean --report-dir?"),
        (["--report-dri=x", "--", "m"], "no such option --report-dri=x; did you mean --report-dir?"),
        (["--gracee", "3", "m"], "no such option --gracee; did you mean --grace?"),  # no --: a near miss still
        (["--foo", "--", "m"], "no such option --foo; vLLM's arguments go after --"),
    ],
)
def test_serve_refuses_an_unknown_option_before_the_dashes(args, message):
    r = runner.invoke(app, ["serve", "--vllm-bin", sys.executable, "--preflight", "off", *args])
    assert r.exit_code == 2 and r.output.strip() == f"vllm-doctor: serve: {message}"  # before any child starts


def test_serve_passes_what_follows_the_dashes_and_vllms_own_options(monkeypatch):
    import vllm_doctor.serve as serve

    seen = []

    def run(opts):
        seen.append(opts.vllm_args)
        raise SystemExit(0)

    monkeypatch.setattr(serve, "run", run)
    for args in (["--grace", "2", "--", "m", "--max-model-len", "8"], ["m", "--foo"], ["--model", "m"]):
        runner.invoke(app, ["serve", "--preflight", "off", *args])
    assert seen == [["m", "--max-model-len", "8"], ["m", "--foo"], ["--model", "m"]]


def test_o_dash_is_stdout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["explain", str(OOM), "--no-gpu", "-o", "-", "--format", "json"])
    assert r.exit_code == 1 and r.output.startswith("{") and not (tmp_path / "-").exists()


@pytest.mark.parametrize("word", ["yaml", "wide", "jsno"])
def test_an_o_word_that_names_no_format_is_refused_with_the_formats(tmp_path, monkeypatch, word):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["explain", str(OOM), "--no-gpu", "-o", word])
    assert r.exit_code == 2 and not (tmp_path / word).exists()
    assert r.output.strip() == (
        f"vllm-doctor: -o {word}: not a format (text, markdown, json, html); for a file of that name give -o ./{word}"
    )
    r = runner.invoke(app, ["explain", str(OOM), "--no-gpu", "-o", f"./{word}"])  # the path form writes it
    assert r.exit_code == 1 and (tmp_path / word).exists()


@pytest.mark.parametrize("command", ["explain", "alerts", "check", "serve", "plan", "watch"])
def test_h_is_help_for_every_command(command):
    r = runner.invoke(app, [command, "-h"])
    assert r.exit_code == 0 and "Usage: " in r.output and "-h, --help" in r.output


SCRAPES = sorted(LAB.glob("queue-saturation.metrics-*.txt"))  # as a shell glob gives them: 0, 1, 10, 11, 2, ...


def test_metrics_scrapes_of_a_glob_are_read_in_their_numbers_order():
    import json

    assert [p.name.split("-")[-1] for p in SCRAPES][:4] == ["0.txt", "1.txt", "10.txt", "11.txt"]
    args = ["explain", "--no-gpu", "--format", "json"]
    glob = runner.invoke(app, [*args, *(a for p in SCRAPES for a in ("--metrics", str(p)))])
    ordered = sorted(SCRAPES, key=lambda p: int(p.stem.split("-")[-1]))
    given = runner.invoke(app, [*args, *(a for p in ordered for a in ("--metrics", str(p)))])
    assert json.loads(glob.output) == json.loads(given.output)
    report = json.loads(glob.output)
    assert report["input"]["paths"] == [str(p) for p in ordered]
    # each scrape's evidence is its own file's: scrape N is metrics-(N-1).txt
    evidence = [e for d in report["diagnoses"] for e in d["evidence"]]
    assert evidence and all(
        e["path"].endswith(f"metrics-{int(e['text'].split()[1].rstrip(':')) - 1}.txt") for e in evidence
    ), evidence


def test_many_scrapes_take_one_header_line():
    # wide, so the checkout's path (a long one in CI) does not wrap the header line
    args = ["explain", "--no-gpu", *(a for p in SCRAPES for a in ("--metrics", str(p)))]
    r = runner.invoke(app, args, env={"COLUMNS": "400"})
    second = r.output.splitlines()[1]
    assert second.startswith(f"{LAB}/queue-saturation.metrics-{{0..11}}.txt (12 inputs, ")
    assert r.output.count("metrics-1.txt") <= r.output.count("scrape 2:")  # a path only beside its evidence


def test_a_quantile_from_few_samples_carries_a_caveat():
    import json

    r = runner.invoke(
        app, ["explain", "--no-gpu", "--format", "json", *(a for p in SCRAPES for a in ("--metrics", str(p)))]
    )
    report = json.loads(r.output)
    ttft = next(d for d in report["diagnoses"] if d["rule"] == "ttft-reported")["numbers"]
    assert (ttft["ttft_p95_ms"], ttft["ttft_count"]) == (128000.0, 8)  # the lab's window: 8 first tokens
    caveats = [w for w in report["input"]["warnings"] if "rests on" in w]
    assert caveats == [
        "TTFT p95 128000 ms rests on 1 of 8 samples: too few for a p95; it says how slow the slowest one was, "
        "not what most requests see"
    ]  # the inter-token p95 over 5,093 tokens holds: no caveat


def test_the_caveat_counts_the_samples_at_or_above_the_quantiles_rank():
    from vllm_doctor.data import Diagnosis
    from vllm_doctor.pipeline import few_samples

    def said(**numbers):
        return few_samples([Diagnosis("r", "c", "info", "high", "t", "s", "e", [], numbers, [])])

    assert said(itl_p95_ms=10.0, itl_count=40) == []  # rank 38 of 40: 3 samples
    assert said(itl_p95_ms=10.0, itl_count=39)[0].startswith("ITL p95 10 ms rests on 2 of 39 samples")
    assert said(hol_decode_p50_s=1.5, hol_decode_count=2)[0].startswith("hol decode p50 1.5 s rests on 2 of 2")
    assert said(ttft_p95_ms=5.0) == [] and said(ttft_p95_ms=None, ttft_count=3) == []  # no count, no value


def _evidence(*args, stdin=None):
    import json

    r = runner.invoke(app, ["explain", "--no-gpu", "--format", "json", *args], input=stdin)
    return {e["line"]: e for e in json.loads(r.output)["diagnoses"][0]["evidence"]}


def test_v_shows_every_evidence_line_in_full(tmp_path):
    import gzip

    whole = OOM.read_bytes().split(b"\n")[72].decode().strip()  # line 73: vLLM's 540-character ValueError
    assert len(whole) > 400
    assert _evidence(str(OOM))[73] == {"line": 73, "text": whole[:400], "truncated": True}  # without -v: cut, flagged
    assert _evidence(str(OOM), "-v")[73] == {"line": 73, "text": whole, "truncated": False}
    packed = tmp_path / "server.log.gz"
    packed.write_bytes(gzip.compress(OOM.read_bytes()))
    assert _evidence(str(packed), "-v")[73]["text"] == whole  # numbered as the first read numbered it
    assert _evidence("-", "-v", stdin=OOM.read_bytes())[73]["truncated"] is True  # stdin cannot be read twice
    r = runner.invoke(app, ["explain", "--no-gpu", "-v", str(OOM)], env={"COLUMNS": "1000"})
    assert whole[-60:] in r.output
