"""`vllm-doctor serve` mechanics against a real child process (tests/fakevllm.py) that replays a
lab recording and ends as told: exit statuses, forwarded signals, the stop hang, orphans, no
lost bytes, the live warning, and vllm-doctor failing without harming the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import LAB, alive, conforms
from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.serve import options as options_mod
from vllm_doctor.serve import watch as watch_mod
from vllm_doctor.serve import wrapper as serve_mod

REPORT_FILES = {"report.md", "report.json", "server.log", "env.txt", "report.html"}
PICTURES = {"memory.svg", "queue.svg"}  # beside them when there is something to draw


def _env(**fake):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env.update({k: str(v) for k, v in fake.items()})
    env["NO_COLOR"] = "1"
    return env


def start(tmp_path, fake_bin, *doctor_args, model_args=("/models/tiny-llama",), **fake):
    # --preflight off: these tests compare the child's bytes; tests/preflight/test_serve_preflight.py tests it
    cmd = [sys.executable, "-m", "vllm_doctor", "serve", "--vllm-bin", str(fake_bin)]
    cmd += ["--preflight", "off", *doctor_args, "--", *model_args]
    return subprocess.Popen(
        cmd, cwd=tmp_path, env=_env(**fake), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )


def run_serve(tmp_path, fake_bin, *doctor_args, timeout=60, **fake):
    p = start(tmp_path, fake_bin, *doctor_args, **fake)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def report_dirs(tmp_path):
    root = tmp_path / "vllm-doctor-reports"
    return sorted(root.iterdir()) if root.exists() else []


def wait_for(path: Path, timeout=30.0):
    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def _lines(data: bytes) -> list[bytes]:
    """Lines split at newlines only (splitlines also splits at the \\r of progress bars)."""
    return [ln + b"\n" for ln in data.split(b"\n")[:-1]]


# --------------------------------------------------------------------------------------------
# exit statuses
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("recording", "end", "status", "reported"),
    [
        ("healthy.log", "exit:0", 0, False),
        ("tp-divisibility.log", "exit:1", 1, True),
        ("wrapper-sigterm-idle.log", "kill:TERM", 143, True),
        ("wrapper-sigkill.log", "kill:KILL", 137, True),
        ("healthy.log", "kill:INT", 130, True),
    ],
)
def test_exit_status_is_the_childs(tmp_path, fake_bin, recording, end, status, reported):
    rc, out, err = run_serve(tmp_path, fake_bin, FAKE_REPLAY=LAB / recording, FAKE_END=end)
    assert rc == status, err.decode()
    dirs = report_dirs(tmp_path)
    assert bool(dirs) is reported
    if reported:
        assert {p.name for p in dirs[0].iterdir()} - PICTURES == REPORT_FILES
        lines = [ln for ln in err.decode().splitlines() if ln.startswith("vllm-doctor:")]
        assert "incident report in" in lines[-1] and str(dirs[0].name) in lines[-1]
        assert all("incident report in" not in ln for ln in lines[:-1])  # the one line, last
        data = conforms((dirs[0] / "report.json").read_text(), "serve-report-1")
        assert data["serve"]["exit_status"] == status
        assert data["serve"]["bad_exit"] is True
    else:
        assert b"vllm-doctor" not in err  # nothing after a clean exit


def test_a_bad_exit_ends_with_the_answer_on_the_console(tmp_path, fake_bin):
    """Issue 40: after a bad exit stderr gets explain's first screen (the verdict, the cause, the
    fixes, the corrected command), then the one line saying where the report is; with -q, the
    one line only. What `kubectl logs --previous` shows the paged operator."""
    rc, _, err = run_serve(tmp_path, fake_bin, FAKE_REPLAY=LAB / "cache-oom.log", FAKE_END="exit:1")
    text = err.decode()
    assert rc == 1 and "BLOCKER  The KV cache cannot hold one sequence of --max-model-len" in text
    assert "Fixes, in order" in text and "Corrected command (fix 1 applied: --max-model-len 8064)" in text
    tail = text.rstrip("\n").splitlines()
    assert tail[-2] == "(all of it: report.md in the incident report below)" and "incident report in" in tail[-1]
    rc, _, err = run_serve(tmp_path, fake_bin, "-q", FAKE_REPLAY=LAB / "cache-oom.log", FAKE_END="exit:1")
    assert rc == 1 and [ln for ln in err.decode().splitlines() if "vllm-doctor" in ln or "BLOCKER" in ln] == [
        err.decode().strip().splitlines()[-1]
    ]


def test_failed_start_report_names_the_category(tmp_path, fake_bin):
    rc, out, err = run_serve(
        tmp_path, fake_bin, "--report-dir", "incident", FAKE_REPLAY=LAB / "tp-divisibility.log", FAKE_END="exit:1"
    )
    assert rc == 1
    (d,) = (tmp_path / "incident").iterdir()  # a new directory per incident under --report-dir
    data = conforms((d / "report.json").read_text(), "serve-report-1")
    assert data["schema"] == "vllm-doctor/report/1"
    assert data["diagnoses"][0]["category"] == "tp-divisibility"
    assert data["input"]["paths"] == ["server.log"]
    assert "tp-divisibility" in (d / "report.md").read_text()
    assert (d / "server.log").read_bytes() == (LAB / "tp-divisibility.log").read_bytes()
    env = (d / "env.txt").read_text()
    assert "vLLM: 0.32.0" in env and "command:" in env and "exit: status 1" in env and "GPU:" in env
    assert f"tp-divisibility (blocker); incident report in incident/{d.name}/\n" in err.decode()


def test_always_report_after_a_clean_exit(tmp_path, fake_bin):
    rc, _, err = run_serve(tmp_path, fake_bin, "--always-report", FAKE_REPLAY=LAB / "healthy.log", FAKE_END="exit:0")
    assert rc == 0
    (d,) = report_dirs(tmp_path)
    data = conforms((d / "report.json").read_text(), "serve-report-1")
    assert data["serve"]["bad_exit"] is False and data["status"] == "healthy"


def test_engine_dead_with_status_zero_is_a_bad_exit(tmp_path, fake_bin):
    """unsupported-head-dim: the engine dies at the first request, vLLM exits 0."""
    rc, _, err = run_serve(tmp_path, fake_bin, FAKE_REPLAY=LAB / "unsupported-head-dim.log", FAKE_END="exit:0")
    assert rc == 0  # the wrapper's status stays the child's
    (d,) = report_dirs(tmp_path)
    data = conforms((d / "report.json").read_text(), "serve-report-1")
    assert any("fatal error" in r for r in data["serve"]["reasons"])
    assert data["status"] == "failed"


def test_missing_binary(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "serve", "--vllm-bin", str(tmp_path / "nope"), "--", "m"],
        capture_output=True,
        cwd=tmp_path,
    )
    assert p.returncode == 127
    assert b"not found" in p.stderr


def test_unwritable_log_file_falls_back_to_a_temporary_capture(tmp_path, fake_bin):
    rc, out, err = run_serve(
        tmp_path,
        fake_bin,
        "--log-file",
        str(tmp_path / "no" / "such" / "dir.log"),
        FAKE_REPLAY=LAB / "tp-divisibility.log",
        FAKE_END="exit:1",
    )
    assert rc == 1
    assert b"cannot write" in err and b"capturing to a temporary file" in err
    (d,) = report_dirs(tmp_path)
    assert (d / "server.log").read_bytes() == (LAB / "tp-divisibility.log").read_bytes()


def test_args_pass_through_and_model_required(tmp_path, fake_bin):
    argv = tmp_path / "argv"
    p = start(
        tmp_path,
        fake_bin,
        model_args=("/m", "--max-model-len", "1024", "--api-key", "x"),
        FAKE_ARGV=argv,
        FAKE_REPLAY=LAB / "healthy.log",
    )
    p.communicate(timeout=30)
    assert argv.read_text().split("\n")[:6] == ["serve", "/m", "--max-model-len", "1024", "--api-key", "x"]
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "serve"], capture_output=True, cwd=tmp_path)
    assert r.returncode == 2


# --------------------------------------------------------------------------------------------
# signals
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sig", "end", "status", "reported"),
    [
        (signal.SIGINT, "wait", 0, False),  # vLLM idle: Ctrl-C is a clean stop (recording `healthy`)
        (signal.SIGTERM, "wait", 0, False),  # wrapper-sigterm-idle
        (signal.SIGINT, "wait-default", 130, True),
        (signal.SIGTERM, "wait-default", 143, True),
        (signal.SIGHUP, "wait-default", 129, True),
    ],
)
def test_signals_are_forwarded(tmp_path, fake_bin, sig, end, status, reported):
    ready = tmp_path / "ready"
    p = start(tmp_path, fake_bin, FAKE_REPLAY=LAB / "healthy.log", FAKE_END=end, FAKE_READY=ready)
    wait_for(ready)
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    assert p.returncode == status, err.decode()
    dirs = report_dirs(tmp_path)
    assert bool(dirs) is reported
    if reported:
        serve = conforms((dirs[0] / "report.json").read_text(), "serve-report-1")["serve"]
        assert serve["signals_forwarded"] == [signal.Signals(sig).name]


def test_stop_hang_escalates_to_sigkill(tmp_path, fake_bin):
    """wrapper-sigterm / wrapper-sigint-under-load: vLLM hangs on 'Waiting for connections to
    close'; a second SIGINT does nothing; after the grace period the wrapper kills it."""
    ready = tmp_path / "ready"
    p = start(tmp_path, fake_bin, "--grace", "1.5", FAKE_REPLAY=LAB / "healthy.log", FAKE_END="hang", FAKE_READY=ready)
    wait_for(ready)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)  # the second Ctrl-C: vLLM ignores it
    out, err = p.communicate(timeout=30)
    assert p.returncode == 137
    assert time.monotonic() - t0 > 1.4  # not before the grace period (a busy machine only makes it later)
    text = err.decode()
    assert "waiting for connections to close; sent SIGKILL" in text
    (d,) = report_dirs(tmp_path)
    serve = conforms((d / "report.json").read_text(), "serve-report-1")["serve"]
    assert serve["escalated_to_sigkill"] and serve["hung_waiting_for_connections"]
    assert serve["signals_forwarded"] == ["SIGINT", "SIGINT"]


