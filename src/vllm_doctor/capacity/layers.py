"""Which layer is which: the attention kind of every layer, and the recurrent state of Mamba and
linear-attention layers, read from config.json the way vLLM's model files decide per layer.

Kinds: "full", "sliding" (a window), "chunked" (Llama-4 local attention), "mamba" (a recurrent
state, Mamba or gated delta-net), "cross" (a decoder's cross-attention to the encoder), "none"
(an MLP-only block of Nemotron-H). Pure: a dict in, a LayerPlan out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StateDims:
    """The recurrent state of one Mamba / linear-attention layer, before tensor parallelism
    (vLLM's MambaStateShapeCalculator: a conv state and a temporal state)."""

    kind: str  # "mamba1", "mamba2", "gdn"
    conv_dim: int  # mamba1/2: the intermediate size; gdn: 2 x key dims + value dims
    conv_kernel: int
    heads: int = 0  # mamba2: SSM heads; gdn: value heads
    head_dim: int = 0  # mamba2: SSM head dim; gdn: value head dim
    state: int = 0  # mamba1/2: d_state; gdn: key head dim
    n_groups: int = 0  # mamba2 only

    def elements(self, tp: int = 1) -> tuple[int, int]:
        """(conv state elements, temporal state elements) one layer holds on one rank."""
        tp = max(1, tp)
        width = self.conv_kernel - 1
        if self.kind == "mamba1":
            return self.conv_dim // tp * width, self.conv_dim // tp * self.state
        if self.kind == "gdn":
            return self.conv_dim // tp * width, self.heads // tp * self.head_dim * self.state
        groups = self.n_groups + (0 if self.n_groups % tp == 0 else tp - self.n_groups)  # extra_groups_for_head_shards
        conv = (self.conv_dim + 2 * groups * self.state) // tp * width
        return conv, self.heads // tp * self.head_dim * self.state


@dataclass
class LayerPlan:
    kinds: list[str] = field(default_factory=list)  # one per cache-holding layer (Falcon-H1: 2 per block)
    sliding_window: int | None = None
    chunk_size: int | None = None
    state: StateDims | None = None
    max_encoder_len: int | None = None
    source: str | None = None  # the config keys the pattern came from

    def count(self, kind: str) -> int:
        return sum(1 for k in self.kinds if k == kind)


def _n(text: dict[str, Any], *keys: str, default: int = 0) -> int:
    for key in keys:
        value = text.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return default


def _kind(name: Any) -> str:
    t = str(name).lower()
    for word, kind in (("sliding", "sliding"), ("chunk", "chunked"), ("mamba", "mamba"), ("linear", "mamba")):
        if word in t:
            return kind
    return "full" if "attention" in t or "full" in t else "none"


def state_dims(text: dict[str, Any], model_type: str | None) -> StateDims | None:
    """The per-layer recurrent state of the hybrid families vLLM serves."""
    mt = str(model_type or "")
    hidden = _n(text, "hidden_size")
    if mt == "qwen3_next" or text.get("linear_num_value_heads") is not None:
        kh, vh = _n(text, "linear_num_key_heads"), _n(text, "linear_num_value_heads")
        kd, vd = _n(text, "linear_key_head_dim"), _n(text, "linear_value_head_dim")
        conv = kd * kh * 2 + vd * vh
        return StateDims("gdn", conv, _n(text, "linear_conv_kernel_dim", default=4), vh, vd, kd)
    if mt == "jamba":
        inner = _n(text, "mamba_expand", default=2) * hidden
        return StateDims(
            "mamba1", inner, _n(text, "mamba_d_conv", default=4), state=_n(text, "mamba_d_state", default=16)
        )
    if mt == "nemotron_h":
        heads, hd = _n(text, "mamba_num_heads"), _n(text, "mamba_head_dim")
        return StateDims("mamba2", heads * hd, _n(text, "conv_kernel", default=4), heads, hd,
                         _n(text, "ssm_state_size"), _n(text, "n_groups", default=1))  # fmt: skip
    if mt in ("granitemoehybrid", "falcon_h1", "bamba") or text.get("mamba_n_heads") is not None:
        heads, hd = _n(text, "mamba_n_heads"), _n(text, "mamba_d_head")
        inner = _n(text, "mamba_d_ssm") or _n(text, "mamba_expand", default=2) * hidden
        return StateDims("mamba2", inner, _n(text, "mamba_d_conv", default=4), heads, hd,
                         _n(text, "mamba_d_state", default=128), _n(text, "mamba_n_groups", default=1))  # fmt: skip
    return None


def layer_plan(text: dict[str, Any], model_type: str | None, layers: int, window: int | None) -> LayerPlan:
    """Every layer's kind, from the keys each family uses; plain full attention when none is there."""
    mt = str(model_type or "")
    plan = LayerPlan(sliding_window=window, state=state_dims(text, mt))
    types = text.get("layer_types") or text.get("layers_block_type")
    pattern = text.get("hybrid_override_pattern")
    if mt == "falcon_h1":  # every block runs attention and a Mamba2 mixer side by side
        plan.kinds, plan.source = ["full"] * layers + ["mamba"] * layers, "falcon_h1: attention and Mamba2 per layer"
    elif isinstance(pattern, str) and pattern:
        marks = {"M": "mamba", "*": "full"}
        plan.kinds, plan.source = [marks.get(c, "none") for c in pattern], "hybrid_override_pattern"
    elif isinstance(types, list) and types:
        plan.kinds, plan.source = [_kind(t) for t in types], "layer_types"
    elif mt == "jamba":
        period, offset = _n(text, "attn_layer_period", default=8), _n(text, "attn_layer_offset", default=4)
        plan.kinds = ["full" if i % period == offset else "mamba" for i in range(layers)]
        plan.source = "attn_layer_period / attn_layer_offset"
    elif mt == "qwen3_next":
        interval = _n(text, "full_attention_interval", default=4)
        plan.kinds = ["full" if (i + 1) % interval == 0 else "mamba" for i in range(layers)]
        plan.source = "full_attention_interval"
    elif text.get("attention_chunk_size"):
        plan.chunk_size = int(text["attention_chunk_size"])
        nope = text.get("no_rope_layers")
        if not (isinstance(nope, list) and len(nope) == layers):
            interval = _n(text, "no_rope_layer_interval", default=4)
            nope = [int((i + 1) % interval != 0) for i in range(layers)]
        plan.kinds, plan.source = ["chunked" if n else "full" for n in nope], "attention_chunk_size / no_rope_layers"
    else:
        plan.kinds = ["full"] * layers
    if text.get("attention_chunk_size") and "chunked" in plan.kinds:
        plan.chunk_size = int(text["attention_chunk_size"])
    if text.get("is_encoder_decoder") and text.get("max_source_positions"):
        plan.max_encoder_len = int(text["max_source_positions"])
        decoder = _n(text, "decoder_layers", default=layers)
        plan.kinds, plan.source = ["full"] * decoder + ["cross"] * decoder, "encoder-decoder: self and cross attention"
    return plan
