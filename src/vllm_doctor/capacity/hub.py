"""Finding a model's config.json: --config, a local directory, the Hugging Face cache, else a download.

The cache is read through huggingface_hub's own lookup (HF_HOME / HF_HUB_CACHE honoured), and only
config.json is ever downloaded. huggingface_hub is imported only when a repo id has to be looked up,
so the CLI starts fast. A missing, gated or unreachable model is a one-line note, never a traceback.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_doctor.capacity.shape import ConfigError

NET_TIMEOUT_S = 3.0  # one HTTP request to the Hub; no retries, so "no network" is said quickly


@dataclass
class Resolved:
    """The outcome of looking for config.json: the parsed file, or a one-line reason it is absent."""

    config: dict[str, Any] | None
    source: str | None = None
    note: str | None = None  # why there is no config (or a warning about the one found)
    directory: Path | None = None  # the folder holding config.json (local safetensors live there)
    repo_id: str | None = None
    online: bool | None = None  # True once a Hub request succeeded in this lookup, False once one failed
    offline: bool = False  # --offline or HF_HUB_OFFLINE: no request may be made


MAX_CONFIG = 8 << 20  # bytes: a config.json is a few KiB (a 500 MB one took 1 GB before it failed)


def _not_finite(text: str) -> float:
    raise ValueError(f"{text} is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    return value if math.isfinite(value) else _not_finite(text)


def _plain_int(text: str) -> int | float:
    """A whole number; one past 2**63 (no count is) as a float, so that the shape's limits judge it."""
    if len(text) > 20:
        value = float(text)  # 10**400: inf, refused as 1e400 is
        return value if math.isfinite(value) else _not_finite(f"{text[:12]}...({len(text)} digits)")
    return int(text)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A config.json, bounded (MAX_CONFIG bytes; nesting as deep as json's recursion allows) and
    holding only finite numbers (NaN, Infinity and 1e400 are refused): a one-line ConfigError else."""
    from vllm_doctor.errors import TooLarge, read_text_bounded

    p = Path(path).expanduser()
    try:
        text = read_text_bounded(p, MAX_CONFIG, "config.json")
    except TooLarge as e:
        raise ConfigError(f"{path}: {e}") from None
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory (give the config.json inside it)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    try:
        data = json.loads(text, parse_constant=_not_finite, parse_float=_finite_float, parse_int=_plain_int)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid JSON for a config (nested too deeply)") from None
    except ValueError as e:  # a number refused above
        raise ConfigError(f"{path}: not valid JSON for a config ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return data


_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def looks_like_path(ref: str) -> bool:
    return ref.startswith(("/", "./", "../", "~")) or ref.count("/") > 1


def resolve(ref: str | None, config_file: str | None = None, offline: bool = False) -> Resolved:
    """Find the model's config.json: --config, a local directory, the HF cache, else the Hub.

    Never raises for a missing or unreachable model (the note says why); an explicit --config
    that cannot be read raises ConfigError, since the user named that file.
    """
    if config_file:
        cfg = read_config_file(config_file)
        return Resolved(cfg, source=f"--config {config_file}", directory=Path(config_file).expanduser().parent)
    if not ref:
        return Resolved(None, note="no model named (the log does not say; pass --model ID|PATH or --config FILE)")
    try:
        local = Path(ref).expanduser()
        is_dir, is_file = local.is_dir(), local.is_file()
    except (OSError, RuntimeError, ValueError):  # no path at all: too long, ~nosuchuser, a NUL
        local, is_dir, is_file = Path(), False, False
    if is_dir:
        cfg_path = local / "config.json"
        if not cfg_path.is_file():
            return Resolved(None, note=f"{ref}: no config.json in this directory")
        try:
            return Resolved(read_config_file(cfg_path), source=f"local directory {ref}", directory=local)
        except ConfigError as e:
            return Resolved(None, note=str(e))
    if is_file:
        try:
            return Resolved(read_config_file(local), source=f"local file {ref}", directory=local.parent)
        except ConfigError as e:
            return Resolved(None, note=str(e))
    if looks_like_path(ref) or not _REPO_ID.match(ref):
        return Resolved(
            None,
            note=f"{ref}: not found here (a path on the server?); pass --model DIR or --config FILE",
        )
    return _from_hub(ref, offline)


def _from_hub(repo_id: str, offline: bool) -> Resolved:
    try:
        import huggingface_hub as hub
        from huggingface_hub import constants
    except ImportError:
        return Resolved(None, note="huggingface_hub is not installed: cannot look up " + repo_id, repo_id=repo_id)
    offline = offline or bool(constants.HF_HUB_OFFLINE)
    # The cache first, through the hub's own lookup (HF_HOME / HF_HUB_CACHE are honoured by it).
    try:
        cached = hub.try_to_load_from_cache(repo_id, "config.json")  # None, a path, or "known absent"
    except Exception as e:  # noqa: BLE001 - a malformed cache must not stop the diagnosis
        cached = None
        cache_problem = f" (cache lookup failed: {type(e).__name__})"
    else:
        cache_problem = ""
    if isinstance(cached, str):
        path = Path(cached)
        try:
            return Resolved(read_config_file(path), source="Hugging Face cache", directory=path.parent,
                            repo_id=repo_id, offline=offline)  # fmt: skip
        except ConfigError as e:
            return Resolved(None, note=f"{repo_id}: cached {e}", repo_id=repo_id)
    if offline:
        why = "--offline" if not constants.HF_HUB_OFFLINE else "HF_HUB_OFFLINE=1"
        return Resolved(
            None,
            note=f"{repo_id}: config.json is not in the Hugging Face cache ({constants.HF_HUB_CACHE}){cache_problem} "
            f"and {why} forbids the network; going on without the model config",
            repo_id=repo_id,
            offline=True,
        )
    problem = _hub_problem(repo_id, "config.json")
    if problem:
        return Resolved(None, note=problem, repo_id=repo_id, online=False)
    try:
        path = Path(hub.hf_hub_download(repo_id, "config.json", etag_timeout=NET_TIMEOUT_S))
    except Exception as e:  # noqa: BLE001 - any hub failure is one line, never a traceback
        return Resolved(None, note=_hub_error_line(repo_id, e), repo_id=repo_id, online=False)
    try:
        cfg = read_config_file(path)
    except ConfigError as e:
        return Resolved(None, note=f"{repo_id}: downloaded {e}", repo_id=repo_id, online=True)
    return Resolved(cfg, source="downloaded from Hugging Face (config.json only)", directory=path.parent,
                    repo_id=repo_id, online=True)  # fmt: skip


def _hub_problem(repo_id: str, filename: str) -> str | None:
    """One quick HEAD request without retries: hf_hub_download retries a dead network for ~20 s."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    try:
        get_hf_file_metadata(hf_hub_url(repo_id, filename), timeout=NET_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001
        return _hub_error_line(repo_id, e)
    return None


def _hub_error_line(repo_id: str, error: BaseException) -> str:
    from huggingface_hub.utils import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    if isinstance(error, GatedRepoError):
        token = "HF_TOKEN is not set" if not _have_token() else "the token in HF_TOKEN has no access to it"
        return (
            f"{repo_id} is a gated repo ({token}): accept its licence on huggingface.co and set HF_TOKEN "
            "to a token of that account; going on without the model config"
        )
    if isinstance(error, RepositoryNotFoundError):
        hint = "" if _have_token() else " (or private: set HF_TOKEN)"
        return f"{repo_id}: no such model on the Hugging Face Hub{hint}; going on without the model config"
    if isinstance(error, EntryNotFoundError) and not isinstance(error, LocalEntryNotFoundError):
        return f"{repo_id}: the repo has no config.json; going on without the model config"
    if isinstance(error, HfHubHTTPError) and getattr(getattr(error, "response", None), "status_code", 0) in (401, 403):
        return f"{repo_id}: the Hub refused access (HTTP 401/403): set HF_TOKEN; going on without the model config"
    cause = error.__cause__ or error
    reason = str(cause).splitlines()[0][:120] if str(cause) else type(cause).__name__
    return f"{repo_id}: Hugging Face is unreachable ({reason}); going on without the model config"


def _have_token() -> bool:
    try:
        from huggingface_hub import get_token

        return bool(get_token())
    except Exception:  # noqa: BLE001
        return bool(os.environ.get("HF_TOKEN"))


def reachable(resolved: Resolved) -> bool:
    """Known to answer, or answers a probe for config.json now (a probe only when unknown)."""
    assert resolved.repo_id
    return bool(resolved.online) or (resolved.online is None and _hub_problem(resolved.repo_id, "config.json") is None)