def test_third_interrupt_kills_at_once(tmp_path, fake_bin):
    ready = tmp_path / "ready"
    p = start(tmp_path, fake_bin, "--grace", "60", FAKE_REPLAY=LAB / "healthy.log", FAKE_END="hang", FAKE_READY=ready)
    wait_for(ready)
    for _ in range(3):
        p.send_signal(signal.SIGINT)
        time.sleep(0.3)
    p.communicate(timeout=15)
    assert p.returncode == 137


def test_orphans_are_reaped_and_named(tmp_path, fake_bin):
    """wrapper-sigkill: EngineCore outlives the API server, holding memory (and the pipes)."""
    rc, out, err = run_serve(
        tmp_path,
        fake_bin,
        "--reap-wait",
        "1",
        FAKE_REPLAY=LAB / "wrapper-sigkill.log",
        FAKE_END="kill:KILL",
        FAKE_ORPHAN=1,
    )
    assert rc == 137
    assert b"outlived the main one" in err and b"VLLM::EngineCore" in err
    (d,) = report_dirs(tmp_path)
    survivors = conforms((d / "report.json").read_text(), "serve-report-1")["serve"]["survivors"]
    assert survivors and all(s["killed"] for s in survivors)
    assert any("VLLM::EngineCore" in s["command"] for s in survivors)
    for s in survivors:
        assert not alive(s["pid"])


