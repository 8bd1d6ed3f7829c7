"""modelcfg.load: a model reference or --config file to a shape with its parameter count, or one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import FIXTURES
from vllm_doctor.capacity import modelcfg
from vllm_doctor.capacity.modelcfg import ConfigError

CONFIGS = FIXTURES / "configs"


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


def test_modelcfg_keeps_the_names_its_callers_import():
    from vllm_doctor.capacity import hub, shape

    assert modelcfg.ConfigError is shape.ConfigError and modelcfg.ModelShape is shape.ModelShape
    assert modelcfg.resolve is hub.resolve


def test_capacity_imports_no_later_stage():
    """capacity/ may import data, errors, versions and serveargs beside itself; never read, matching, knowledge,
    render, serve or cli (see capacity/__init__.py)."""
    import ast

    import vllm_doctor.capacity as pkg

    allowed = (
        "vllm_doctor.capacity", "vllm_doctor.data", "vllm_doctor.errors", "vllm_doctor.versions", "vllm_doctor.serveargs",
        "vllm_doctor.atlas",
    )  # fmt: skip
    for path in Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.startswith("vllm_doctor"):
                    assert name.startswith(allowed), f"{path.name} imports {name}"


def test_a_config_already_found_is_not_looked_up_again(tmp_path):
    from vllm_doctor.capacity.hub import resolve

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text((CONFIGS / "llama-3-8b" / "config.json").read_text())
    found = resolve(str(d))
    (d / "config.json").unlink()  # a second lookup would find nothing now
    s, note = modelcfg.load(str(d), resolved=found)
    assert s is not None and s.kv_heads == 8 and note is None
    assert modelcfg.load(str(d))[0] is None
