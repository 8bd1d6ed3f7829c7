"""The atlas (issue 36): scripts/vllm_atlas.py's extractor on small sources written here (CI never
downloads a wheel), and the data it generated into src/vllm_doctor/atlas/ read back."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import textwrap

import pytest
import re2

from conftest import ROOT
from vllm_doctor import atlas

_spec = importlib.util.spec_from_file_location("vllm_atlas", ROOT / "scripts" / "vllm_atlas.py")
assert _spec and _spec.loader
va = importlib.util.module_from_spec(_spec)
sys.modules["vllm_atlas"] = va
_spec.loader.exec_module(va)


def found(source: str, path: str = "vllm/x.py") -> list[dict]:
    return va.messages(path, ast.parse(textwrap.dedent(source)))


def one(source: str) -> dict:
    got = found(source)
    assert len(got) == 1, got
    return got[0]


def rendered(template: str, value: str = "7.25") -> str:
    """The template as vLLM would print it, every placeholder a sample value."""
    return re.sub(r"\{\{|\}\}|\{[^{}]*\}", lambda m: {"{{": "{", "}}": "}"}.get(m.group(), value), template)


# ---------------------------------------------------------------- messages, each form


def test_fstring_names_a_placeholder_after_its_last_attribute_and_keeps_the_spec_out_of_it():
    t = one(
        """
        class ModelConfig:
            def verify(self, limit):
                raise ValueError(f"max_model_len {self.model_config.max_model_len} exceeds {limit:.2f} GiB")
        """
    )
    assert t["template"] == "max_model_len {max_model_len} exceeds {limit:.2f} GiB"
    assert (t["kind"], t["exc"], t["func"], t["file"]) == ("raise", "ValueError", "ModelConfig.verify", "vllm/x.py")
    assert "(?P<max_model_len>.{0,200}?)" in t["regex"] and "(?P<limit>" in t["regex"]
    assert (t["anchor"], t["anchor_len"]) == ("max_model_len", 13)


def test_percent_args_of_a_logger_call_become_placeholders_named_after_the_args():
    t = one('logger.info("Using %s backend with %.2f GiB (%d%%)", self.backend, mem / 2**30, n)')
    assert t["template"] == "Using {backend} backend with {mem:.2f} GiB ({n}%)"
    assert (t["kind"], t["level"], t["func"]) == ("log", "INFO", "<module>")


def test_a_logger_call_without_args_keeps_its_percent_signs():
    assert one('logger.warning("100%% sure")')["template"] == "100%% sure"


def test_once_and_exception_forms_log_at_the_level_they_print():
    got = found('logger.warning_once("a %s", x)\nlogger.info_once("b")\nlogger.exception("c")\nlogger.warn("d")')
    assert [(t["template"], t["level"]) for t in got] == [
        ("a {x}", "WARNING"),
        ("b", "INFO"),
        ("c", "ERROR"),
        ("d", "WARNING"),
    ]


def test_str_format_positional_indexed_and_keyword_fields():
    t = one('raise RuntimeError("got {} of {total}, {0!r}, {:>5}".format(n, m, total=t))')
    assert t["template"] == "got {n} of {total}, {n}, {m:>5}"


def test_percent_operator_with_a_tuple_a_single_value_and_a_dict():
    assert one('raise ValueError("bad %s in %r" % (x, cfg.name))')["template"] == "bad {x} in {name}"
    assert one('raise ValueError("bad %s" % x)')["template"] == "bad {x}"
    assert one('raise ValueError("%(a)s then %(b)d" % {"a": 1, "b": 2})')["template"] == "{a} then {b}"


def test_message_built_in_a_variable_then_raised_from_an_exception():
    t = one(
        """
        class Worker:
            def check(self, x):
                msg = f"free memory {x} GiB"
                msg += " is too low."
                if x:
                    msg += " Try lowering --max-model-len."
                try:
                    pass
                except Exception as e:
                    raise ValueError(msg) from e
        """
    )
    assert t["template"] == "free memory {x} GiB is too low. Try lowering --max-model-len."
    assert t["func"] == "Worker.check"


def test_the_last_assignment_before_the_raise_is_the_message():
    t = one('def f():\n    msg = "first"\n    msg = "second"\n    raise ValueError(msg)\n    msg = "third"\n')
    assert t["template"] == "second"


def test_concatenation_of_literals_calls_and_names():
    t = one('raise ValueError("x=" + str(self.x) + ". Try " + hint + f" or {len(items)} items")')
    assert t["template"] == "x={x}. Try {hint} or {len_items} items"


def test_a_module_level_constant_message():
    t = one('_ERR = "not supported on %s"\ndef f(p):\n    raise NotImplementedError(_ERR % p)\n')
    assert (t["template"], t["func"]) == ("not supported on {p}", "f")


def test_messages_without_literal_text_are_left_out():
    assert found("raise ValueError(str(e))\nraise ValueError(msg)\nlogger.info('%s', x)\nraise KeyError") == []
    assert found("other.info('not a logger')\nlogger.log(10, 'level as an arg')") == []


def test_literal_braces_are_doubled_in_the_template_and_matched_literally():
    t = one('raise ValueError(f"expected {{a: 1}}, got {value}")')
    assert t["template"] == "expected {{a: 1}}, got {value}"
    assert re.search(t["regex"], "ValueError: expected {a: 1}, got {b: 2}").group("value") == "{b: 2}"


def test_anchor_is_the_longest_literal_run_within_one_line():
    t = one('raise ValueError(f"short {x} a much longer literal run\\nand the next line, longer still: {y}")')
    assert t["anchor"] == "and the next line, longer still:"
    assert t["anchor_len"] == len(t["anchor"])


SNIPPETS = [
    'raise ValueError(f"The model\'s max seq len ({max_model_len}) is larger than ({num_tokens}). Try {x:.2f}.")',
    'logger.info("# GPU blocks: %d, # CPU blocks: %d", num_gpu_blocks, num_cpu_blocks)',
    'raise RuntimeError("Ratio [%s] ^ (%s)? * + $ | %s" % (a, a, a))',
    'logger.warning("CUDA graph {} of {} took {:.2f} s".format(i, i, t))',
]


@pytest.mark.parametrize("source", SNIPPETS)
def test_a_templates_regex_matches_it_rendered_in_python_and_re2(source):
    t = one(source)
    line = "ERROR 01-01 00:00:00 [x.py:1] " + rendered(t["template"])
    m = re.search(t["regex"], line)
    assert m and all(v is not None for v in m.groupdict().values()), (t["regex"], line)
    assert re2.search(t["regex"], line)
    assert not re.search(r"\\\d|\(\?[=!<]", t["regex"])  # no backreference, no lookaround


def test_group_names_are_unique_even_when_a_name_repeats():
    t = one('raise RuntimeError(f"SM{cap[0]}{cap[1]} and {cap_2}")')
    assert re.compile(t["regex"]).groupindex.keys() == {"cap", "cap_2", "cap_2_2"}


# ---------------------------------------------------------------- defaults

NEW_CONFIG = """
from typing import ClassVar
from pydantic import Field
from dataclasses import field