# --------------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------------
def test_no_line_lost_under_100k_quick_lines(tmp_path, fake_bin):
    """Byte for byte on both streams, and every line in the capture, in each stream's order."""
    direct = subprocess.run(
        [str(fake_bin), "serve", "m"],
        env=_env(FAKE_REPLAY=LAB / "healthy.log", FAKE_LINES=100_000),
        capture_output=True,
    )
    rc, out, err = run_serve(
        tmp_path, fake_bin, "--log-file", "capture.log", FAKE_REPLAY=LAB / "healthy.log", FAKE_LINES=100_000
    )
    assert rc == 0
    assert out == direct.stdout
    assert err == direct.stderr
    captured = _lines((tmp_path / "capture.log").read_bytes())
    assert len(captured) == direct.stdout.count(b"\n") + direct.stderr.count(b"\n")
    assert sorted(captured) == sorted(_lines(direct.stdout) + _lines(direct.stderr))
    stdout_lines = set(_lines(direct.stdout))
    assert [ln for ln in captured if ln in stdout_lines] == _lines(direct.stdout)  # in order
    quick = [ln for ln in captured if ln.startswith(b"quick ")]
    assert len(quick) == 100_000
    assert not report_dirs(tmp_path)  # (its speed is bench/passthrough.py's)


