"""`vllm-doctor mcp` driven by the MCP SDK's own client, over stdio and streamable HTTP: the tools
listed, explain's answer the same as `explain -f json`, check and plan, and every refusal (a path
outside the root, a symlink out of it, a FIFO, a 2 GiB file) one sentence with the server still up."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DOCTOR = str(Path(sys.executable).with_name("vllm-doctor"))
OOM = "fixtures/lab/cache-oom.log"
TOOLS = {"explain", "check", "plan", "rules", "metrics"}


@asynccontextmanager
async def stdio(*args: str, cwd: Path = ROOT):
    params = StdioServerParameters(command=DOCTOR, args=["mcp", *args], env=dict(os.environ), cwd=cwd)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def text(result) -> str:
    assert len(result.content) == 1
    return result.content[0].text


def refused(result) -> str:
    """A refusal: a tool error of one sentence, no traceback."""
    said = text(result)
    assert result.is_error, said
    assert "\n" not in said and "Traceback" not in said and said.endswith("."), said
    return said


def answer(result) -> tuple[str, Any]:
    said = text(result)
    assert not result.is_error, said
    verdict, _, document = said.partition("\n")
    return verdict, json.loads(document)


def cli_json(*args: str) -> dict:
    p = subprocess.run([DOCTOR, args[0], "--format", "json", *args[1:]], cwd=ROOT, capture_output=True, check=False)
    return json.loads(p.stdout)


def volatile(doc: dict) -> dict:
    doc.pop("settings", None)  # a config file or variable in force names itself in the CLI's JSON only
    return doc


async def explain_and_the_rest() -> None:
    async with stdio("--root", str(ROOT)) as s:
        assert {t.name for t in (await s.list_tools()).tools} == TOOLS
        verdict, doc = answer(await s.call_tool("explain", {"paths": [OOM]}))
        assert verdict.startswith("failed: cache-oom")
        assert volatile(doc) == volatile(cli_json("explain", OOM, "--no-gpu"))
        log = (ROOT / OOM).read_bytes().decode()  # as it is: its lone CRs too
        verdict2, doc2 = answer(await s.call_tool("explain", {"text": log}))
        assert verdict2 == verdict and doc2["diagnoses"] == doc["diagnoses"] and doc2["input"]["paths"] == ["<text>"]
        argv = ["fixtures/configs/lab-tiny-llama", "--max-model-len", "100000000", "--tensor-parallel-size", "3"]
        verdict, doc = answer(await s.call_tool("check", {"argv": argv}))
        cli = cli_json("check", "--no-ask-vllm", "--no-gpu", "--offline", "--", *argv)
        assert verdict.startswith("would fail") and doc["status"] == cli["status"]
        assert [d["rule"] for d in doc["diagnoses"]] == [d["rule"] for d in cli["diagnoses"]]
        shape = {"gpu_memory": "80GB", "params": "7B", "layers": 32, "kv_heads": 8, "head_dim": 128}
        verdict, doc = answer(await s.call_tool("plan", shape))
        cli = cli_json("plan", "--params", "7B", "--layers", "32", "--kv-heads", "8", "--head-dim", "128",
                       "--gpu-memory", "80GB", "--no-gpu")  # fmt: skip
        for d in (doc, cli):  # why NVML was not asked: --no-gpu, or the server never asks it
            d["gpu"]["snapshot"].pop("reason")
        assert verdict == "plan fits" and doc == cli
        verdict, listed = answer(await s.call_tool("rules", {}))
        assert verdict == f"{len(listed)} rules" and {"id", "category", "title"} <= set(listed[0])
        verdict, shown = answer(await s.call_tool("rules", {"rule_id": "kv-cache-too-small-for-max-len"}))
        assert "kv-cache-too-small-for-max-len" in shown["doc"]
        refused(await s.call_tool("rules", {"rule_id": "no-such-rule"}))
        templates = (await s.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["rule://{rule_id}"]  # each rule's documentation
        read = await s.read_resource("rule://kv-cache-too-small-for-max-len")
        assert read.contents[0].text == shown["doc"]
        refused(await s.call_tool("metrics", {"sources": ["http://127.0.0.1:1/metrics"]}))  # no --allow-url
        scrapes = [f"fixtures/lab/queue-saturation.metrics-{i}.txt" for i in range(12)]
        verdict, doc = answer(await s.call_tool("metrics", {"sources": scrapes}))
        cli = cli_json("explain", "--no-gpu", *(a for p in scrapes for a in ("--metrics", p)))
        assert verdict.startswith("degraded") and [d["rule"] for d in doc["diagnoses"]] == [
            d["rule"] for d in cli["diagnoses"]
        ]


def test_explain_check_plan_and_rules_answer_as_the_cli_does():
    anyio.run(explain_and_the_rest)


async def refusals(root: Path) -> None:
    async with stdio("--root", str(root), cwd=root) as s:
        for args, why in [
            ({"paths": [str(ROOT / OOM)]}, "outside the allowed roots"),
            ({"paths": ["../outside.log"]}, "outside the allowed roots"),
            ({"paths": ["out.log"]}, "symbolic link"),
            ({"paths": ["fifo"]}, "a FIFO"),
            ({"paths": ["huge.log"]}, "over the 1 GiB limit"),
            ({"paths": ["missing.log"]}, "cannot be read"),
            ({"paths": ["."]}, "a directory"),
            ({}, "either paths"),
        ]:
            assert why in refused(await s.call_tool("explain", args)), args
            verdict, _ = answer(await s.call_tool("explain", {"paths": ["in.log"]}))  # still up, still answering
            assert verdict.startswith("failed: cache-oom")
        assert "'layers' is invalid" in refused(await s.call_tool("plan", {"gpu_memory": "80GB", "layers": -1}))
        assert "80XB" in refused(
            await s.call_tool(
                "plan", {"gpu_memory": "80XB", "params": "7B", "layers": 2, "kv_heads": 8, "head_dim": 128}
            )
        )
        assert "outside" in refused(await s.call_tool("plan", {"gpu_memory": "80GB", "config": "/etc/passwd"}))
        assert "outside" in refused(await s.call_tool("check", {"argv": ["/", "--max-model-len", "10"]}))


def test_paths_outside_the_root_symlinks_out_fifos_and_huge_files_are_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "outside.log").write_text((ROOT / OOM).read_text())
    (root / "in.log").write_text((ROOT / OOM).read_text())
    (root / "out.log").symlink_to(tmp_path / "outside.log")
    os.mkfifo(root / "fifo")
    with open(root / "huge.log", "wb") as f:
        f.truncate(2 << 30)  # sparse: 2 GiB that take no disk
    anyio.run(refusals, root)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def over_http(url: str) -> None:
    from mcp.client.streamable_http import streamable_http_client

    async with streamable_http_client(url) as streams, ClientSession(streams[0], streams[1]) as s:
        await s.initialize()
        assert {t.name for t in (await s.list_tools()).tools} == TOOLS
        refused(await s.call_tool("explain", {"paths": ["/etc/passwd"]}))
        verdict, doc = answer(await s.call_tool("explain", {"paths": [OOM]}))
        assert volatile(doc) == volatile(cli_json("explain", OOM, "--no-gpu"))


def test_the_same_over_streamable_http_on_localhost():
    port = _free_port()
    server = subprocess.Popen([DOCTOR, "mcp", "--root", str(ROOT), "--http", "--port", str(port)], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, server.stderr.read().decode()  # type: ignore[union-attr]
                time.sleep(0.1)
        anyio.run(over_http, f"http://127.0.0.1:{port}/mcp")
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_the_other_commands_do_not_import_the_sdk():
    code = "import sys; sys.argv = ['vllm-doctor', 'rules']; from vllm_doctor.cli.complete import main\ntry:\n main()\nexcept SystemExit:\n pass\nprint('mcp' in sys.modules, file=sys.stderr)"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert p.stderr.strip().splitlines()[-1] == "False", p.stderr


def test_urls_pass_only_under_an_allowed_prefix_compared_parsed():
    from vllm_doctor.mcp.guard import Guard, Refused

    guard = Guard.of([str(ROOT)], ["http://127.0.0.1:8000/"])
    assert guard.url("http://127.0.0.1:8000/metrics")
    for url in ("http://127.0.0.1:80001/metrics", "http://127.0.0.1:8000.evil.example/", "https://127.0.0.1:8000/",
                "http://user@127.0.0.1:8000/metrics", "http://127.0.0.1:8000@evil.example/"):  # fmt: skip
        with pytest.raises(Refused):
            guard.url(url)
