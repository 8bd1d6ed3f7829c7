"""The model's shape with its parameter count, from a model reference: the entry point `load`.

Finding config.json lives in hub.py, normalising it in shape.py, the parameter count in params.py.
Nothing here raises past its callers except ConfigError, whose message is one line.
"""

from __future__ import annotations

from vllm_doctor.capacity.hub import Resolved, resolve
from vllm_doctor.capacity.params import fill_params
from vllm_doctor.capacity.shape import ConfigError, ModelShape, shape_from_config

__all__ = ["ConfigError", "ModelShape", "load", "resolve"]


def load(
    ref: str | None,
    config_file: str | None = None,
    offline: bool = False,
    vllm_version: str | None = None,
    resolved: Resolved | None = None,
) -> tuple[ModelShape | None, str | None]:
    """(shape, note): the model's shape with its parameter count, or None and the one-line reason.
    `resolved`: the config.json hub.resolve already found for `ref` (not looked up again).
    Raises ConfigError only for an explicit --config that cannot be read."""
    resolved = resolved if resolved is not None else resolve(ref, config_file, offline)
    if resolved.config is None:
        return None, resolved.note
    try:
        shape = shape_from_config(resolved.config, name=ref or config_file, source=resolved.source,
                                  vllm_version=vllm_version)  # fmt: skip
    except ConfigError as e:
        if config_file:
            raise
        return None, f"{ref}: {e}"
    fill_params(shape, resolved, offline)
    return shape, resolved.note