def test_live_warning_once_and_never_mid_line(tmp_path, fake_bin):
    """queue-saturation: requests wait while the KV cache is full; one warning on stderr, held
    back while stderr is in the middle of a line."""
    rc, out, err = run_serve(
        tmp_path,
        fake_bin,
        FAKE_REPLAY=LAB / "queue-saturation.log",
        FAKE_ALL_STDOUT=1,
        FAKE_PARTIAL="PARTIAL-LINE",
        FAKE_PARTIAL_AT=100,  # before the first stats line: stderr stays mid-line through them all
        FAKE_PARTIAL_S=1,
    )
    assert rc == 0
    lines = err.decode().splitlines()
    warnings = [ln for ln in lines if "[vllm-doctor] warning" in ln]
    assert len(warnings) == 1
    assert warnings[0].startswith("[vllm-doctor] warning: ")
    assert "queue-saturation" in warnings[0] and "First fix: " in warnings[0]
    assert "PARTIAL-LINE ...and the rest of it" in lines
    assert lines.index("PARTIAL-LINE ...and the rest of it") < lines.index(warnings[0])
    assert out == (LAB / "queue-saturation.log").read_bytes()  # stdout untouched


def test_watch_can_be_turned_off(tmp_path, fake_bin):
    rc, out, err = run_serve(tmp_path, fake_bin, "--no-watch", FAKE_REPLAY=LAB / "queue-saturation.log")
    assert rc == 0 and b"[vllm-doctor] warning" not in err


# --------------------------------------------------------------------------------------------
# vllm-doctor failing
# --------------------------------------------------------------------------------------------
def _bad_rules(tmp_path: Path) -> Path:
    bad = tmp_path / "rules"
    bad.mkdir()
    (bad / "broken.toml").write_text("id = [this is not toml\n")
    return bad


def test_bad_rule_file_is_one_warning_and_the_built_in_rules_still_run(tmp_path, fake_bin):
    """As explain does: the bad file is named once on stderr, before the child's output (the
    rules are loaded before it starts), and the exit diagnosis runs the built-in rules."""
    rc, out, err = run_serve(
        tmp_path, fake_bin, "--rules", str(_bad_rules(tmp_path)), FAKE_REPLAY=LAB / "tp-divisibility.log",
        FAKE_END="exit:1",
    )  # fmt: skip
    assert rc == 1
    direct = subprocess.run(
        [str(fake_bin), "serve", "m"], env=_env(FAKE_REPLAY=LAB / "tp-divisibility.log"), capture_output=True
    )
    assert out == direct.stdout
    warning, rest = err.split(b"\n", 1)
    assert b"broken.toml" in warning and b"skipped: the other rules run" in warning, warning
    assert rest.startswith(direct.stderr)  # every byte of the server's stderr, after the one warning
    assert err.count(b"broken.toml") == 1
    assert b"live watch stopped" not in err and b"could not diagnose" not in err
    (d,) = report_dirs(tmp_path)
    assert (d / "server.log").read_bytes() == (LAB / "tp-divisibility.log").read_bytes()
    data = conforms((d / "report.json").read_text(), "serve-report-1")
    assert data["serve"]["diagnosis_error"] is None
    assert data["diagnoses"][0]["category"] == "tp-divisibility"


def test_bad_rule_file_leaves_the_live_watch_running(tmp_path, fake_bin):
    rc, out, err = run_serve(
        tmp_path,
        fake_bin,
        "--rules",
        str(_bad_rules(tmp_path)),
        FAKE_REPLAY=LAB / "queue-saturation.log",
        FAKE_ALL_STDOUT=1,
    )
    assert rc == 0
    assert out == (LAB / "queue-saturation.log").read_bytes()
    warnings = [ln for ln in err.decode().splitlines() if "[vllm-doctor] warning" in ln]
    assert len(warnings) == 1 and "queue-saturation" in warnings[0], err.decode()[-2000:]


