"""`rules check` holds every name a rule uses against the contract, and lists every problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import SAMPLE_RULE
from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.matching.loader import RuleError, load
from vllm_doctor.matching.ruledoc import check_dir, document


def write(tmp_path: Path, text: str) -> Path:
    d = tmp_path / "rules"
    d.mkdir(exist_ok=True)
    (d / "my-rule.toml").write_text(text)
    return d


def problems(tmp_path: Path, text: str) -> list[str]:
    found, count = check_dir(write(tmp_path, text), checks=CHECKS)
    assert count == 1
    return found


WITH_CHECK = SAMPLE_RULE.replace('anchors = ["it happened"]', 'anchors = ["it happened"]\nchecks = ["tp_sizes"]')


@pytest.mark.parametrize(
    ("mutation", "key", "words"),
    [
        (('action = "Do the thing"', 'action = "Use --tensor-parallel-size {tp_belwo}"'), "fixes[0].action",
         ["{tp_belwo}", "did you mean 'tp_below'"]),
        (('why = "Because."', 'why = "Because {stats.waiting_mx}."'), "fixes[0].why", ["{stats.waiting_mx}"]),
        (('action = "Do the thing"', 'action = "Do the thing"\nvalue = "{tp_abov}"'), "fixes[0].value", ["{tp_abov}"]),
        (('summary = ["It happened: {n}."]', 'summary = ["It happened: {m}."]'), "summary", ["{m}"]),
        (('checks = ["tp_sizes"]', 'checks = ["tp_sizes"]\nwhen = "tp_belwo > 1"'), "when", ["'tp_belwo'"]),
        (('action = "Do the thing"', 'action = "Do the thing"\nwhen = "nope"'), "fixes[0].when", ["'nope'"]),
        (('checks = ["tp_sizes"]', 'checks = ["tp_sizes"]\nfacts = { n = "max_model_lne" }'), "facts.n",
         ["'max_model_lne' is not a known fact name"]),
        (('checks = ["tp_sizes"]', 'checks = ["tp_sizes"]\nphase = "weights_loadng"'), "phase",
         ["'weights_loadng' is not a phase", "did you mean 'weights_loading'"]),
        (('example = "it happened 3"', 'example = "it happened 3"\ncounter_example = ["it did not happen", "it happened 4"]'),
         "patterns[0].counter_example[1]", ["matches it"]),
    ],
)  # fmt: skip
def test_rules_check_rejects_what_would_silently_drop_a_summary_or_a_fix(tmp_path, mutation, key, words):
    text = WITH_CHECK.replace(*mutation)
    assert text != WITH_CHECK
    [line] = problems(tmp_path, text)
    assert f"my-rule.toml: key '{key}': " in line and "\n" not in line
    for w in words:
        assert w in line


def test_names_the_rules_checks_return_groups_facts_and_stats_are_accepted(tmp_path):
    text = WITH_CHECK.replace('why = "Because."', 'why = "{n} {valid_tp_sizes} {max_model_len} {stats.waiting_max}."')
    assert problems(tmp_path, text) == []
    # ... but a check's returns only for a rule that runs the check
    without = text.replace('checks = ["tp_sizes"]\n', "")
    [line] = problems(tmp_path, without)
    assert "{valid_tp_sizes}" in line


def test_every_problem_of_a_file_is_reported_one_line_each(tmp_path):
    text = (
        WITH_CHECK.replace('summary = ["It happened: {n}."]', 'summary = ["It happened: {nn}."]')
        .replace('severity = "warning"', 'severity = "fatal"\nphase = "sampler_warmup"')
        .replace('action = "Do the thing"', 'action = ["Do {tp_belwo}", "Do it"]\nwhen = "x"')
        .replace('example = "it happened 3"', 'example = "it happened 3"\ncounter_example = "it happened 9"')
    )
    found = problems(tmp_path, text)
    keys = [line.split(": key ")[1].split(":")[0] for line in found]
    assert keys == ["'severity'", "'phase'", "'summary'", "'fixes[0].action'", "'fixes[0].when'",
                    "'patterns[0].counter_example[0]'"]  # fmt: skip
    assert all(line.count("\n") == 0 and "my-rule.toml" in line for line in found)
    # loading refuses the file with the first problem, and keeps them all
    with pytest.raises(RuleError) as err:
        load([tmp_path / "rules"], builtin=False, checks=CHECKS)
    assert len(err.value.problems) == 5 and str(err.value) == found[0]  # counter-examples: rules check only


def test_fix_lists_must_not_outnumber_the_actions(tmp_path):
    [line] = problems(tmp_path, SAMPLE_RULE.replace('why = "Because."', 'why = ["Because.", "Else."]'))
    assert "key 'fixes[0].why'" in line and "more fallbacks than action" in line


def test_rules_show_lists_the_numbers_a_rule_can_use(rules):
    doc = document(next(r for r in rules if r.id == "attention-heads-not-divisible"), checks=CHECKS)
    section = doc[doc.index("Numbers it can use") : doc.index("Fixes, in order")]
    assert "groups: heads (-> num_attention_heads), tp (-> tensor_parallel_size)" in section
    assert "tp_sizes returns: " in section and "tp_below" in section and "valid_tp_sizes" in section
    assert "reads this rule's groups: heads, tp" in section
    assert "stats.<aggregate>: " in section and "waiting_max" in section and "max_model_len" in section


def test_a_survived_note_is_held_to_the_contract_and_only_for_a_blocker(tmp_path):
    note = 'summary = ["It happened: {n}."]\nsurvived = ["It happened ({m}) and the server served."]'
    text = WITH_CHECK.replace('summary = ["It happened: {n}."]', note)
    assert sorted(line.split(": key ")[1].split(":")[0] for line in problems(tmp_path, text)) == [
        "'survived'",  # for a warning: it is never demoted
        "'survived'",  # {m} is no name the rule knows
    ]
    blocker = text.replace('severity = "warning"', 'severity = "blocker"').replace("({m})", "({n})")
    assert problems(tmp_path, blocker) == []
