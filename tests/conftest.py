from __future__ import annotations

from pathlib import Path

import pytest

from vllm_doctor.explain import explain, load_rules

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
LAB = FIXTURES / "lab"


@pytest.fixture(scope="session")
def rules():
    return load_rules()


@pytest.fixture(scope="session")
def run(rules):
    """Explain paths with the built-in rules (loaded once)."""

    def _run(*paths, options=None):
        return explain([str(p) for p in paths], rules, options)

    return _run