def test_strict_rules_refuses_before_the_child_starts(tmp_path, fake_bin):
    started = tmp_path / "started"
    vllm = tmp_path / "vllm-marked"
    vllm.write_text(f'#!/bin/sh\ntouch "{started}"\nexec "{fake_bin}" "$@"\n')
    vllm.chmod(0o755)
    rc, out, err = run_serve(
        tmp_path, vllm, "--strict-rules", "--rules", str(_bad_rules(tmp_path)), FAKE_REPLAY=LAB / "healthy.log"
    )
    assert rc == 2 and out == b""
    assert len(err.decode().splitlines()) == 1 and "broken.toml" in err.decode(), err
    assert not started.exists() and not report_dirs(tmp_path)


def _in_process(tmp_path, fake_bin, monkeypatch, termination_log=None, **fake):
    for k, v in fake.items():
        monkeypatch.setenv(k, str(v))
    monkeypatch.chdir(tmp_path)
    out = open(tmp_path / "out", "wb")
    err = open(tmp_path / "err", "wb")
    try:
        o = serve_mod.run(
            options_mod.ServeOptions(
                ["/m"],
                vllm_bin=str(fake_bin),
                stdout_fd=out.fileno(),
                stderr_fd=err.fileno(),
                termination_log=termination_log,
            )  # fmt: skip
        )
    finally:
        out.close()
        err.close()
    return o, (tmp_path / "out").read_bytes(), (tmp_path / "err").read_bytes()


def test_crash_in_the_watch_keeps_output_and_status(tmp_path, fake_bin, monkeypatch):
    def boom(self):
        raise RuntimeError("bug in the watch")

    monkeypatch.setattr(watch_mod.Watcher, "_run", boom)
    o, out, err = _in_process(
        tmp_path, fake_bin, monkeypatch, FAKE_REPLAY=LAB / "tp-divisibility.log", FAKE_END="exit:1"
    )
    assert o.status == 1
    assert b"live watch stopped after an internal error (RuntimeError: bug in the watch)" in err
    assert (o.report_dir / "server.log").read_bytes() == (LAB / "tp-divisibility.log").read_bytes()


def test_crash_in_the_loop_falls_back_to_plain_copy(tmp_path, fake_bin, monkeypatch):
    def boom(self, fd, data):
        raise RuntimeError("bug in the capture")

    monkeypatch.setattr(serve_mod.Wrapper, "_capture", boom)
    o, out, err = _in_process(
        tmp_path, fake_bin, monkeypatch, FAKE_REPLAY=LAB / "tp-divisibility.log", FAKE_END="exit:1"
    )
    assert o.status == 1
    recorded = (LAB / "tp-divisibility.log").read_bytes()
    uvicorn = b"".join(ln for ln in recorded.splitlines(keepends=True) if ln.startswith(b"INFO:  "))
    assert len(out) + len(uvicorn) >= len(recorded) - 1  # nothing lost after the first chunk
    assert b"internal error (RuntimeError: bug in the capture)" in err
    assert o.report_dir is not None and (o.report_dir / "server.log").exists()


def test_crash_in_the_diagnosis_still_writes_the_log(tmp_path, fake_bin, monkeypatch):
    import vllm_doctor.pipeline as explain_mod

    def boom(*a, **k):
        raise RuntimeError("bug in explain")

    monkeypatch.setattr(explain_mod, "explain", boom)
    term = tmp_path / "termination-log"
    o, out, err = _in_process(
        tmp_path, fake_bin, monkeypatch, term, FAKE_REPLAY=LAB / "tp-divisibility.log", FAKE_END="exit:1"
    )
    assert o.status == 1
    assert {p.name for p in o.report_dir.iterdir()} == REPORT_FILES - {"report.html"}  # no report to draw
    # the console: that it failed, why, and what the child did
    assert b"could not diagnose (RuntimeError: bug in explain); vLLM: exit status 1; the server never became" in err
    assert f"incident report in {o.report_dir}/".encode() in err
    data = conforms((o.report_dir / "report.json").read_text(), "serve-report-1")  # the one empty report
    assert data["status"] == "unknown" and data["diagnoses"] == [] and data["facts"]["gpu"]["available"] is False
    recorded = (LAB / "tp-divisibility.log").read_text().splitlines()
    assert data["serve"]["last_lines"] == recorded[-10:]  # what the server said last
    assert data["serve"]["exit_status"] == 1 and data["serve"]["diagnosis_error"] == "RuntimeError: bug in explain"
    md = (o.report_dir / "report.md").read_text()
    assert "could not diagnose" in md and "### The output's last lines" in md and recorded[-1] in md
    message = term.read_text().splitlines()  # the termination message: the same story, in 4096 bytes
    assert message[0].startswith("vllm-doctor: could not diagnose (RuntimeError: bug in explain); vLLM: exit status 1")
    assert message[1] == "The output's last lines:" and recorded[-1] in message
    assert message[-1] == f"Incident report: {os.path.abspath(o.report_dir)}/"


