"""The entry point, and shell completion fast enough for a TAB.

typer's completion builds the whole command line (typer, click, the CLI modules: about 0.2 s a
TAB here, 0.5 s in zsh and fish, whose help texts go through rich) on every key press. So the
first TAB writes the command tree as typer built it to the on-disk cache (read/cache.py): commands,
options, choices and their help as typer's shells print them, and the rule ids and categories
`rules show` takes; every later TAB answers from that file without importing typer, in the
formats of typer's completion classes (typer/_completion_classes.py: bash, zsh, fish,
PowerShell) and by click's rules for what completes where (shell_completion._resolve_incomplete).
tests/cli/test_completion.py holds the answers to typer's own for the same words. The cache is
keyed by the version and the modules' and rules' modification times.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

VAR = "_VLLM_DOCTOR_COMPLETE"
PROG = "vllm-doctor"


def main() -> None:
    """`vllm-doctor`: a completion request answered from the cached tree, else the CLI."""
    instruction = os.environ.get(VAR, "")
    shell = instruction.partition("_")[2]
    if instruction.startswith("complete_") and shell in ("bash", "zsh", "fish", "powershell", "pwsh"):
        try:
            tree = _tree()
        except Exception:  # whatever goes wrong here, typer's own completion still answers
            tree = None
        if tree is not None:
            sys.stdout.write(answer(tree, shell) + "\n")  # as click echoes it
            sys.stdout.flush()
            sys.exit(0)
    from vllm_doctor.cli import main as cli

    cli()


def _stamp() -> str:
    """What the tree is made from: the version, the CLI modules' and the rules' modification times."""
    from vllm_doctor import __version__

    package = Path(__file__).parent.parent
    times = []
    for d in (package, package / "cli", package / "rules", package.parent.parent / "rules"):
        try:
            times += [e.stat().st_mtime_ns for e in os.scandir(d) if e.name.endswith(".py") or e.is_dir()]
        except OSError:
            pass
    return f"{__version__}-{max(times, default=0)}-{len(times)}"


def _tree() -> dict[str, Any] | None:
    from vllm_doctor.read import cache

    name = "completion.json"
    stamp = _stamp()
    data = cache.read(name)
    if data is not None:
        tree = json.loads(data)
        if tree.get("stamp") == stamp:
            return tree
    tree = build()
    tree["stamp"] = stamp
    cache.write(name, json.dumps(tree).encode())
    return tree


def build() -> dict[str, Any]:
    """The command tree as typer builds it: what `answer` needs of each command and parameter."""
    import typer
    from typer._completion_classes import _sanitize_help_text

    from vllm_doctor.cli import app

    def node(cmd: Any, ctx: Any) -> dict[str, Any]:
        params = []
        for p in cmd.get_params(ctx):
            text = p.help if getattr(p, "help", None) else ""
            params.append({
                "kind": p.param_type_name, "opts": [*p.opts, *p.secondary_opts], "name": p.name,
                "flag": bool(getattr(p, "is_flag", False) or getattr(p, "count", False)), "nargs": p.nargs,
                "multiple": bool(getattr(p, "multiple", False)), "hidden": bool(getattr(p, "hidden", False)),
                "choices": [str(c) for c in getattr(p.type, "choices", None) or []] or _values(p.name),
                "path": p.type.name in ("path", "file"), "help": _helps(text, _sanitize_help_text),
            })  # fmt: skip
        out: dict[str, Any] = {"params": params, "commands": {}}
        for name in getattr(cmd, "list_commands", lambda _: [])(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                child = node(sub, typer.Context(sub, parent=ctx, info_name=name, **sub.context_settings))
                child["help"] = _helps(sub.get_short_help_str(), _sanitize_help_text)
                out["commands"][name] = child
        return out

    root = typer.main.get_command(app)
    return node(root, typer.Context(root, info_name=PROG, **root.context_settings))


def _values(name: str | None) -> list[str]:
    return rule_names("") if name == "rule_id" else []


def rule_names(incomplete: str) -> list[str]:
    """`rules show ID|CATEGORY`: every rule id and category (typer's autocompletion of it too)."""
    from vllm_doctor.knowledge.rulebook import load

    rules = load()
    return sorted(
        n for n in {r.id for r in rules} | {r.category for r in rules if r.category} if n.startswith(incomplete)
    )


def _helps(text: str, sanitize: Any) -> dict[str, str]:
    """A help text as each of typer's shells prints it (zsh escapes first, fish flattens spaces)."""
    if not text:
        return {}
    return {"zsh": sanitize(_zsh(text)), "fish": sanitize(re.sub(r"\s", " ", text)), "powershell": sanitize(text)}


def _zsh(s: str) -> str:
    return s.replace('"', '""').replace("'", "''").replace("$", "\\$").replace("`", "\\`").replace(":", r"\\:")


def _words(shell: str) -> tuple[list[str], str]:
    """(the words before the one completed, that word), as typer's classes read their shell's variables."""
    import shlex

    def split(text: str) -> list[str]:
        lex = shlex.shlex(text, posix=True)
        lex.whitespace_split, lex.commenters = True, ""
        out: list[str] = []
        try:
            out.extend(lex)
        except ValueError:  # an open quote: what was read, and the rest as it is (click's split_arg_string)
            out.append(lex.token)
        return out

    if shell == "bash":
        words, at = split(os.environ.get("COMP_WORDS", "")), int(os.environ.get("COMP_CWORD", "0") or 0)
        return words[1:at], words[at] if at < len(words) else ""
    given = os.environ.get("_TYPER_COMPLETE_ARGS", "")
    words = split(given)[1:]
    if shell in ("powershell", "pwsh"):
        incomplete = os.environ.get("_TYPER_COMPLETE_WORD_TO_COMPLETE", "")
        return (words[:-1] if incomplete else words), incomplete
    if words and not given.endswith(" "):
        return words[:-1], words[-1]
    return words, ""


def candidates(tree: dict[str, Any], args: list[str], incomplete: str) -> list[tuple[str, dict[str, str]]]:
    """(value, its help per shell) for `incomplete` after `args`, by click's rules."""
    node, positional = tree, 0
    used: set[str] = set()
    pending: dict[str, Any] | None = None
    for word in args:
        if pending is not None:
            pending = None
            continue
        if word in node["commands"] and not positional:
            node, used, positional = node["commands"][word], set(), 0
            continue
        param = _option(node, word)
        if param is not None:
            used.add(param["name"])
            if not param["flag"] and "=" not in word:
                pending = param
        elif not word.startswith("-") or word == "-":
            positional += 1
    if "=" in incomplete and incomplete.startswith("-") and _option(node, incomplete) is not None:
        name, _, incomplete = incomplete.partition("=")
        pending = _option(node, name)
    if pending is None and incomplete[:1] and not incomplete[0].isalnum():
        return [
            (name, p["help"])
            for p in node["params"]
            if p["kind"] == "option" and not p["hidden"] and (p["multiple"] or p["name"] not in used)
            for name in p["opts"]
            if name.startswith(incomplete)
        ]
    if pending is not None:
        return _of(pending, incomplete)
    if node["commands"]:
        return [(name, c.get("help", {})) for name, c in node["commands"].items() if name.startswith(incomplete)]
    arguments = [p for p in node["params"] if p["kind"] == "argument"]
    for p in arguments:
        if p["nargs"] == -1 or positional < max(p["nargs"], 1):
            return _of(p, incomplete)
        positional -= max(p["nargs"], 1)
    return []


def _option(node: dict[str, Any], word: str) -> dict[str, Any] | None:
    name = word.partition("=")[0]
    return next((p for p in node["params"] if p["kind"] == "option" and name in p["opts"]), None)


def _of(param: dict[str, Any], incomplete: str) -> list[tuple[str, dict[str, str]]]:
    """A parameter's values: its choices that start with `incomplete`; a path's, the word itself
    (typer's scripts then complete file names)."""
    if param["choices"]:
        return [(c, {}) for c in param["choices"] if c.startswith(incomplete)]
    return [(incomplete, {})] if param["path"] else []


def answer(tree: dict[str, Any], shell: str) -> str:
    """The text typer's completion class for `shell` prints."""
    args, incomplete = _words(shell)
    found = candidates(tree, args, incomplete)
    if shell == "bash":
        return "\n".join(v for v, _ in found)
    if shell == "zsh":
        items = [f'"{_zsh(v)}":"{h["zsh"]}"' if h.get("zsh") else f'"{_zsh(v)}"' for v, h in found]
        return "_arguments '*: :((" + "\n".join(items) + "))'" if items else "_files"
    if shell == "fish":
        shown = [f"{v}\t{h['fish']}" if h.get("fish") else v for v, h in found]
        if os.environ.get("_TYPER_COMPLETE_FISH_ACTION") == "is-args":
            sys.exit(0 if shown else 1)
        return "\n".join(shown) if os.environ.get("_TYPER_COMPLETE_FISH_ACTION") == "get-args" else ""
    return "\n".join(f"{v}:::{h.get('powershell') or ' '}" for v, h in found)
