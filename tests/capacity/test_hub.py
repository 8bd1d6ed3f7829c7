"""Finding config.json: the Hugging Face cache (built on disk, resolved by huggingface_hub itself
under HF_HUB_OFFLINE), a download of config.json alone from a Hub endpoint, gated and unreachable Hubs."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import FIXTURES, LAB

CONFIGS = FIXTURES / "configs"


# --- the Hugging Face cache and Hub, through huggingface_hub itself, in a child process so that
# --- HF_HOME / HF_HUB_CACHE / HF_HUB_OFFLINE / HF_ENDPOINT are read as a user's shell would set them


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(extra, NO_COLOR="1")
    return env


def _doctor(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_doctor", *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)  # fmt: skip


def build_hub_cache(cache: Path, repo_id: str, config: Path, revision: str = "0" * 39 + "1") -> Path:
    """The layout huggingface_hub writes: blobs/<etag>, snapshots/<rev>/config.json -> ../../blobs/<etag>,
    refs/main holding the revision."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    data = config.read_bytes()
    etag = hashlib.sha256(data).hexdigest()
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / etag).write_bytes(data)
    snap = repo / "snapshots" / revision
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to(Path("..") / ".." / "blobs" / etag)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return repo


def test_hand_built_cache_is_the_layout_huggingface_hub_reads(tmp_path):
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    build_hub_cache(tmp_path, "vllm-lab/wide-llama", CONFIGS / "lab-wide-llama" / "config.json")
    info = scan_cache_dir(tmp_path)
    assert [r.repo_id for r in info.repos] == ["vllm-lab/wide-llama"] and not info.warnings
    found = try_to_load_from_cache("vllm-lab/wide-llama", "config.json", cache_dir=tmp_path)
    assert isinstance(found, str) and json.loads(Path(found).read_text())["num_hidden_layers"] == 32


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_repo_id_resolves_from_the_cache_offline(tmp_path, variable):
    cache = tmp_path / "hub" if variable == "HF_HOME" else tmp_path
    build_hub_cache(cache, "vllm-lab/wide-llama", CONFIGS / "lab-wide-llama" / "config.json")
    env = _env(**{variable: str(tmp_path), "HF_HUB_OFFLINE": "1"})
    r = _doctor(
        "plan",
        "vllm-lab/wide-llama",
        "--gpu-memory",
        "80GB",
        "--max-model-len",
        "8192",
        "--no-gpu",
        "-f",
        "json",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    model = json.loads(r.stdout)["models"][0]["model"]
    assert model["source"] == "Hugging Face cache"
    assert (model["layers"], model["kv_heads"], model["kv_bytes_per_token"]) == (32, 8, 131072)
    assert model["params_source"] == "estimated from the shape"  # offline: no safetensors metadata


def test_explain_resolves_the_model_the_log_names_from_the_cache(tmp_path):
    """The lab's cache-fits recording with the model named as a repo id: cross-checked offline."""
    build_hub_cache(tmp_path / "cache", "vllm-lab/wide-llama", CONFIGS / "lab-wide-llama" / "config.json")
    log = tmp_path / "cache-fits.log"
    log.write_text((LAB / "cache-fits.log").read_text().replace("/models/wide-llama", "vllm-lab/wide-llama"))
    env = _env(HF_HUB_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1")
    r = _doctor("explain", str(log), "--no-gpu", "-f", "json", env=env)
    facts = json.loads(r.stdout)["facts"]
    assert facts["model"] == "vllm-lab/wide-llama" and facts["model_shape"]["source"] == "Hugging Face cache"
    assert (facts["capacity"]["predicted_tokens"], facts["capacity"]["logged_tokens"]) == (8192, 8192)


def test_not_cached_and_offline_is_one_line(tmp_path):
    env = _env(HF_HUB_CACHE=str(tmp_path), HF_HUB_OFFLINE="1")
    r = _doctor("plan", "vllm-lab/not-cached", "--gpu-memory", "80GB", "--no-gpu", env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert (
        "not in the Hugging Face cache" in r.stderr and "HF_HUB_OFFLINE=1" in r.stderr and "Traceback" not in r.stderr
    )
    r = _doctor(
        "plan",
        "vllm-lab/not-cached",
        "--offline",
        "--gpu-memory",
        "80GB",
        "--no-gpu",
        env=_env(HF_HUB_CACHE=str(tmp_path)),
    )
    assert r.returncode == 2 and "--offline forbids the network" in r.stderr


class _Hub(http.server.BaseHTTPRequestHandler):
    """A Hub endpoint on localhost: serves config.json, or answers as a gated / missing repo does."""

    mode = "ok"
    body = b""
    requests: list[str] = []

    def _answer(self) -> bool:
        self.requests.append(f"{self.command} {self.path} range={self.headers.get('Range')}")
        codes = {
            "gated": (403, "GatedRepo", "Access to model org/m is restricted."),
            "missing": (404, "RepoNotFound", "Repository not found"),
        }
        if self.mode in codes or not self.path.endswith("/config.json"):
            code, err, msg = codes.get(self.mode, (404, "EntryNotFound", "Entry not found"))
            self.send_response(code)
            self.send_header("X-Error-Code", err)
            self.send_header("X-Error-Message", msg)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False
        self.send_response(200)
        self.send_header("X-Repo-Commit", "a" * 40)
        self.send_header("ETag", f'"{hashlib.sha1(self.body).hexdigest()}"')
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        return True

    def do_HEAD(self):  # noqa: N802
        self._answer()

    def do_GET(self):  # noqa: N802
        if self._answer():
            self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub():
    _Hub.requests = []
    _Hub.body = (CONFIGS / "llama-3-8b" / "config.json").read_bytes()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_downloads_config_json_only_then_works_offline_from_the_cache(tmp_path, hub):
    _Hub.mode = "ok"
    endpoint = f"http://127.0.0.1:{hub.server_address[1]}"
    env = _env(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(tmp_path))
    r = _doctor("plan", "org/m", "--gpu-memory", "80GB", "--max-model-len", "8192", "--no-gpu", "-f", "json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["models"][0]["model"]["source"] == "downloaded from Hugging Face (config.json only)"
    files = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file() and "snapshots" in p.parts]
    assert [f.rsplit("/", 1)[1] for f in files] == ["config.json"]  # no weights
    # safetensors are asked for their headers only (get_safetensors_metadata's ranged reads), never fetched
    weights = [r_ for r_ in _Hub.requests if "safetensors" in r_ and "resolve" in r_]
    assert all(r_.startswith("HEAD") or "range=bytes=" in r_ for r_ in weights), weights
    # the hub wrote the cache; a second run needs no network
    r = _doctor(
        "plan",
        "org/m",
        "--gpu-memory",
        "80GB",
        "--no-gpu",
        "-f",
        "json",
        env=_env(HF_HUB_CACHE=str(tmp_path), HF_HUB_OFFLINE="1"),
    )
    assert json.loads(r.stdout)["models"][0]["model"]["source"] == "Hugging Face cache"


def test_gated_repo_names_hf_token(tmp_path, hub):
    _Hub.mode = "gated"
    env = _env(
        HF_ENDPOINT=f"http://127.0.0.1:{hub.server_address[1]}", HF_HUB_CACHE=str(tmp_path), HF_HOME=str(tmp_path)
    )
    r = _doctor("plan", "org/m", "--gpu-memory", "80GB", "--no-gpu", env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "gated" in r.stderr and "HF_TOKEN is not set" in r.stderr
    # explain goes on without the config and says why
    r = _doctor("explain", str(LAB / "healthy.log"), "--model", "org/m", "--no-gpu", "-f", "json", env=env)
    assert r.returncode == 0
    note = json.loads(r.stdout)["facts"]["model_shape"]["note"]
    assert "gated" in note and "HF_TOKEN" in note


def test_missing_repo_and_unreachable_hub(tmp_path, hub):
    _Hub.mode = "missing"
    env = _env(
        HF_ENDPOINT=f"http://127.0.0.1:{hub.server_address[1]}", HF_HUB_CACHE=str(tmp_path), HF_HOME=str(tmp_path)
    )
    r = _doctor("plan", "org/m", "--gpu-memory", "80GB", "--no-gpu", env=env)
    assert r.returncode == 2 and "no such model" in r.stderr
    closed = _env(HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=str(tmp_path), HF_HOME=str(tmp_path))
    r = _doctor("explain", str(LAB / "healthy.log"), "--model", "org/m", "--no-gpu", env=closed)
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr
    assert "Hugging Face is unreachable" in r.stdout and "going on without the model config" in r.stdout


def test_reachable_trusts_what_the_lookup_already_learned():
    from vllm_doctor.capacity.hub import Resolved, reachable

    assert reachable(Resolved(None, repo_id="org/m", online=True))  # no probe: it answered
    assert not reachable(Resolved(None, repo_id="org/m", online=False))  # no probe: it failed