def test_the_incident_report_is_handed_a_record_it_cannot_change():
    import dataclasses

    wrapper = serve_mod.Wrapper(options_mod.ServeOptions(["m"]))
    wrapper.argv, wrapper.env = ["vllm", "serve", "m"], {"VLLM_X": "1"}
    run = wrapper.record()
    wrapper.argv.append("--later")
    wrapper.env["VLLM_X"] = "2"
    assert run.argv == ("vllm", "serve", "m") and run.env["VLLM_X"] == "1"  # a copy, taken once
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.argv = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        run.env["VLLM_X"] = "3"  # type: ignore[index]


# --------------------------------------------------------------------------------------------
# pieces
# --------------------------------------------------------------------------------------------
def test_notes_wait_for_a_line_boundary(tmp_path):
    r, w = os.pipe()
    wrapper = serve_mod.Wrapper(options_mod.ServeOptions(["m"], stdout_fd=w, stderr_fd=w))
    wrapper._write(w, b"half a li")
    wrapper.note("[vllm-doctor] hello")
    wrapper._flush_notes()
    wrapper._write(w, b"ne\n")
    wrapper._flush_notes()
    os.close(w)
    assert os.read(r, 1000) == b"half a line\n[vllm-doctor] hello\n"
    os.close(r)


@pytest.mark.parametrize(("rc", "status"), [(0, 0), (1, 1), (-15, 143), (-9, 137), (-2, 130)])
def test_exit_status_arithmetic(rc, status):
    assert options_mod.exit_status(rc) == status


def test_gpu_snapshot_never_raises():
    from vllm_doctor.capacity import gpu
    from vllm_doctor.render.summary import gpu_lines

    g = gpu.snapshot().to_json()
    assert isinstance(g, dict)
    assert gpu_lines(g)


def test_gpu_snapshot_at_exit_goes_into_the_report(tmp_path, fake_bin, monkeypatch):
    """The snapshot is taken when vLLM exits (an orphan still holds memory) and reaches env.txt,
    report.md, report.json and the diagnosis."""
    from vllm_doctor.capacity import gpu

    snap = gpu.GpuSnapshot(
        True,
        None,
        [
            gpu.GpuDevice(
                0, "NVIDIA H100 80GB HBM3", 81559, 70000, 11559, [gpu.GpuProcess(4242, "VLLM::EngineCore", 69800)]
            )
        ],
        "550.54.15",
        "12.4",
    )
    monkeypatch.setattr(gpu, "snapshot", lambda adapter=None: snap)
    o, _, _ = _in_process(tmp_path, fake_bin, monkeypatch, FAKE_REPLAY=LAB / "tp-divisibility.log", FAKE_END="exit:1")
    env = (o.report_dir / "env.txt").read_text()
    assert "GPU 0 NVIDIA H100 80GB HBM3 (this machine, now): 81,559 MiB total, 70,000 used, 11,559 free" in env
    assert "processes: 4242 VLLM::EngineCore 69,800 MiB" in env and "driver 550.54.15, CUDA 12.4" in env
    assert "VLLM::EngineCore" in (o.report_dir / "report.md").read_text()
    data = conforms((o.report_dir / "report.json").read_text(), "serve-report-1")
    assert data["serve"]["gpu"]["devices"][0]["used_mib"] == 70000
    assert data["facts"]["gpu"]["devices"][0]["processes"][0]["pid"] == 4242


