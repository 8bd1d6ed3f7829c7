"""Issue 36: the defaults each release says (the atlas, read from the wheels) drive the capacity
model, check, plan and the fix checks; no release is assumed to default to 0.9, and no fix moves a
value below its release's default."""

from __future__ import annotations

import pytest

from conftest import FIXTURES, LAB
from vllm_doctor import atlas
from vllm_doctor.capacity import arithmetic as cap
from vllm_doctor.capacity import defaults, start
from vllm_doctor.capacity.shape import ModelShape
from vllm_doctor.knowledge.fixcheck import refuse
from vllm_doctor.versions import version_tuple

UTIL = "--gpu-memory-utilization"
SHAPE = {"name": "m", "hidden_size": 4096, "layers": 32, "attention_heads": 32, "kv_heads": 8, "head_dim": 128,
         "max_position_embeddings": 8192, "dtype": "bfloat16"}  # fmt: skip


@pytest.mark.parametrize("version", atlas.releases())
def test_each_release_s_utilization_is_what_its_config_class_says(version):
    said = atlas.defaults(version)
    value = said.get("gpu_memory_utilization")
    if isinstance(value, float):
        assert defaults.utilization(version) == value == defaults.utilization(version, "cpu")
    else:  # 0.34: None, resolved by CacheConfig.resolved_gpu_memory_utilization
        assert value is None and said["DEFAULT_GPU_MEMORY_UTILIZATION"] == 0.92
        assert defaults.utilization(version, "cuda") == 1.0 and defaults.utilization(version, "rocm") == 1.0
        assert defaults.utilization(version, "cpu") == 0.92  # no extensible cache there
        assert defaults.utilization(version, "cuda", extensible=False) == 0.92


def test_the_utilization_by_release_family():
    """0.9 in the early releases, 0.92 later, 1.0 on 0.34's GPUs: never 0.9 for all."""
    assert defaults.utilization("0.4.3") == 0.9
    assert defaults.utilization("0.32.0") == defaults.utilization("0.33.0") == 0.92
    assert defaults.utilization("0.34.0") == 1.0
    assert defaults.utilization(None) == defaults.utilization(defaults.DEFAULT_VERSION)
    assert defaults.utilization("0.32.1") == defaults.utilization("0.32.0")  # a patch: its minor's
    assert defaults.utilization("main") == defaults.utilization("\udfff") == defaults.utilization(None)  # no version


@pytest.mark.parametrize("version", atlas.releases())
def test_the_block_size_the_capacity_model_assumes_is_the_release_s(version):
    """The release's number (its config's block_size, else CacheConfig.DEFAULT_BLOCK_SIZE), 16 where
    neither names one; start.py lays the cache out with it."""
    said = atlas.defaults(version)
    named = said.get("block_size") if isinstance(said.get("block_size"), int) else said.get("DEFAULT_BLOCK_SIZE")
    assert defaults.block_size(version) == (named or 16)
    q = start.StartQuery(shape=ModelShape(**SHAPE), vllm_version=version)
    assert start.layout_of(q).block_size == defaults.block_size(version)


def test_the_block_size_by_release_family():
    assert defaults.block_size("0.4.3") == defaults.block_size("0.32.0") == 16
    assert defaults.block_size("0.34.0") == 64  # CacheConfig.DEFAULT_BLOCK_SIZE


@pytest.mark.parametrize("version", atlas.releases())
def test_a_raise_never_lands_below_the_release_s_default(version):
    target = defaults.raise_target(version)
    assert cap.SAFE_UTILIZATION >= target >= min(defaults.utilization(version), cap.SAFE_UTILIZATION)


@pytest.mark.parametrize(
    ("version", "value", "refused"),
    [("0.34.0", "0.95", True), ("0.32.0", "0.9", True), ("0.32.0", "0.95", False), ("0.4.3", "0.92", False)],
)
def test_the_fix_check_reads_an_unset_utilization_as_the_release_s_default(version, value, refused):
    why = refuse(UTIL, "raise", value, {"vllm_version": version})
    assert (why is not None) is refused, why
    if refused:
        assert f"default {UTIL}" in why


def _logs():
    return sorted([*FIXTURES.glob("logs/*/*.log"), *LAB.glob("*.log")])


def test_no_shown_fix_moves_a_value_below_its_release_s_default(run):
    """Over every fixture and lab log: a fix that raises the utilization gives a value above the
    current one, which is the release's default where the command left it out (0.34's 1.0 too)."""
    checked = 0
    for log in _logs():
        report = run(log)
        version = report.facts.get("vllm_version")
        device = str(report.facts.get("device") or "").lower()
        for d in report.diagnoses:
            for fix in d.fixes:
                if fix.flag != UTIL or fix.direction != "raise" or not fix.value:
                    continue
                try:
                    value = float(fix.value)
                except ValueError:
                    continue
                given = report.facts.get("gpu_memory_utilization")  # else the release's default holds
                now = float(given) if given is not None else defaults.utilization(version, device or "cuda")
                assert value > now, (log.name, fix.action)
                checked += 1
    assert checked  # the fixtures do raise the utilization somewhere


def test_releases_are_ordered_and_cover_0_4_to_0_34():
    found = atlas.releases()
    assert found == sorted(found, key=version_tuple)
    assert version_tuple(found[0]) <= (0, 4, 99) and version_tuple(found[-1]) >= (0, 34)


def test_the_capacity_modules_import_no_circle():
    """Issue 36: arithmetic -> kvcache -> shape -> weights -> arithmetic was a circle; the dtype
    sizes and the checkpoint's tally are leaves (capacity/dtypes.py, tally.py). The module-level
    imports of capacity/, those for types only (TYPE_CHECKING) too, form no cycle."""
    import ast
    from pathlib import Path

    import vllm_doctor.capacity as pkg

    root = Path(pkg.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.glob("*.py"):
        deps = graph.setdefault(path.stem, set())
        top = ast.parse(path.read_text()).body  # module level, and TYPE_CHECKING's `if`
        for node in [*top, *(n for t in top if isinstance(t, ast.If) for n in t.body)]:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm_doctor.capacity"):
                rest = node.module.removeprefix("vllm_doctor.capacity").lstrip(".")
                deps.update([rest] if rest else [a.name for a in node.names])
    seen: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        assert seen.get(name) != 1, " -> ".join([*trail, name])
        if seen.get(name) == 2:
            return
        seen[name] = 1
        for dep in graph.get(name, ()):
            visit(dep, [*trail, name])
        seen[name] = 2

    for name in graph:
        visit(name, [])
    assert "dtypes" in graph and not graph["dtypes"]
