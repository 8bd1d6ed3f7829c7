"""The model checks on real directories: auto_map and --trust-remote-code, the architecture in an
installed vLLM's registry file (a package laid out on disk as pip lays it, never imported), the
tokenizer and chat template, and --quantization against config.json."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

from conftest import FIXTURES
from vllm_doctor.capacity.hub import Resolved
from vllm_doctor.preflight import model
from vllm_doctor.preflight.args import parse
from vllm_doctor.preflight.context import Context
from vllm_doctor.preflight.finding import CannotRun

LLAMA = json.loads((FIXTURES / "configs" / "lab-tiny-llama" / "config.json").read_text())


def model_dir(tmp_path, config=None, **files):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config or LLAMA))
    for name, text in files.items():
        (d / name.replace("__", ".")).write_text(text)
    return d


def ctx(d, *argv):
    return Context(parse([str(d), *argv], env={}), offline=True, no_gpu=True)


@pytest.fixture
def installed_vllm(tmp_path, monkeypatch):
    """vLLM 0.32.0's metadata and registry file where pip puts them (only the lines read)."""
    site = tmp_path / "site"
    (site / "vllm-0.32.0.dist-info").mkdir(parents=True)
    (site / "vllm-0.32.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n")
    registry = site / "vllm" / "model_executor" / "models" / "registry.py"
    registry.parent.mkdir(parents=True)
    registry.write_text('_TEXT_GENERATION_MODELS = {\n    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),\n}\n')
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop("vllm", None)


def test_architecture_in_the_installed_registry(tmp_path, installed_vllm):
    assert model.architecture(ctx(model_dir(tmp_path))) == []
    other = tmp_path / "other"
    other.mkdir()
    cfg = {**LLAMA, "architectures": ["BrandNewForCausalLM"]}
    (found,) = model.architecture(ctx(model_dir(other, cfg)))
    assert found.rule == "check-architecture-unknown" and "vllm 0.32.0" in found.summary
    assert "vllm" not in sys.modules


def test_auto_map_needs_trust_remote_code(tmp_path, installed_vllm):
    cfg = {**LLAMA, "architectures": ["BrandNewForCausalLM"], "auto_map": {"AutoModel": "modeling.BrandNew"}}
    d = model_dir(tmp_path, cfg)
    (found,) = model.remote_code(ctx(d))
    assert (found.category, found.severity, found.rule) == ("trust-remote-code", "blocker", "check-remote-code")
    assert model.remote_code(ctx(d, "--trust-remote-code")) == []


def test_auto_map_without_vllm_installed_is_a_warning(tmp_path):
    cfg = {**LLAMA, "auto_map": {"AutoModel": "modeling.X"}}
    (found,) = model.remote_code(ctx(model_dir(tmp_path, cfg)))
    assert (found.severity, found.rule) == (
        "warning",
        "check-remote-code-unverified",
    ) and "perhaps not" in found.summary


def test_tokenizer_and_chat_template(tmp_path):
    bare = model_dir(tmp_path)
    assert [f.rule for f in model.tokenizer(ctx(bare))] == ["check-tokenizer-files-missing"]
    (tmp_path / "model" / "tokenizer.json").write_text("{}")
    (tmp_path / "model" / "tokenizer_config.json").write_text("{}")
    assert [f.rule for f in model.tokenizer(ctx(bare))] == ["check-chat-template-missing"]
    assert model.tokenizer(ctx(bare, "--chat-template", "t.jinja")) == []
    (tmp_path / "model" / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert model.tokenizer(ctx(bare)) == []
    with pytest.raises(CannotRun):
        model.tokenizer(ctx(bare, "--tokenizer", "other/tok"))


def test_quantization_against_config(tmp_path):
    d = model_dir(tmp_path)
    (missing,) = model.quantization(ctx(d, "--quantization", "awq"))
    assert (missing.category, missing.rule) == ("quantization-config-missing", "check-quantization-config-missing")
    assert model.quantization(ctx(d, "--quantization", "fp8")) == []  # quantises as it loads
    (unknown,) = model.quantization(ctx(d, "--quantization", "not-a-method"))
    assert unknown.rule == "check-quantization-unknown-unverified" and unknown.severity == "warning"  # no vLLM: 0.32's
    assert "vLLM 0.32.0" in unknown.summary


def test_no_model_is_a_blocker():
    (found,) = model.model_config(Context(parse([], env={}), offline=True, no_gpu=True))
    assert (found.severity, found.rule) == ("blocker", "check-no-model")


class _GatedHub(http.server.BaseHTTPRequestHandler):
    """A Hub endpoint on localhost that answers as for a gated repo (403, X-Error-Code GatedRepo)."""

    def do_HEAD(self):  # noqa: N802
        self.send_response(403)
        self.send_header("X-Error-Code", "GatedRepo")
        self.send_header("X-Error-Message", "Access to model org/gated is restricted.")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD

    def log_message(self, *args):
        pass


def test_a_gated_repo_is_hf_auth(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GatedHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "VLLM_"))}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}", HF_HUB_CACHE=str(tmp_path), NO_COLOR="1",
               HF_HOME=str(tmp_path / "home"))  # fmt: skip
    try:
        r = subprocess.run([sys.executable, "-m", "vllm_doctor", "check", "--format", "json", "--", "org/gated"],
                           env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 1, r.stderr
    top = json.loads(r.stdout)["diagnoses"][0]
    assert (top["category"], top["rule"]) == ("hf-auth", "check-hub-gated") and "HF_TOKEN is not set" in top["summary"]


def test_an_unknown_method_of_the_installed_vllm_is_a_blocker(tmp_path, installed_vllm):
    quant = installed_vllm / "vllm" / "model_executor" / "layers" / "quantization" / "__init__.py"
    quant.parent.mkdir(parents=True)
    quant.write_text('QuantizationMethods = Literal[\n    "awq",\n    "fp8",\n]\n')
    (unknown,) = model.quantization(ctx(model_dir(tmp_path), "--quantization", "not-a-method"))
    assert (unknown.severity, unknown.rule) == ("blocker", "check-quantization-unknown")
    assert "vllm 0.32.0's methods (awq, fp8, ...)" in unknown.summary


def test_an_unreachable_hub_is_a_warning():
    note = "org/m: Hugging Face is unreachable (timed out); going on without the model config"
    (found,) = model.config_verdict("org/m", Resolved(None, note=note))
    assert (found.severity, found.rule, found.summary) == ("warning", "check-hub-unreachable", note)


def _preflight_in_serve(tmp_path, mode: str) -> int:
    """serve's preflight (the gate, in a process of its own: the Hub's endpoint is read at import)
    against a local Hub that counts what reaches it; the number of requests."""
    hits: list[str] = []

    class Counting(_GatedHub):
        def do_HEAD(self):  # noqa: N802
            hits.append(self.path)
            super().do_HEAD()

        do_GET = do_HEAD

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "VLLM_"))}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}", HF_HUB_CACHE=str(tmp_path),
               HF_HOME=str(tmp_path / "home"))  # fmt: skip
    code = f"from vllm_doctor.preflight.gate import before_serve; before_serve(['org/gated'], {mode!r})"
    try:
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60, cwd=tmp_path, check=True)
    finally:
        server.shutdown()
        server.server_close()
    return len(hits)


def test_serves_warn_preflight_never_waits_on_the_hub_strict_asks_it(tmp_path):
    assert _preflight_in_serve(tmp_path, "warn") == 0  # the start is not held up by the network
    assert _preflight_in_serve(tmp_path, "strict") > 0