def test_under_serve_this_machines_gpus_inform_the_fixes(tmp_path, fake_bin, monkeypatch):
    """serve's log is this machine's by definition: a busy GPU here shapes the cache-oom fix."""
    from vllm_doctor.capacity import gpu

    busy = gpu.GpuDevice(0, "NVIDIA H100 80GB HBM3", 81559, 20480, 61079, [gpu.GpuProcess(4242, "python3", 20480)])
    monkeypatch.setattr(gpu, "snapshot", lambda adapter=None: gpu.GpuSnapshot(True, None, [busy], "550.54.15", "12.4"))
    log = LAB.parent / "logs" / "cache-oom" / "0.10.2_colour-real-esc-sequences.log"
    o, _, _ = _in_process(tmp_path, fake_bin, monkeypatch, FAKE_REPLAY=log, FAKE_END="exit:1")
    data = conforms((o.report_dir / "report.json").read_text(), "serve-report-1")
    assert data["facts"]["gpu"]["this_host"] is True
    actions = [f["action"] for d in data["diagnoses"] for f in d["fixes"]]
    assert "Lower --gpu-memory-utilization to 0.72: other processes hold 20 GiB on this GPU" in actions


# --------------------------------------------------------------------------------------------
# the cost of the exit
# --------------------------------------------------------------------------------------------
HEALTHY = (  # a healthy server's lines, as the bench prints them (bench/passthrough.py)
    b"INFO:     Application startup complete.\n"
    + b"(APIServer pid=1) INFO 11-30 01:58:00 [engine.py:316] Added request cmpl-000001-0.\n" * 50
    + b"(APIServer pid=1) INFO 11-30 01:58:01 [loggers.py:335] Engine 000: Avg prompt throughput: 657.3 tokens/s, "
    b"Avg generation throughput: 31.8 tokens/s, Running: 7 reqs, Waiting: 0 reqs, GPU KV cache usage: 12.4%, "
    b"Prefix cache hit rate: 0.0%\n"
)


def test_a_clean_exit_of_a_healthy_server_skips_the_explain(tmp_path, fake_bin, monkeypatch):
    """Status 0 after ready, and no line a blocker rule (or the fallback's traceback records) is
    tried on: the explain could only say healthy, and nothing would be written, so it is not run
    (it parses every line: seconds for tens of MB, while the operator's terminal waits)."""
    import vllm_doctor.pipeline as explain_mod

    calls = []
    real = explain_mod.explain
    monkeypatch.setattr(explain_mod, "explain", lambda *a, **k: calls.append(a) or real(*a, **k))
    (tmp_path / "healthy.log").write_bytes(HEALTHY)
    o, out, err = _in_process(tmp_path, fake_bin, monkeypatch, FAKE_REPLAY=tmp_path / "healthy.log")
    assert o.status == 0 and o.ready and o.report_dir is None and not calls
    ready = b"INFO:     Application startup complete.\n"  # uvicorn's: on stderr
    assert out == HEALTHY[len(ready) :] and err.startswith(ready)
    # a fatal line behind a clean exit, or a traceback, is still explained and reported
    for log in (LAB / "unsupported-head-dim.log", next(FIXTURES.glob("logs/*/0.33.0_keyerror-compose-rfc3339*.log"))):
        o, _, _ = _in_process(tmp_path, fake_bin, monkeypatch, FAKE_REPLAY=log, FAKE_END="exit:0")
        assert o.status == 0 and o.report_dir is not None and calls
        calls.clear()


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def test_only_a_log_with_a_blocker_anchor_can_fail():
    """What the skip rests on (capture.may_fail), held on every lab recording and fixture: a log
    that it finds nothing in never explains as failed."""
    from vllm_doctor.knowledge.checks import Options
    from vllm_doctor.matching.loader import load
    from vllm_doctor.pipeline import explain
    from vllm_doctor.serve.capture import may_fail

    rules = load(checks=CHECKS)
    logs = sorted([*FIXTURES.glob("lab/*.log"), *FIXTURES.glob("logs/*/*.log")])
    free = [p for p in logs if not may_fail(p, rules)]
    assert len(free) >= 10 and len(free) < len(logs)  # both kinds are there
    options = Options(lookup_model=False, offline=True, gpu=False)
    assert [p.name for p in free if explain([str(p)], rules, options).status == "failed"] == []
