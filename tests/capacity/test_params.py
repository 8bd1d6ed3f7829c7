"""The parameter count: estimated from the shape, or read from the safetensors headers."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from conftest import FIXTURES
from vllm_doctor.capacity import modelcfg
from vllm_doctor.capacity.params import estimate_params, weights_bytes_from_dtypes
from vllm_doctor.capacity.shape import shape_from_config

CONFIGS = FIXTURES / "configs"


def shape(name: str, **kw):
    return shape_from_config(json.loads((CONFIGS / name / "config.json").read_text()), name=name, **kw)


# published parameter counts; the estimate from the shape must land within 2%
PUBLISHED = {
    "llama-2-7b": 6.74e9, "llama-3-8b": 8.03e9, "llama-3-70b": 70.6e9, "mistral-7b-v0.1": 7.24e9,
    "qwen2.5-7b": 7.62e9, "gemma-7b": 8.54e9, "mixtral-8x7b": 46.7e9, "deepseek-v3": 671e9, "deepseek-v2-lite": 15.7e9,
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_estimate(name):
    assert estimate_params(shape(name)) == pytest.approx(PUBLISHED[name], rel=0.02)


def test_gpt_oss_120b_estimate_against_its_model_card():
    """OpenAI's gpt-oss-120b model card (Aug 2025, table 1) gives 116.83B parameters in total: MLP
    114.71B, attention 0.96B, embedding and unembedding 1.16B. The estimate from the shape (116.79B,
    what `plan` shows as "estimated from the shape") leaves out the biases, and they are exactly the
    rest: each layer's 128 experts' gate_up (5,760) and down (2,880) biases, the q/k/v/o biases
    (4,096 + 512 + 512 + 2,880), the 64 attention sinks and the router's 128 biases."""
    estimate = estimate_params(shape("gpt-oss-120b"))
    biases = 36 * (128 * (5_760 + 2_880) + (4_096 + 512 + 512 + 2_880) + 64 + 128)
    assert estimate + biases == 116_829_156_672  # every tensor of the architecture: the card's 116.83B
    assert round(estimate / 1e9, 2) == 116.79 and estimate == pytest.approx(116.83e9, rel=0.001)


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
    assert weights_bytes_from_dtypes(s.params_by_dtype) == 2 * (256 * 313 + 256) + 4096
