"""Shell completion (cli/complete.py): the answers from the cached tree are typer's own answers for
the same words, in each of typer's shells, and `rules show` completes rule ids and categories.
(How fast: bench/completion.py --check, under 150 ms a TAB.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT

CASES = [
    ("vllm-doctor ", ""), ("vllm-doctor ex", ""), ("vllm-doctor explain --f", ""), ("vllm-doctor explain --format ", ""),
    ("vllm-doctor explain --format m", ""), ("vllm-doctor explain -", ""), ("vllm-doctor explain --format json --f", ""),
    ("vllm-doctor rules ", ""), ("vllm-doctor rules show queue", ""), ("vllm-doctor rules show ", ""),
    ("vllm-doctor alerts --format ", ""), ("vllm-doctor alerts --by namespace --", ""), ("vllm-doctor serve --pre", ""),
    ("vllm-doctor serve --preflight ", ""), ("vllm-doctor plan --dtype ", ""), ("vllm-doctor explain --color=", ""),
    ("vllm-doctor explain fixtures/lab/cache-oom.log --fail-on ", ""), ("vllm-doctor watch --", ""),
    ("vllm-doctor check --", ""), ("vllm-doctor explain --config ", ""), ("vllm-doctor --", ""),
]  # fmt: skip


def _env(shell: str, words: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("_VLLM", "_TYPER", "COMP_"))}
    # PYTHONHASHSEED: typer orders -h and --help through a set (get_help_option_names)
    env.update(
        {"_VLLM_DOCTOR_COMPLETE": f"complete_{shell}", "PYTHONPATH": str(ROOT / "src"), "PYTHONHASHSEED": "0", **extra}
    )
    if shell == "bash":
        parts = words.split(" ")
        env.update({"COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1)})
    else:
        env["_TYPER_COMPLETE_ARGS"] = words
        if shell == "powershell":
            env["_TYPER_COMPLETE_WORD_TO_COMPLETE"] = words.split(" ")[-1]
        if shell == "fish":
            env["_TYPER_COMPLETE_FISH_ACTION"] = "get-args"
    return env


def _run(code: str, env: dict[str, str]) -> str:
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    return r.stdout


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    return str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish", "powershell"])
def test_the_fast_answers_are_typers(shell, cache_home):
    for words, _ in CASES:
        env = _env(shell, words, XDG_CACHE_HOME=cache_home)
        typers = _run("from vllm_doctor.cli import main; main()", env)
        fast = _run("from vllm_doctor.cli.complete import main; main()", env)
        assert fast == typers, (shell, words)
    assert os.path.exists(os.path.join(cache_home, "vllm-doctor", "completion.json"))  # the tree, cached


def test_a_warm_tab_imports_no_typer(cache_home):
    env = _env("bash", "vllm-doctor ex", XDG_CACHE_HOME=cache_home)
    _run("from vllm_doctor.cli.complete import main; main()", env)  # the tree is written
    code = "import atexit, sys; atexit.register(lambda: print('typer' in sys.modules)); from vllm_doctor.cli.complete import main; main()"
    assert _run(code, env).split() == ["explain", "False"]


def test_rules_show_completes_rule_ids_and_categories(cache_home):
    out = _run(
        "from vllm_doctor.cli.complete import main; main()",
        _env("bash", "vllm-doctor rules show queue-c", XDG_CACHE_HOME=cache_home),
    )
    assert out.split() == ["queue-cache-full"]
    out = _run(
        "from vllm_doctor.cli.complete import main; main()",
        _env("bash", "vllm-doctor rules show cache-", XDG_CACHE_HOME=cache_home),
    )
    assert "cache-oom" in out.split() and "cache-oom" in out  # a category, beside the ids


def test_without_a_cache_it_still_answers(tmp_path):
    env = _env("bash", "vllm-doctor ex", VLLM_DOCTOR_NO_CACHE="1")
    assert _run("from vllm_doctor.cli.complete import main; main()", env).split() == ["explain"]
