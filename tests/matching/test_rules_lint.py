"""The rule files themselves: valid, documented, example-backed, and placed by category."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import SAMPLE_RULE
from vllm_doctor.cli import app
from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.matching.loader import RuleError, builtin_dir, load
from vllm_doctor.matching.ruledoc import check_dir, document

RULES = builtin_dir()


def test_builtin_rules_pass_the_check():
    problems, count = check_dir(RULES, checks=CHECKS)
    assert count > 40
    assert problems == []


def test_every_pattern_carries_a_real_example(rules):
    missing = [f"{r.id}[{i}]" for r in rules for i, p in enumerate(r.patterns) if not p.example]
    assert missing == []


def test_rules_live_in_the_folder_of_their_category(rules):
    for r in rules:
        folder = Path(r.path).parent.name
        assert folder == {"fact": "facts", "preflight": "preflight"}.get(r.kind, r.category), r.path


def test_rules_are_found_from_the_package():
    assert (RULES / "cache-oom").is_dir()


def test_every_rule_documents_itself(rules):
    for r in rules:
        doc = document(r, checks=CHECKS)
        assert r.title in doc and r.explanation.splitlines()[0] in doc
        for f in r.fixes:
            assert f.action in doc


def write(tmp_path: Path, name: str, text: str) -> Path:
    d = tmp_path / "rules"
    d.mkdir(exist_ok=True)
    (d / f"{name}.toml").write_text(text)
    return d


GOOD = SAMPLE_RULE


@pytest.mark.parametrize(
    ("mutation", "key"),
    [
        (('severity = "warning"', 'severity = "fatal"'), "severity"),
        (('id = "my-rule"', 'id = "other"'), "id"),
        (("(?P<n>", "((?P<n>"), "patterns[0].regex"),
        (('anchors = ["it happened"]', 'anchors = ["it"]'), "anchors"),
        (('title = "A title"', 'titel = "A title"'), "titel"),
        (('[[fixes]]\naction = "Do the thing"\nwhy = "Because."', ""), "fixes"),
        (
            ('action = "Do the thing"', 'action = "Do the thing"\nflag = "--x"\ndirection = "down"'),
            "fixes[0].direction",
        ),
        (('action = "Do the thing"', 'action = "Do the thing"\ndirection = "lower"'), "fixes[0].direction"),  # no flag
    ],
)
def test_a_bad_rule_names_the_file_and_the_key(tmp_path, mutation, key):
    text = GOOD.replace(*mutation)
    assert text != GOOD
    d = write(tmp_path, "my-rule", text)
    with pytest.raises(RuleError) as err:
        load([d], builtin=False, checks=CHECKS)
    assert err.value.key == key
    assert "my-rule.toml" in str(err.value) and "\n" not in str(err.value)


def test_example_that_does_not_match_is_caught_by_rules_check(tmp_path):
    d = write(tmp_path, "my-rule", GOOD.replace('example = "it happened 3"', 'example = "it happened x"'))
    problems, _ = check_dir(d, checks=CHECKS)
    assert len(problems) == 1 and "patterns[0].example" in problems[0]


def test_rules_cli_list_show_check(tmp_path):
    runner = CliRunner()
    listing = runner.invoke(app, ["rules"])
    assert listing.exit_code == 0
    assert "kv-cache-too-small-for-max-len" in listing.output
    show = runner.invoke(app, ["rules", "show", "attention-heads-not-divisible"])
    assert show.exit_code == 0 and "Fixes, in order" in show.output
    assert runner.invoke(app, ["rules", "show", "no-such-rule"]).exit_code == 2
    good = runner.invoke(app, ["rules", "check", str(write(tmp_path, "my-rule", GOOD))])
    assert good.exit_code == 0, good.output
    (tmp_path / "rules" / "my-rule.toml").write_text(GOOD.replace('severity = "warning"', ""))
    bad = runner.invoke(app, ["rules", "check", str(tmp_path / "rules")])
    assert bad.exit_code == 2 and "key 'severity'" in bad.output


def test_user_rules_dir_adds_a_rule(tmp_path, run):
    d = write(tmp_path, "my-rule", GOOD)
    log = tmp_path / "x.log"
    log.write_text("INFO starting\nERROR it happened 42\n")
    from vllm_doctor.pipeline import explain

    report = explain([str(log)], load([d], checks=CHECKS))
    assert report.diagnoses[0].rule == "my-rule"
    assert report.diagnoses[0].summary == "It happened: 42."


def test_every_category_is_in_the_readme_and_every_readme_category_exists(rules):
    import re

    readme = (RULES.parent / "README.md").read_text() if (RULES.parent / "README.md").exists() else ""
    if not readme:  # an installed wheel carries no README: the source checkout test covers it
        pytest.skip("README.md is not beside rules/")
    section = readme[readme.index("## Categories") : readme.index("## JSON report")]
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, re.M))
    listed |= set(re.findall(r"`(queue-[a-z-]+|priority-preemption)`", section))
    used = {r.category for r in rules if r.kind == "diagnosis"}
    assert used - listed == set(), "categories missing from the README"
    assert listed - used == set(), "README categories with no rule"


def test_every_fix_of_a_memory_category_moves_the_numbers_its_way(rules):
    """The rule of the house: a category names one cause and its fixes move the numbers the right
    way. A cache that is too small never gets a lower --gpu-memory-utilization (except to fit in
    what other processes leave, which the GPU snapshot proves: `lower_utilization`); memory taken
    beside a sized cache never gets a higher one."""
    for r in rules:
        for f in r.fixes:
            for action, _why, _value in f.variants():
                if r.category in ("cache-oom", "weights-oom"):
                    lowers = action.startswith("Lower --gpu-memory-utilization")
                    assert not lowers or "lower_utilization" in (f.when or ""), (r.id, action)
                if r.category == "warmup-oom":
                    assert not action.startswith("Raise --gpu-memory-utilization"), (r.id, action)


def test_rules_show_states_the_taxonomy_rule(rules):
    from vllm_doctor.matching.ruledoc import TAXONOMY, document

    assert TAXONOMY in document(next(r for r in rules if r.id == "cuda-oom-after-cache-sized"), checks=CHECKS)