_MODULE_DEFAULT = 8192

class CacheConfig:
    DEFAULT_BLOCK_SIZE: ClassVar[int] = 64
    DEFAULT_GPU_MEMORY_UTILIZATION: ClassVar[float] = 0.92
    block_size: int = Field(default=None, gt=0)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    cache_dtype: str = "auto"
    swap_space: float = field(default=4)
    enable_prefix_caching: bool = True
    enable_extensible_kv_cache: bool = Field(default=None)

class SchedulerConfig:
    DEFAULT_MAX_NUM_SEQS: ClassVar[int] = 128
    max_num_seqs: int = Field(default=DEFAULT_MAX_NUM_SEQS, ge=1)
    max_num_batched_tokens: int = _MODULE_DEFAULT
    enable_chunked_prefill: bool = True
    extra: list[int] = Field(default_factory=list)
"""

NEW_ENGINE = """
class EngineArgs:
    gpu_memory_utilization: float | None = CacheConfig.gpu_memory_utilization
    kv_cache_dtype: str = CacheConfig.cache_dtype
    max_num_seqs: int | None = None
    swap_space: float = get_field(CacheConfig, "swap_space")
    max_model_len: int | None = ModelConfig.max_model_len
    tensor_parallel_size: int = 1
"""

OLD_CONFIG = """
class CacheConfig:
    def __init__(self, block_size: int, gpu_memory_utilization: float, swap_space: int,
                 cache_dtype: str, enable_prefix_caching: bool = False) -> None:
        self.block_size = block_size

class ModelConfig:
    def __init__(self, model, *, max_model_len=None, enforce_eager: bool = False):
        pass
"""

OLD_ENGINE = """
@dataclass
class EngineArgs:
    block_size: int = 16
    gpu_memory_utilization: float = 0.90
    max_num_seqs: int = 256
    max_model_len: Optional[int] = None
    extra: float = 2 ** 30 * factor
