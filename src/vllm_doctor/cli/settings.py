"""Defaults from the environment and a config file, for the options people set once.

Precedence: a flag > a VLLM_DOCTOR_* variable > the config file > the built-in default. The
config file is the first of $VLLM_DOCTOR_CONFIG, ./vllm-doctor.toml and
$XDG_CONFIG_HOME/vllm-doctor/config.toml (~/.config/...); its keys sit at the top level or under
[tool.vllm-doctor]. The file's values become click's default_map, so a flag still wins and --help
shows them as the defaults; the variables are the options' own `envvar` (cli/options.py), which
click reads between the two and --help lists.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_doctor.errors import DoctorError
from vllm_doctor.render import FORMATS  # the formats there are (cheap: data's dataclasses only)

# key (config file) -> (its option's envvar, kind, allowed values)
KEYS: dict[str, tuple[str, type, tuple[str, ...]]] = {
    "format": ("VLLM_DOCTOR_FORMAT", str, FORMATS),
    "fail-on": ("VLLM_DOCTOR_FAIL_ON", str, ("blocker", "warning")),
    "rules": ("VLLM_DOCTOR_RULES", list, ()),  # directories; the variable splits at os.pathsep
    "color": ("VLLM_DOCTOR_COLOR", str, ("auto", "always", "never")),
    "target-concurrency": ("VLLM_DOCTOR_TARGET_CONCURRENCY", int, ()),  # the concurrency budget
    "target-len": ("VLLM_DOCTOR_TARGET_LEN", int, ()),
}
# the commands each key is a default for (click parameter names)
COMMANDS: dict[str, tuple[str, ...]] = {
    "explain": ("format", "fail-on", "rules", "color", "target-concurrency", "target-len"),
    "watch": ("format", "fail-on", "rules", "color"),
    "plan": ("format", "color", "target-concurrency"),
    "check": ("format", "fail-on", "color"),  # its options are explain's: the variables reach it too
    "serve": ("rules",),
    "rules": ("rules",),
}
PARAM = {
    "rules": "rules_dirs",
    "fail-on": "fail_on",
    "target-concurrency": "target_concurrency",
    "target-len": "target_len",
}


loaded: Path | None = None  # the config file load() read: named on stderr and in the report (sources.py)


class SettingsError(DoctorError):
    """A bad value in a VLLM_DOCTOR_* variable or the config file; the message names it."""


def config_path(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path | None:
    """The config file in use, None when there is none (VLLM_DOCTOR_CONFIG="" turns it off)."""
    env = os.environ if env is None else env
    if "VLLM_DOCTOR_CONFIG" in env:
        given = env["VLLM_DOCTOR_CONFIG"]
        if given and not Path(given).is_file():
            raise SettingsError(f"VLLM_DOCTOR_CONFIG={given}: no such file")
        return Path(given) if given else None
    local = (cwd or Path.cwd()) / "vllm-doctor.toml"
    if local.is_file():
        return local
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    user = base / "vllm-doctor" / "config.toml"
    return user if user.is_file() else None


def _check(key: str, value: Any, where: str, base: Path | None) -> Any:
    kind, allowed = KEYS[key][1], KEYS[key][2]
    if kind is list:
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) and v for v in items):
            raise SettingsError(f"{where}: give a list of directories")
        return [str(base / v) if base is not None else v for v in items]
    if kind is int:
        try:
            number = int(value)
        except (TypeError, ValueError):
            number = 0
        if number < 1 or isinstance(value, bool):
            raise SettingsError(f"{where}: give a whole number of at least 1")
        return number
    if value not in allowed:
        raise SettingsError(f"{where}: give {', '.join(allowed[:-1])} or {allowed[-1]}")
    return value


MAX_FILE = 1 << 20  # a settings file holds a few keys: a 1 GiB one took 2 GB before its parse error


def _from_file(path: Path) -> dict[str, Any]:
    import tomllib

    from vllm_doctor.errors import TooLarge, read_text_bounded

    try:
        data = tomllib.loads(read_text_bounded(path, MAX_FILE, "settings file"))
    except TooLarge as e:
        raise SettingsError(f"{path}: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SettingsError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{path}: not valid TOML ({e})") from None
    except RecursionError:  # arrays or tables nested thousands deep
        raise SettingsError(f"{path}: not valid TOML (nested too deeply)") from None
    except ValueError as e:  # an integer of thousands of digits (Python's int limit)
        raise SettingsError(f"{path}: not valid TOML ({str(e).split(';')[0]})") from None
    data = data.get("tool", {}).get("vllm-doctor", data) if isinstance(data.get("tool"), dict) else data
    out = {}
    for key, value in data.items():
        if key not in KEYS:
            raise SettingsError(f"{path}: unknown key {key!r} (known: {', '.join(KEYS)})")
        out[key] = _check(key, value, f"{path}: {key} = {value!r}", path.parent)
    return out


def load(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """The config file's settings (the variables are read by click, over them: cli/options.py)."""
    global loaded
    env = os.environ if env is None else env
    path = config_path(env, cwd)
    loaded = path
    return _from_file(path) if path is not None else {}


def default_map(values: dict[str, Any]) -> dict[str, Any]:
    """click's default_map: per command, its parameters' defaults (`rules show` takes --rules too)."""
    out: dict[str, Any] = {}
    for command, keys in COMMANDS.items():
        got = {PARAM.get(k, k): values[k] for k in keys if k in values}
        if got:
            out[command] = got
    if "rules" in out:
        out["rules"]["show"] = dict(out["rules"])
    return out


def apply_color(mode: str) -> None:
    """--color always|never as the variables rich (and every tool after it) reads; auto leaves them."""
    if mode == "always":
        os.environ.pop("NO_COLOR", None)
        os.environ["FORCE_COLOR"] = "1"
    elif mode == "never":
        os.environ.pop("FORCE_COLOR", None)
        os.environ["NO_COLOR"] = "1"
