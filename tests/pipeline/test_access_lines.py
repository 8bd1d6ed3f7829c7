"""The healthy all-200 access fixture is quiet because every form is counted as a 200, not because
a form is missed: each API line turned into a 500 makes request-errors fire over all five."""

from __future__ import annotations

import pytest

from conftest import FIXTURES
from vllm_doctor.render.json import to_dict

HEALTHY = FIXTURES / "logs" / "healthy" / "0.10.1_access-lines-all-200-every-form.log"
LINES = HEALTHY.read_text().splitlines()
API = [i for i, line in enumerate(LINES) if '" 200' in line and "/metrics" not in line]


def test_every_form_is_an_api_line():
    assert len(API) == 5  # uvicorn, nginx, gunicorn, JSON record, the demo server's /generate


@pytest.mark.parametrize("index", API)
def test_one_500_in_any_form_is_counted(index, run, tmp_path):
    lines = list(LINES)
    lines[index] = lines[index].replace('" 200', '" 500', 1)
    log = tmp_path / "one-500.log"
    log.write_text("\n".join(lines) + "\n")
    report = to_dict(run(log))
    errors = next(d for d in report["diagnoses"] if d["rule"] == "request-errors")
    assert (errors["numbers"]["http_5xx"], errors["numbers"]["http_total"]) == (1, 5)
