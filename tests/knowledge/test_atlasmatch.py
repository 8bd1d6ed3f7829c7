"""Issue 36: no vLLM error is unrecognised. A failure no hand rule names is named by vLLM's own
source (the atlas): its message, raise site, area, releases and the message's own advice; a
configuration check is config-validation, anything else vllm-check. A template with too little
literal text is never matched alone, and a named cause always leads."""

from __future__ import annotations

import pytest

from vllm_doctor import atlas
from vllm_doctor.knowledge.atlasmatch import CUT_AT, name, told_apart, told_apart_typed
from vllm_doctor.knowledge.coverage import rendered

NEWEST = atlas.message_releases()[-1]
NAMED = (  # the startup paths every raise of which the test renders
    "vllm/config",
    "vllm/engine/arg_utils",
    "vllm/platforms",
    "vllm/v1/core/kv_cache",
    "vllm/v1/worker/gpu_worker",
)
WRAPPERS = {"engine-startup-failed", "unrecognised-failure"}


def startup_templates() -> list[dict]:
    last = len(atlas.message_releases()) - 1
    return [
        t
        for t in atlas.templates()
        if t["kind"] == "raise" and t["file"].startswith(NAMED) and any(b == last for _, b in t["spans"])
    ]


def test_a_message_is_named_with_its_site_area_releases_and_advice():
    named = name(
        "ValueError",
        "'tensor_parallel_size' is not a valid argument in the speculative_config. Please pass "
        "'draft_tensor_parallel_size' instead.",
        NEWEST,
    )
    assert named is not None and named.site == "vllm/config/speculative.py:SpeculativeConfig._verify_args"
    assert named.area == "config validation" and named.releases.endswith(NEWEST)
    assert named.advice == "Please pass 'draft_tensor_parallel_size' instead."


def test_the_end_quotes_a_text_fact_lost_do_not_hide_the_message():
    said = (
        "tensor_parallel_size' is not a valid argument in the speculative_config. Please pass "
        "'draft_tensor_parallel_size' instead."
    )
    assert name("ValueError", said, NEWEST) is not None


def test_too_little_literal_text_is_never_named_alone():
    assert name("ValueError", "Invalid 7: 7", NEWEST) is None
    assert name("RuntimeError", "something no vLLM release says in any of its messages, anywhere", NEWEST) is None


def test_a_terse_message_is_named_only_whole_and_with_its_exception_type():
    """`f"{name} must be positive"` and "Unsupported OS" say too little to be named on any line, but
    a traceback's last line `ValueError: max_loras must be positive` is that template, whole."""
    named = name("ValueError", "max_loras must be positive", NEWEST)
    assert named is not None and named.template == "{name} must be positive"
    assert name("NotImplementedError", "Unsupported OS", NEWEST).template == "Unsupported OS"
    assert name("RuntimeError", "max_loras must be positive", NEWEST) is None  # another type
    assert name("ValueError", "the budget must be positive or the run stops", NEWEST) is None  # not whole
    assert name(None, "Unsupported OS", NEWEST) is None


def test_a_message_cut_at_400_characters_is_named_by_a_long_literal_run():
    t = next(t for t in startup_templates() if len(t["template"]) > 600 and t["anchor_len"] >= 40)
    text = rendered(t["template"])
    start = max(0, text.index(t["anchor"].strip("'\"")) - 10)
    cut = text[start : start + CUT_AT]
    assert t["anchor"].strip("'\"") in cut
    named = name(t.get("exc"), cut, NEWEST)
    assert named is not None and named.site == f"{t['file']}:{t['func']}"


def test_every_startup_message_of_the_newest_release_is_named(run, tmp_path):
    """Every raise of the newest release's startup paths (config, engine arguments, platforms, KV
    cache planning, the GPU worker), rendered with sample values at the end of an engine traceback:
    a hand rule or the atlas names it; none ends as the engine wrapper or the unrecognised failure
    (a template with too little literal text to be told apart even with its type is left out)."""
    log, missed, named = tmp_path / "server.log", [], 0
    for t in startup_templates():
        if not (told_apart(t) or told_apart_typed(t)) or "\n" in t["template"]:  # (one line)
            continue
        exc = t.get("exc") or "ValueError"  # (a terse template is named with its own type)
        log.write_text(
            f"(APIServer pid=1) INFO 12-01 10:00:00 [api_server.py:1351] vLLM API server version {NEWEST}\n"
            "(EngineCore pid=60) ERROR 12-01 10:00:05 [core.py:1510] EngineCore failed to start.\n"
            "(EngineCore pid=60) ERROR 12-01 10:00:05 [core.py:1510] Traceback (most recent call last):\n"
            f'(EngineCore pid=60) ERROR 12-01 10:00:05 [core.py:1510]   File "/x/{t["file"]}", line 100, in f\n'
            f"(EngineCore pid=60) ERROR 12-01 10:00:05 [core.py:1510] {exc}: {rendered(t['template'])}\n"
        )
        top = next((d for d in run(log).diagnoses if d.severity != "info"), None)
        named += 1
        if top is None or top.category in WRAPPERS:
            missed.append(t["template"][:100])
    assert named > 400 and missed == [], missed[:10]


@pytest.mark.parametrize("template", ["{x}", "Invalid {a}: {b}"])
def test_the_templates_kept_for_coverage_are_in_the_atlas_but_not_candidates(template):
    from vllm_doctor.knowledge.atlasmatch import _candidates

    assert not any(t["template"] == template for t in _candidates())


def test_rules_coverage_counts_every_startup_site_once(rules):
    """`vllm-doctor rules coverage --vllm 0.34.0`: per area the sites, those a hand rule names, those
    the atlas names alone and those neither can; the table's last row is all of them."""
    from vllm_doctor.knowledge.coverage import coverage, lines

    release, areas = coverage(rules, "0.34.1")  # a patch reads its minor's release
    assert release == "0.34.0" and len(areas) >= 6
    for a in areas:
        assert a.sites == a.by_rules + a.by_atlas + len(a.neither) and a.sites > 0
    config = next(a for a in areas if a.name == "config validation")
    assert config.by_rules >= 10 and config.by_atlas > 250  # hand rules name the ones where arithmetic matters
    table = lines(release, areas)
    assert table[0].startswith("vLLM 0.34.0") and table[2 + len(areas) + 1].startswith("all startup areas")
    older, _ = coverage(rules, "0.20.0")
    assert older == "0.19.1"  # the newest release read at or below it


def test_rules_coverage_on_the_command_line():
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "vllm_doctor", "rules", "coverage", "--vllm", "0.34.0"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0 and "config validation" in p.stdout and "all startup areas" in p.stdout
