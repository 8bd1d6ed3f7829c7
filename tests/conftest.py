from __future__ import annotations

import http.server
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from vllm_doctor.knowledge import contract
from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.matching.loader import load as load_rules
from vllm_doctor.pipeline import explain

# the unit suite (and the commands it runs) keeps its derived-data cache apart from the user's;
# the e2e tier keeps the real one, which vLLM's own caches live under too
if not os.environ.get("VLLM_DOCTOR_E2E_VENV"):
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="vllm-doctor-tests-")
contract.STRICT = True  # a check that reads or returns an undeclared name fails the test that ran it

# the property-based tests (tests/properties/): in the suite a fixed search (derandomize: the same
# examples on every run and machine), no deadline (a busy CI core never flips a test), no example
# database left behind; bench/fuzz.py --properties runs the `long` profile
# (VLLM_DOCTOR_HYPOTHESIS=long): VLLM_DOCTOR_HYPOTHESIS_EXAMPLES examples a property, from the
# seed it passes (--hypothesis-seed)
_PROFILE = {
    "deadline": None,
    "database": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
}
settings.register_profile("suite", max_examples=30, derandomize=True, **_PROFILE)
settings.register_profile(
    "long", max_examples=int(os.environ.get("VLLM_DOCTOR_HYPOTHESIS_EXAMPLES", "1000")), **_PROFILE
)
settings.load_profile(os.environ.get("VLLM_DOCTOR_HYPOTHESIS", "suite"))

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
LAB = FIXTURES / "lab"


def _shared() -> Path | None:
    """../shared beside the checkout (CI lays a copy there too); VLLM_DOCTOR_SHARED overrides."""
    if os.environ.get("VLLM_DOCTOR_SHARED"):
        return Path(os.environ["VLLM_DOCTOR_SHARED"])
    return next((p / "shared" for p in ROOT.parents if (p / "shared" / "vllm-lab").is_dir()), None)


SHARED = _shared()


@pytest.fixture
def shared() -> Path:
    """The shared folder; a test that needs it fails in CI (which always has it) and skips elsewhere."""
    if SHARED is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI without shared/vllm-lab above {ROOT}")
        pytest.skip("no ../shared beside this checkout")
    return SHARED


# a small valid rule file, for tests that load user rules or break one on purpose
SAMPLE_RULE = """
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
"""


FAKE_VLLM = ROOT / "tests" / "serve" / "fakevllm.py"  # a real child that replays a recording


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie or a dead one does not), from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture
def fake_bin(tmp_path):
    """An executable `vllm` that execs the fake (same pid, so signals reach it directly)."""
    path = tmp_path / "vllm"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_VLLM}" "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session")
def rules():
    return load_rules(checks=CHECKS)


@pytest.fixture(scope="session")
def run(rules):
    """Explain paths with the built-in rules (loaded once)."""

    def _run(*paths, options=None):
        return explain([str(p) for p in paths], rules, options)

    return _run


SCHEMAS = ROOT / "src" / "vllm_doctor" / "schemas"


def _validators() -> dict:
    """One jsonschema validator per shipped schema (report-1, plan-1, serve-report-1), refs resolved
    among them by their $id."""
    import json

    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    docs = {p.stem: json.loads(p.read_text()) for p in sorted(SCHEMAS.glob("*.json"))}
    registry = Registry().with_resources((d["$id"], Resource.from_contents(d)) for d in docs.values())
    for d in docs.values():
        Draft202012Validator.check_schema(d)
    return {name: Draft202012Validator(d, registry=registry) for name, d in docs.items()}


VALIDATORS = _validators()


def conforms(data, schema: str = "report-1"):
    """`data` (a dict, or the JSON text) checked against a shipped schema: every error at once."""
    import json

    if isinstance(data, (str, bytes)):
        data = json.loads(data)
    data = json.loads(json.dumps(data, default=str))  # as the renderers write it
    errors = sorted(VALIDATORS[schema].iter_errors(data), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:10])
    return data


@contextmanager
def local_http(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A threaded HTTP server on 127.0.0.1 answering with `handler`: its URL while the block runs."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
