#!/usr/bin/env python3
"""A stand-in for `vllm serve` in the wrapper's tests: a real process that replays a real lab
recording and then ends as it is told, the way vLLM 0.32 ends (shared/vllm-lab, wrapper-*).

    fakevllm.py serve MODEL [args...]            (what `vllm-doctor serve` runs)

Told by environment variables:
  FAKE_REPLAY=path     a recording to print: uvicorn's lines ("INFO:     ...") to stderr as uvicorn
                       does, the rest to stdout
  FAKE_DELAY=s         pause between replayed lines (default 0)
  FAKE_LINES=n         then n quick numbered lines ("quick 000001 ..."), every 10th on stderr
  FAKE_PARTIAL=text    then leave this on stderr without a newline for FAKE_PARTIAL_S seconds,
                       finishing the line afterwards; with FAKE_PARTIAL_AT=n, before replayed
                       line n, finished FAKE_PARTIAL_S seconds after the replay
  FAKE_ALL_STDOUT=1    replay every line to stdout
  FAKE_NULS=n          after each replayed line, n NULs (a hole, as a preallocated file reads) and
                       a second write of n more, no newline: they start the next line
  FAKE_ORPHAN=1        start a child (argv[0] VLLM::EngineCore) that ignores SIGINT/SIGTERM and
                       sleeps, holding stdout and stderr, like vLLM's orphaned engine
  FAKE_ESCAPE=1        start a child (argv[0] VLLM::Escaped) that calls setsid() (a session and
                       process group of its own) and sleeps, holding stdout and stderr, ignoring
                       SIGINT/SIGTERM/SIGHUP; FAKE_ESCAPE=plain: the same, ignoring nothing, and
                       writing "escaped <pid>" to FAKE_ESCAPE_PID, "TERM" to it when it gets SIGTERM
  FAKE_READY=path      create this file once the replay is done
  FAKE_ARGV=path       write the arguments received here (one per line)
  FAKE_END=            how it ends:
     exit:N            exit with status N
     kill:SIG          kill itself with a signal (TERM, KILL, INT, ...)
     wait              wait for a signal; SIGINT/SIGTERM print vLLM's clean shutdown lines, exit 0
     wait-default      wait for a signal with the default action (a death by that signal)
     hang              wait; SIGINT/SIGTERM print "Waiting for connections to close" and it
                       hangs there, ignoring more, until SIGKILL
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

OUT = sys.stdout.buffer
ERR = sys.stderr.buffer


def emit(stream, data: bytes) -> None:
    stream.write(data)
    stream.flush()


def replay(path: str, delay: float, partial_at: int = 0) -> None:
    one_stream = bool(os.environ.get("FAKE_ALL_STDOUT"))
    nuls = b"\0" * int(os.environ.get("FAKE_NULS", "0"))
    with open(path, "rb") as f:
        for no, line in enumerate(f, 1):
            if no == partial_at:
                emit(ERR, os.environ["FAKE_PARTIAL"].encode())
            uvicorn = line.startswith((b"INFO:  ", b"ERROR:  ", b"WARNING:  "))
            emit(ERR if uvicorn and not one_stream else OUT, line)
            if nuls:  # two writes: a hole the pump may read as two chunks
                emit(OUT, nuls)
                emit(OUT, nuls)
            if delay:
                time.sleep(delay)
    if partial_at:
        time.sleep(float(os.environ.get("FAKE_PARTIAL_S", "1")))
        emit(ERR, b" ...and the rest of it\n")


def quick(n: int) -> None:
    out, err = [], []
    for i in range(1, n + 1):
        line = b"quick %06d the quick brown fox jumps over the lazy dog\n" % i
        (err if i % 10 == 0 else out).append(line)
        if len(out) + len(err) >= 500:
            emit(OUT, b"".join(out))
            emit(ERR, b"".join(err))
            out, err = [], []
    emit(OUT, b"".join(out))
    emit(ERR, b"".join(err))


def clean_stop(signum, _frame):
    emit(
        OUT,
        b"(APIServer pid=%d) INFO 11-30 02:06:46 [launcher.py:254] [shutdown] API server: shutdown triggered\n"
        % os.getpid(),
    )
    emit(
        ERR,
        b"INFO:     Shutting down\nINFO:     Waiting for application shutdown.\nINFO:     Application shutdown complete.\n",
    )
    sys.exit(0)


def hang_stop(signum, _frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    emit(
        OUT,
        b"(APIServer pid=%d) INFO 11-30 02:06:46 [launcher.py:270] [shutdown] API server: stopping engine client mode=abort timeout=0s\n"
        % os.getpid(),
    )
    emit(ERR, b"INFO:     Shutting down\nINFO:     Waiting for connections to close. (CTRL+C to force quit)\n")


def main() -> None:
    env = os.environ
    if env.get("FAKE_ARGV"):
        with open(env["FAKE_ARGV"], "w") as f:
            f.write("\n".join(sys.argv[1:]) + "\n")
    end = env.get("FAKE_END", "exit:0")
    if end == "wait":
        signal.signal(signal.SIGINT, clean_stop)
        signal.signal(signal.SIGTERM, clean_stop)
    elif end == "hang":
        signal.signal(signal.SIGINT, hang_stop)
        signal.signal(signal.SIGTERM, hang_stop)
    else:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    if env.get("FAKE_ORPHAN"):
        subprocess.Popen(
            ["bash", "-c", "trap '' INT TERM HUP; exec -a VLLM::EngineCore sleep 300"],
            stdin=subprocess.DEVNULL,
        )
    if env.get("FAKE_ESCAPE"):
        plain = env["FAKE_ESCAPE"] == "plain"
        script = (
            'echo "escaped $$" > "$FAKE_ESCAPE_PID"; trap \'echo TERM >> "$FAKE_ESCAPE_PID"; exit 143\' TERM; '
            "sleep 300 & wait"
            if plain
            else "trap '' INT TERM HUP; exec -a VLLM::Escaped sleep 300"
        )
        subprocess.Popen(
            ["bash", "-c", script],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    partial_at = int(env.get("FAKE_PARTIAL_AT", "0"))
    if env.get("FAKE_REPLAY"):
        replay(env["FAKE_REPLAY"], float(env.get("FAKE_DELAY", "0")), partial_at)
    if env.get("FAKE_LINES"):
        quick(int(env["FAKE_LINES"]))
    if env.get("FAKE_PARTIAL") and not partial_at:
        emit(ERR, env["FAKE_PARTIAL"].encode())
        time.sleep(float(env.get("FAKE_PARTIAL_S", "1")))
        emit(ERR, b" ...and the rest of it\n")
    if env.get("FAKE_READY"):
        open(env["FAKE_READY"], "w").close()
    kind, _, arg = end.partition(":")
    if kind == "exit":
        sys.exit(int(arg or 0))
    if kind == "kill":
        os.kill(os.getpid(), getattr(signal, "SIG" + arg))
        time.sleep(5)
        sys.exit(99)
    while True:  # wait, wait-default, hang
        time.sleep(0.5)


if __name__ == "__main__":
    main()
