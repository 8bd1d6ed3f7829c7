"""config.json -> ModelShape the way vLLM reads it, and finding config.json: a local directory,
the Hugging Face cache (built on disk, resolved by huggingface_hub itself under HF_HUB_OFFLINE),
a download of config.json alone from a Hub endpoint, gated and unreachable Hubs."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import FIXTURES, LAB
from vllm_doctor.capacity import arithmetic as cap
from vllm_doctor.capacity import modelcfg
from vllm_doctor.capacity.modelcfg import ConfigError, shape_from_config

CONFIGS = FIXTURES / "configs"


def shape(name: str, **kw):
    return shape_from_config(json.loads((CONFIGS / name / "config.json").read_text()), name=name, **kw)


# name: (layers, attention heads, KV heads, head size, KV bytes per token at bf16 and TP 1)
EXPECTED = {
    "llama-2-7b": (32, 32, 32, 128, 524_288),  # MHA
    "llama-3-8b": (32, 32, 8, 128, 131_072),  # GQA
    "llama-3-70b": (80, 64, 8, 128, 327_680),
    "llama-3.1-8b": (32, 32, 8, 128, 131_072),
    "mistral-7b-v0.1": (32, 32, 8, 128, 131_072),
    "qwen2.5-7b": (28, 28, 4, 128, 57_344),
    "gemma-7b": (28, 16, 16, 256, 458_752),  # explicit head_dim 256, not 3072 / 16 = 192
    "mixtral-8x7b": (32, 32, 8, 128, 131_072),
    "deepseek-v3": (61, 128, 128, 576, 70_272),  # MLA: (512 + 64) x 61 x 2
    "deepseek-v2-lite": (27, 16, 16, 576, 31_104),
    "llava-1.5-7b": (32, 32, 32, 128, 524_288),  # text_config, Llama defaults
    "gemma-3-27b": (62, 32, 16, 128, 507_904),  # text_config
    "lab-wide-llama": (32, 8, 8, 128, 131_072),
    "lab-tiny-llama": (2, 4, 2, 64, 1_024),
    "lab-tiny-llama-hd16": (2, 4, 2, 16, 256),
    "lab-tiny-llama-h6kv4": (2, 6, 4, 64, 2_048),
    "lab-tiny-llama-h6kv6": (2, 6, 6, 64, 3_072),
}


def test_every_config_fixture_is_covered():
    assert {p.name for p in CONFIGS.iterdir() if p.is_dir()} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shape_and_kv_bytes_per_token(name):
    s = shape(name)
    layers, heads, kv, head_dim, bpt = EXPECTED[name]
    assert (s.layers, s.attention_heads, s.kv_heads, s.head_dim) == (layers, heads, kv, head_dim)
    assert cap.kv_bytes_per_token(s, 2) == bpt


def test_lab_configs_are_the_labs_own(shared):
    models = shared / "vllm-lab" / "models"
    dirs = sorted(d for d in models.iterdir() if (d / "config.json").is_file())
    assert dirs, f"no lab models under {models}"
    for d in dirs:
        assert (CONFIGS / f"lab-{d.name}" / "config.json").read_text() == (d / "config.json").read_text()


def test_mla_is_one_latent_vector_per_token_per_layer_and_not_split_by_tp():
    s = shape("deepseek-v3")
    assert s.use_mla and (s.kv_lora_rank, s.qk_rope_head_dim) == (512, 64)
    assert cap.kv_heads_per_rank(s, 8) == 1
    assert cap.kv_bytes_per_token(s, 2, tp=8) == cap.kv_bytes_per_token(s, 2) == (512 + 64) * 61 * 2
    assert cap.kv_bytes_per_token(s, 1) == 35_136  # fp8 KV cache


def test_gqa_kv_heads_split_over_tp_and_replicate_past_them():
    s = shape("llama-3-70b")
    assert cap.kv_bytes_per_token(s, 2, tp=4) == 2 * 80 * 2 * 128 * 2
    assert cap.kv_heads_per_rank(s, 16) == 1  # 8 KV heads over 16 GPUs: each head on two GPUs


def test_multimodal_text_config_and_its_defaults_are_noted():
    llava = shape("llava-1.5-7b")
    assert llava.max_position_embeddings == 4096 and llava.dtype == "float16"
    assert any("text_config" in n for n in llava.notes)
    assert any("num_hidden_layers" in n and "llama defaults" in n for n in llava.notes)
    gemma3 = shape("gemma-3-27b")
    assert (gemma3.sliding_window, gemma3.sliding_layers, gemma3.full_layers) == (1024, 52, 10)
    assert gemma3.derived_max_model_len == 131072  # vLLM does not multiply Gemma 3's linear rope factor


def test_sliding_window_per_architecture():
    mistral = shape("mistral-7b-v0.1")
    assert (mistral.sliding_window, mistral.sliding_layers) == (4096, 32)
    qwen = shape("qwen2.5-7b")
    assert qwen.sliding_window is None and qwen.sliding_layers == 0
    assert any("use_sliding_window is false" in n for n in qwen.notes)
    typed = shape_from_config({"num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 256, "sliding_window": 512,
                               "layer_types": ["sliding_attention", "full_attention"] * 2})  # fmt: skip
    assert typed.sliding_layers == 2


def test_dtype_quantization_and_experts():
    assert shape("llama-2-7b").dtype == "float16"
    assert shape("lab-wide-llama").dtype == "bfloat16"  # transformers 5 writes "dtype"
    v3 = shape("deepseek-v3")
    assert (v3.quant_method, v3.quant_bits, v3.num_experts) == ("fp8", 8.0, 256)
    assert shape("mixtral-8x7b").num_experts == 8
    q = modelcfg.quantization_bits
    assert q({"quant_method": "awq", "bits": 4, "group_size": 128}) == ("awq", 4.0)
    assert q({"quant_method": "gptq", "bits": 8}) == ("gptq", 8.0)
    assert q({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {"num_bits": 4}}}}) == (
        "compressed-tensors",
        4.0,
    )
    assert q({"load_in_4bit": True}) == ("bitsandbytes", 4.0)
    assert q(None) == (None, None)


@pytest.mark.parametrize(
    "cfg, version, derived, key",
    [
        ({"max_position_embeddings": 8192, "n_positions": 4096}, None, 4096, "n_positions"),  # the smallest key wins
        ({"max_position_embeddings": 8192, "model_max_length": 16384}, None, 16384, "model_max_length"),
        ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}, None, 8192, "max_position_embeddings"),
        ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "dynamic", "factor": 4}}, None, 16384, "max_position_embeddings"),
        ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, None, 131072, "max_position_embeddings"),
        # yarn: original x factor up to 0.29; from 0.30 max_position_embeddings is taken as already scaled
        ({"max_position_embeddings": 32768, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, "0.10.2", 131072, "max_position_embeddings"),
        ({"max_position_embeddings": 32768, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, "0.30.0", 32768, "max_position_embeddings"),
        ({"max_position_embeddings": 2048, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}, None, 2048, "max_position_embeddings"),
        ({"hidden_size": 64}, None, None, None),
    ],
)  # fmt: skip
def test_derived_max_model_len(cfg, version, derived, key):
    assert modelcfg.derive_max_model_len(cfg, "llama", version) == (derived, key)


def test_kv_head_fallbacks_per_architecture():
    base = {"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512}
    assert shape_from_config(base).kv_heads == 8  # plain MHA
    assert shape_from_config({**base, "num_key_value_heads": None}).kv_heads == 8
    assert shape_from_config({**base, "model_type": "falcon", "multi_query": True}).kv_heads == 1
    falcon40 = {
        **base,
        "model_type": "falcon",
        "multi_query": True,
        "new_decoder_architecture": True,
        "num_kv_heads": 2,
    }
    assert shape_from_config(falcon40).kv_heads == 2
    assert shape_from_config({**base, "model_type": "mpt", "attn_config": {"kv_n_heads": 2}}).kv_heads == 2
    assert shape_from_config({**base, "multi_query_group_num": 2}).kv_heads == 2  # ChatGLM
    gpt2 = {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "model_type": "gpt2"}
    s = shape_from_config(gpt2)
    assert (s.layers, s.attention_heads, s.kv_heads, s.head_dim, s.derived_max_model_len) == (12, 12, 12, 64, 1024)


# published parameter counts; the estimate from the shape must land within 2%
PUBLISHED = {
    "llama-2-7b": 6.74e9, "llama-3-8b": 8.03e9, "llama-3-70b": 70.6e9, "mistral-7b-v0.1": 7.24e9,
    "qwen2.5-7b": 7.62e9, "gemma-7b": 8.54e9, "mixtral-8x7b": 46.7e9, "deepseek-v3": 671e9, "deepseek-v2-lite": 15.7e9,
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_estimate(name):
    assert modelcfg.estimate_params(shape(name)) == pytest.approx(PUBLISHED[name], rel=0.02)


@pytest.mark.parametrize(
    "text, words",
    [
        ("{not json", "not valid JSON (line 1"),
        ("[1, 2]", "not a JSON object"),
        ('{"num_attention_heads": 8, "hidden_size": 64}', "no num_hidden_layers"),
        ('{"num_hidden_layers": 2, "hidden_size": 64}', "no num_attention_heads"),
        ('{"num_hidden_layers": "many", "num_attention_heads": 8, "hidden_size": 64}', "not a number"),
        ('{"num_hidden_layers": 2, "num_attention_heads": 8}', "neither head_dim nor hidden_size"),
    ],
)
def test_bad_config_is_one_clear_line(tmp_path, text, words):
    f = tmp_path / "config.json"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        modelcfg.load(None, config_file=str(f))
    assert words in str(e.value) and "\n" not in str(e.value)
    # a broken config found by looking up a model is a note, not an error
    shape_, note = modelcfg.load(str(tmp_path))
    assert shape_ is None and words in note


def test_local_directory_missing_paths_and_config_file(tmp_path):
    s, note = modelcfg.load(str(CONFIGS / "llama-3-8b"))
    assert s.kv_heads == 8 and s.source.startswith("local directory") and note is None
    assert s.params_source == "estimated from the shape"
    s, _ = modelcfg.load(None, config_file=str(CONFIGS / "qwen2.5-7b" / "config.json"))
    assert s.source.startswith("--config")
    s, note = modelcfg.load(str(tmp_path))
    assert s is None and "no config.json" in note
    s, note = modelcfg.load("/models/wide-llama")
    assert s is None and "not found here" in note and "--model" in note
    with pytest.raises(ConfigError, match="no such file"):
        modelcfg.load(None, config_file=str(tmp_path / "nope.json"))


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    header, offset = {}, 0
    for name, (dtype, shape_) in tensors.items():
        size = {"BF16": 2, "F8_E4M3": 1, "F32": 4}[dtype]
        n = 1
        for d in shape_:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape_, "data_offsets": [offset, offset + n * size]}
        offset += n * size
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)


def test_params_from_local_safetensors_headers(tmp_path):
    (tmp_path / "config.json").write_text((CONFIGS / "lab-tiny-llama" / "config.json").read_text())
    _write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": ("BF16", [256, 313]), "b": ("BF16", [256])})
    _write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"c": ("F8_E4M3", [64, 64])})
    s, _ = modelcfg.load(str(tmp_path))
    assert s.params == 256 * 313 + 256 + 64 * 64
    assert s.params_source == "safetensors (local files)"
    assert s.params_by_dtype == {"BF16": 256 * 313 + 256, "F8_E4M3": 4096}
    assert modelcfg.weights_bytes_from_dtypes(s.params_by_dtype) == 2 * (256 * 313 + 256) + 4096


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
        self.requests.append(f"{self.command} {self.path}")
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
    assert not any("safetensors" in r_ and "resolve" in r_ for r_ in _Hub.requests)
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