"""


def read(config: str, engine: str, config_path: str = "vllm/config/cache.py") -> dict:
    trees = {config_path: ast.parse(config), "vllm/engine/arg_utils.py": ast.parse(engine)}
    return va.config_defaults(trees)


def test_new_style_field_defaults_constants_and_references():
    d = read(NEW_CONFIG, NEW_ENGINE)
    assert d["gpu_memory_utilization"] == {
        "value": None,
        "at": "vllm/config/cache.py:CacheConfig.gpu_memory_utilization",
    }
    assert d["DEFAULT_GPU_MEMORY_UTILIZATION"]["value"] == 0.92
    assert d["DEFAULT_BLOCK_SIZE"] == {"value": 64, "at": "vllm/config/cache.py:CacheConfig.DEFAULT_BLOCK_SIZE"}
    assert d["block_size"]["value"] is None and d["swap_space"]["value"] == 4
    assert d["kv_cache_dtype"] == {"value": "auto", "at": "vllm/config/cache.py:CacheConfig.cache_dtype"}
    assert d["max_num_seqs"]["value"] == 128  # Field(default=DEFAULT_MAX_NUM_SEQS): the class constant
    assert d["max_num_batched_tokens"]["value"] == 8192  # a module constant
    assert d["enable_prefix_caching"]["value"] is True and d["enable_extensible_kv_cache"]["value"] is None
    # EngineArgs' own values: a `CacheConfig.x` reference and get_field() followed to the class's default
    assert d["EngineArgs.gpu_memory_utilization"] == {
        "value": None,
        "at": "vllm/engine/arg_utils.py:EngineArgs.gpu_memory_utilization",
        "via": "vllm/config/cache.py:CacheConfig.gpu_memory_utilization",
    }
    assert d["EngineArgs.kv_cache_dtype"]["value"] == "auto" and d["EngineArgs.swap_space"]["value"] == 4
    assert d["EngineArgs.max_num_seqs"]["value"] is None
    # a class this source lacks (ModelConfig): the reference stays an expression, EngineArgs' value stands
    assert d["max_model_len"]["value"] == {"expr": "ModelConfig.max_model_len"}
    assert d["tensor_parallel_size"]["at"] == "vllm/engine/arg_utils.py:EngineArgs.tensor_parallel_size"


def test_old_style_init_defaults_and_engine_args_where_the_config_has_none():
    d = read(OLD_CONFIG, OLD_ENGINE, config_path="vllm/config.py")
    assert d["gpu_memory_utilization"] == {
        "value": 0.9,
        "at": "vllm/engine/arg_utils.py:EngineArgs.gpu_memory_utilization",
    }
    assert d["enable_prefix_caching"] == {
        "value": False,
        "at": "vllm/config.py:CacheConfig.__init__.enable_prefix_caching",
    }
    assert d["enforce_eager"]["value"] is False and d["max_model_len"]["value"] is None
    assert d["block_size"]["value"] == 16 and d["max_num_seqs"]["value"] == 256
    assert "enable_extensible_kv_cache" not in d


def test_a_non_literal_default_is_its_source():
    resolver = va.Resolver({})
    info = va.class_info("vllm/e.py", ast.parse(OLD_ENGINE).body[0], ast.parse(OLD_ENGINE))
    assert resolver.value(info.fields["extra"][0], info) == ({"expr": "2 ** 30 * factor"}, None)
    assert resolver.value(ast.parse("Field(default_factory=list)", mode="eval").body, info)[0] == {"expr": "list()"}


# ---------------------------------------------------------------- merging, writing, diffing


def release(version: str, *templates: str, gmu: float = 0.9) -> dict:
    recs = [
        {**va.render([t]), "kind": "log", "level": "INFO", "file": f"vllm/{version}.py", "func": "f"} for t in templates
    ]
    return {"version": version, "templates": recs, "defaults": {"gpu_memory_utilization": {"value": gmu, "at": "x"}}}


def test_merge_spans_releases_in_numeric_order_and_a_later_merge_adds_one(tmp_path):
    msgs, defs = va.load(tmp_path)
    read = [release("0.10.0", "a", "b"), release("0.9.0", "a"), release("0.11.0", "a", "c", gmu=0.92)]
    msgs, defs = va.merge(msgs, read), va.merge_defaults(defs, read)
    assert msgs["releases"] == ["0.9.0", "0.10.0", "0.11.0"] and list(defs["releases"]) == msgs["releases"]
    spans = {t["template"]: t["spans"] for t in msgs["templates"]}
    assert spans == {"a": [[0, 2]], "b": [[1, 1]], "c": [[2, 2]]}
    assert {t["template"]: t["file"] for t in msgs["templates"]}["a"] == "vllm/0.11.0.py"  # the latest's
    va.write(tmp_path, msgs, defs)
    first = (tmp_path / "messages.json.gz").read_bytes(), (tmp_path / "defaults.json").read_text()
    va.write(tmp_path, *va.load(tmp_path))
    assert ((tmp_path / "messages.json.gz").read_bytes(), (tmp_path / "defaults.json").read_text()) == first

    more = [release("0.10.1", "b", "d"), release("0.10.0", "a")]  # one new, one read again
    msgs = va.merge(va.load(tmp_path)[0], more)
    spans = {t["template"]: t["spans"] for t in msgs["templates"]}
    assert msgs["releases"] == ["0.9.0", "0.10.0", "0.10.1", "0.11.0"]
    assert spans == {"a": [[0, 1], [3, 3]], "b": [[2, 2]], "c": [[3, 3]], "d": [[2, 2]]}


def test_diff_lists_removed_new_changed_and_defaults():
    read = [release("0.1.0", "gone", "old {x} text"), release("0.2.0", "new {x} text", "fresh", gmu=0.92)]
    for r in read:
        for t in r["templates"]:
            t["file"] = "vllm/x.py"
            t["func"] = "g" if t["template"] in ("gone", "fresh") else "f"
    msgs, defs = va.merge(va.load(ROOT / "nowhere")[0], read), va.merge_defaults({"releases": {}}, read)
    defs["releases"]["0.2.0"]["enable_extensible_kv_cache"] = {"value": None, "at": "y"}
    text = "\n".join(va.diff(msgs, defs, "0.1.0", "0.2.0"))
    assert 'enable_extensible_kv_cache: "(absent)" -> null' in text
    assert "changed (same file and function): 2" in text and "'old {{x}} text'" in text
    assert "gpu_memory_utilization: 0.9 -> 0.92" in text


def test_release_order_is_numeric_with_post_releases_after():
    versions = ["0.10.2", "0.6.6.post1", "0.6.6", "0.9.2", "0.34.0"]
    assert sorted(versions, key=va.vkey) == ["0.6.6", "0.6.6.post1", "0.9.2", "0.10.2", "0.34.0"]
    assert va.spans([0, 1, 2, 5, 7, 8]) == [[0, 2], [5, 5], [7, 8]]


# ---------------------------------------------------------------- the shipped data


def test_the_data_releases_are_sorted_and_every_span_is_inside_them():
    names = atlas.message_releases()
    assert names == sorted(names, key=va.vkey) == atlas.releases()
    assert len(set(names)) == len(names) >= 31
    for t in atlas.templates():
        assert t["spans"] and all(0 <= i <= j < len(names) for i, j in t["spans"]), t
        assert t["kind"] in ("raise", "log") and ("exc" in t) == (t["kind"] == "raise")


def test_the_data_regexes_compile_in_re2_and_match_their_template():
    opts = re2.Options()
    opts.max_mem = 64 << 20
    for t in atlas.templates()[::25]:
        assert re2.compile(t["regex"], opts).search(rendered(t["template"], "x")), t["template"]
    assert all(t["anchor"] in t["template"].replace("{{", "{").replace("}}", "}") for t in atlas.templates())


def test_gpu_memory_utilization_defaults_by_release():
    assert atlas.defaults("0.34.0")["gpu_memory_utilization"] is None
    assert atlas.defaults("0.34.0")["DEFAULT_GPU_MEMORY_UTILIZATION"] == 0.92
    assert atlas.defaults("0.32.0")["gpu_memory_utilization"] == 0.92
    assert atlas.defaults("0.4.3")["gpu_memory_utilization"] == 0.9


def test_defaults_read_the_nearest_release_at_or_below():
    assert atlas.defaults("0.32.1") == atlas.defaults("0.32.0")
    assert atlas.defaults("0.1.0") == atlas.defaults(atlas.releases()[0])
    assert atlas.defaults(None) == atlas.defaults(atlas.releases()[-1]) == atlas.defaults("99.0")
    with pytest.raises(ValueError):
        atlas.defaults("latest")


def test_importing_the_atlas_reads_nothing():
    code = "import sys, vllm_doctor.atlas as a; print('gzip' in sys.modules, a._messages_data.cache_info().currsize)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "0"]
