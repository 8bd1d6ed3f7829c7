from __future__ import annotations

from pathlib import Path

import pytest

from vllm_doctor.explain import explain, load_rules

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
LAB = FIXTURES / "lab"

# a small valid rule file, for tests that load user rules or break one on purpose
SAMPLE_RULE = '''
id = "my-rule"
category = "my-category"
title = "A title"
severity = "warning"
summary = ["It happened: {n}."]
explanation = "Why."
anchors = ["it happened"]
[[patterns]]
regex = \'\'\'it happened (?P<n>\\d+)\'\'\'
example = "it happened 3"
[[fixes]]
action = "Do the thing"
why = "Because."
'''


@pytest.fixture(scope="session")
def rules():
    return load_rules()


@pytest.fixture(scope="session")
def run(rules):
    """Explain paths with the built-in rules (loaded once)."""

    def _run(*paths, options=None):
        return explain([str(p) for p in paths], rules, options)

    return _run
