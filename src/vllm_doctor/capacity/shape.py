"""The model's shape: config.json normalised into one ModelShape the way vLLM reads it.

Follows ../shared/vllm-reference/kv-cache-arithmetic.md (sections 1 and 6): the layer, head and
KV head counts, the head size (MLA: the latent vector), sliding windows, the derived maximum
length and the quantization bits. Pure: no file or network access; errors are a one-line ConfigError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_doctor.capacity.layers import LayerPlan, layer_plan
from vllm_doctor.errors import MAX_HEADS, MAX_INT, MAX_LAYERS, MAX_TOKENS, MAX_WIDTH, DoctorError, in_range
from vllm_doctor.versions import version_tuple

if TYPE_CHECKING:
    from vllm_doctor.capacity.tally import Tally

# config.json keys, in the order vLLM tries them (HF attribute_maps expose the aliases)
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")  # Whisper: its decoder
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim")
KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")  # multimodal nesting
ROPE_NOT_MULTIPLIED = ("su", "longrope", "llama3", "default", "mrope")  # max_position_embeddings is already long
YARN_TYPES = ("yarn", "deepseek_yarn", "deepseek_llama_scaling")

# transformers fills absent fields from its config class; a sparse text_config (LLaVA, Gemma 3)
# relies on these, so vLLM sees them. Only the fields shape.py and params.py read.
TRANSFORMERS_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "max_position_embeddings": 2048, "tie_word_embeddings": False,
    },
    "mistral": {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
        "sliding_window": 4096, "tie_word_embeddings": False,
    },
    "qwen2": {
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
        "num_attention_heads": 32, "max_position_embeddings": 32768, "use_sliding_window": False,
        "tie_word_embeddings": False,
    },
    "gemma": {"tie_word_embeddings": True},
    "gemma2": {"tie_word_embeddings": True},
    "gemma3_text": {
        "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
        "sliding_window": 4096, "sliding_window_pattern": 6, "tie_word_embeddings": True,
    },
}  # fmt: skip

# --quantization methods (and quant_method values) -> bits per weight when the config does not say
QUANT_DEFAULT_BITS = {
    "awq": 4, "awq_marlin": 4, "gptq": 4, "gptq_marlin": 4, "marlin": 4, "bitsandbytes": 4, "gguf": 4,
    "mxfp4": 4, "nvfp4": 4, "modelopt_fp4": 4, "fp8": 8, "ptpc_fp8": 8, "fbgemm_fp8": 8, "modelopt": 8,
    "experts_int8": 8, "int8": 8, "w8a8": 8, "compressed-tensors": 8,
}  # fmt: skip


class ConfigError(DoctorError):
    """A config.json that cannot be read or lacks what the arithmetic needs; the message is one line."""


@dataclass
class ModelShape:
    """What the capacity arithmetic needs from config.json, normalised across architectures."""

    layers: int
    attention_heads: int
    kv_heads: int  # total, before tensor parallelism
    head_dim: int  # per KV vector; MLA: kv_lora_rank + qk_rope_head_dim
    name: str | None = None
    source: str | None = None  # where config.json came from, for the report
    model_type: str | None = None
    architecture: str | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    use_mla: bool = False  # one latent vector per token per layer instead of K and V
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    max_position_embeddings: int | None = None
    derived_max_model_len: int | None = None  # what vLLM derives (keys, then rope scaling)
    max_len_key: str | None = None
    rope_scaling: dict[str, Any] | None = None
    sliding_window: int | None = None
    sliding_layers: int = 0  # layers that keep only the window
    layer_plan: LayerPlan | None = None  # every layer's kind (full, sliding, chunked, mamba, ...)
    dtype: str | None = None  # torch_dtype / dtype of the checkpoint
    quant_method: str | None = None
    quant_bits: float | None = None  # bits per weight from quantization_config
    num_experts: int | None = None
    experts_per_token: int | None = None
    params: int | None = None
    # "safetensors (local files)", "safetensors metadata (Hugging Face)", "estimated from the shape", "given"
    params_source: str | None = None
    params_by_dtype: dict[str, int] | None = None  # from safetensors: stored elements per dtype
    tally: Tally | None = None  # from safetensors: every tensor's elements by dtype and role (weights.py)
    quant_config: dict[str, Any] | None = None  # config.json's quantization_config
    notes: list[str] = field(default_factory=list)  # fields filled from defaults, ignored settings
    text_config: dict[str, Any] = field(default_factory=dict, repr=False)  # the normalised source

    @property
    def full_layers(self) -> int:
        return self.layers - self.sliding_layers

    def _layer_kinds(self) -> dict[str, int] | None:
        """{'full': 18, 'sliding': 18}: how many layers of each kind; None when every layer is full attention."""
        kinds = self.layer_plan.kinds if self.layer_plan else []
        counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
        return None if set(counts) <= {"full"} else counts

    def to_json(self, kv_bytes_per_token: int | None) -> dict[str, Any]:
        """facts.model in the report and `model` in a plan: the issue's keys first, then detail."""
        return {
            "name": self.name,
            "layers": self.layers,
            "attention_heads": self.attention_heads or None,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "kv_bytes_per_token": kv_bytes_per_token,
            "max_position_embeddings": self.max_position_embeddings,
            "params": self.params,
            "params_source": self.params_source,
            "source": self.source,
            "model_type": self.model_type,
            "architecture": self.architecture,
            "use_mla": self.use_mla,
            "derived_max_model_len": self.derived_max_model_len,
            "max_len_key": self.max_len_key,
            "rope_scaling": self.rope_scaling,
            "sliding_window": self.sliding_window,
            "sliding_layers": self.sliding_layers,
            "layer_kinds": self._layer_kinds(),
            "attention_chunk_size": self.layer_plan.chunk_size if self.layer_plan else None,
            "recurrent_state": self.layer_plan.state.kind if self.layer_plan and self.layer_plan.state else None,
            "dtype": self.dtype,
            "quantization": self.quant_method,
            "quant_bits": self.quant_bits,
            "num_experts": self.num_experts,
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------------------------------------
# Normalising config.json into a ModelShape


def _first(cfg: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | tuple[None, None]:
    for k in keys:
        if cfg.get(k) is not None:
            return k, cfg[k]
    return None, None


def _int(value: Any, what: str, high: int = MAX_WIDTH, low: int = 0) -> int:
    """A whole count of config.json, at most `high` (a model has no 10**8 layers: counted, they took 2.4 GB)."""
    try:
        float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"config.json: {what} is {value!r}, not a number") from None
    except OverflowError:
        pass  # too large for a float: in_range says so
    return int(in_range(value, f"config.json: {what}", low, high, whole=True, error=ConfigError))


def _magnitudes(cfg: dict[str, Any], where: str = "") -> dict[str, Any]:
    """Every number of a config (and its nested tables, a level down) within MAX_INT: the parameter
    estimate multiplies them, and 1e308 overflowed it."""
    for key, value in cfg.items():
        if isinstance(value, dict) and not where:
            _magnitudes(value, f"{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and not abs(value) <= MAX_INT:
            raise ConfigError(f"config.json: {where}{key} is {value:.3g}, past any model's (at most 2**53)")
    return cfg


def text_config(cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The config vLLM reads the shape from (hf_text_config): the nested text config of a
    multimodal model, with transformers' defaults for what it leaves out."""
    notes: list[str] = []
    text = cfg
    for key in TEXT_CONFIG_KEYS:
        nested = cfg.get(key)
        if isinstance(nested, dict):
            text = dict(nested)
            notes.append(f"shape read from {key} (multimodal model)")
            break
    defaults = TRANSFORMERS_DEFAULTS.get(str(text.get("model_type") or ""), {})
    filled = [k for k in defaults if text.get(k) is None and k not in text]
    if filled:
        text = {**{k: defaults[k] for k in filled}, **text}
        notes.append(f"{', '.join(filled)} from transformers' {text.get('model_type')} defaults (not in config.json)")
    return text, notes


def shape_from_config(
    cfg: dict[str, Any], name: str | None = None, source: str | None = None, vllm_version: str | None = None
) -> ModelShape:
    """Normalise a parsed config.json. Raises ConfigError naming the first missing key."""
    if not isinstance(cfg, dict):
        raise ConfigError("config.json: not a JSON object")
    text, notes = text_config(_magnitudes(cfg))
    _magnitudes(text)
    model_type = str(text.get("model_type") or cfg.get("model_type") or "") or None
    archs = cfg.get("architectures") or text.get("architectures") or []
    architecture = archs[0] if isinstance(archs, list) and archs else None

    key, layers = _layer_count(text)
    if key is None:
        raise ConfigError("config.json has no num_hidden_layers (nor n_layer / num_layers)")
    layers = _int(layers, key, MAX_LAYERS, low=1)
    key, heads = _first(text, HEAD_KEYS)
    if key is None:
        raise ConfigError("config.json has no num_attention_heads (nor n_head / num_heads)")
    heads = _int(heads, key, MAX_HEADS)
    if heads == 0:
        raise ConfigError("config.json: num_attention_heads is 0")
    hkey, hidden = _first(text, HIDDEN_KEYS)
    hidden = _int(hidden, hkey) if hkey else None

    kv_heads = _kv_heads(text, model_type, heads)
    use_mla = text.get("kv_lora_rank") is not None
    kv_lora_rank = qk_rope = None
    if use_mla:
        kv_lora_rank = _int(text["kv_lora_rank"], "kv_lora_rank")
        qk_rope = _int(text.get("qk_rope_head_dim") or 0, "qk_rope_head_dim")
        head_dim = kv_lora_rank + qk_rope
    elif text.get("head_dim") is not None:
        head_dim = _int(text["head_dim"], "head_dim", low=1)
    elif text.get("hidden_size_per_head") is not None:
        head_dim = _int(text["hidden_size_per_head"], "hidden_size_per_head", low=1)
    elif hidden is not None:
        head_dim = hidden // heads
    else:
        raise ConfigError("config.json has neither head_dim nor hidden_size to derive the head size from")

    sliding_window, sliding_layers, plan = _layers(text, model_type, layers, notes)
    max_pos = text.get("max_position_embeddings")
    derived, max_len_key = derive_max_model_len(text, model_type, vllm_version)
    rope = text.get("rope_scaling") or text.get("rope_parameters")
    qcfg = cfg.get("quantization_config") or text.get("quantization_config")
    method, bits = quantization_bits(qcfg)
    experts = _first(text, ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts"))[1]
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or text.get("torch_dtype") or text.get("dtype")
    vocab = text.get("vocab_size") or cfg.get("vocab_size")
    return ModelShape(
        layers=layers,
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        name=name,
        source=source,
        model_type=model_type,
        architecture=architecture,
        hidden_size=hidden,
        vocab_size=int(vocab) if isinstance(vocab, (int, float)) else None,
        use_mla=use_mla,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope,
        max_position_embeddings=int(max_pos) if isinstance(max_pos, (int, float)) else None,
        derived_max_model_len=derived,
        max_len_key=max_len_key,
        rope_scaling=rope if isinstance(rope, dict) else None,
        sliding_window=sliding_window,
        sliding_layers=sliding_layers,
        dtype=str(dtype).removeprefix("torch.") if dtype else None,
        quant_method=method,
        quant_bits=bits,
        quant_config=qcfg if isinstance(qcfg, dict) else None,
        num_experts=int(experts) if isinstance(experts, (int, float)) else None,
        experts_per_token=text.get("num_experts_per_tok"),
        layer_plan=plan,
        notes=notes,
        text_config=text,
    )


def _layer_count(text: dict[str, Any]) -> tuple[str | None, Any]:
    """(key, layers): the first layer key, else the length of transformers 5's Nemotron-H layers_block_type."""
    key, layers = _first(text, LAYER_KEYS)
    if key is None and isinstance(text.get("layers_block_type"), list):
        return "layers_block_type", len(text["layers_block_type"])
    return key, layers


def _layers(
    text: dict[str, Any], model_type: str | None, layers: int, notes: list[str]
) -> tuple[int | None, int, LayerPlan]:
    """(sliding window, sliding layers, every layer's kind)."""
    sliding_window, sliding_layers, sw_note = _sliding(text, model_type, layers)
    if sw_note:
        notes.append(sw_note)
    plan = layer_plan(text, model_type, layers, sliding_window)
    if sliding_layers and "sliding" not in plan.kinds and plan.kinds.count("full") >= sliding_layers:
        plan.kinds = ["sliding"] * sliding_layers + plan.kinds[sliding_layers:]  # a pattern key, not a list
    return sliding_window, sliding_layers, plan


def _kv_heads(text: dict[str, Any], model_type: str | None, heads: int) -> int:
    """vLLM's get_total_num_kv_heads: the per-architecture cases first, then the generic keys."""
    falcon = model_type in ("falcon", "RefinedWeb", "RefinedWebModel")
    if falcon and text.get("multi_query") and not text.get("new_decoder_architecture"):
        return 1  # Falcon-7B style multi-query: one KV head shared by all
    attn = text.get("attn_config")
    if not isinstance(attn, dict):
        attn = {}
    if model_type == "mpt":
        return _int(attn.get("kv_n_heads") or heads, "attn_config.kv_n_heads", MAX_HEADS)
    if model_type == "dbrx":
        return _int(attn.get("kv_n_heads") or heads, "attn_config.kv_n_heads", MAX_HEADS)
    key, value = _first(text, KV_HEAD_KEYS)
    return _int(value, key, MAX_HEADS) if key else heads  # plain multi-head attention


def _sliding(text: dict[str, Any], model_type: str | None, layers: int) -> tuple[int | None, int, str | None]:
    """(window, layers that use it, a note) the way vLLM's model files decide per layer."""
    window = text.get("sliding_window")
    if not isinstance(window, (int, float)) or window <= 0:
        return None, 0, None
    window = int(window)
    if text.get("use_sliding_window") is False:
        return None, 0, f"sliding_window {window} ignored: use_sliding_window is false"
    types = text.get("layer_types")
    if isinstance(types, list) and types:
        return window, sum(1 for t in types if "sliding" in str(t)), None
    pattern = text.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 1:
        return window, sum(1 for i in range(layers) if (i + 1) % pattern), None
    if model_type == "gemma2":
        return window, (layers + 1) // 2, None  # even layers are local
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and text.get("max_window_layers") is not None:
        return window, max(0, layers - int(text["max_window_layers"])), None
    return window, layers, None


def derive_max_model_len(
    text: dict[str, Any], model_type: str | None = None, vllm_version: str | None = None
) -> tuple[int | None, str | None]:
    """vLLM's _get_and_verify_max_len from the text config: the smallest of the length keys,
    model_max_length overriding, then rope scaling. (None, None) when no key is present."""
    found = [(k, float(text[k])) for k in MAX_LEN_KEYS if isinstance(text.get(k), (int, float))]
    if not found:
        return None, None
    key, derived = min(found, key=lambda kv: kv[1])
    if isinstance(text.get("model_max_length"), (int, float)):
        key, derived = "model_max_length", float(text["model_max_length"])
    rope = text.get("rope_scaling") or text.get("rope_parameters")
    if isinstance(rope, dict) and "gemma3" not in str(model_type or ""):
        rtype = str(rope.get("rope_type") or rope.get("type") or "default")
        factor = rope.get("factor")
        factor = float(factor) if isinstance(factor, (int, float)) else 1.0
        if rtype in YARN_TYPES:
            # 0.30+ takes max_position_embeddings as already scaled; an unknown version: the current rules
            if version_tuple(vllm_version, unknown=(99,)) < (0, 30):
                original = rope.get("original_max_position_embeddings")
                if isinstance(original, (int, float)):
                    derived = float(original)
                derived *= factor
        elif rtype not in ROPE_NOT_MULTIPLIED:
            derived *= factor
    if not derived <= MAX_TOKENS:  # 1e308 positions, or a rope factor of 1e308
        raise ConfigError(f"config.json: {key} gives a maximum length of {derived:g} tokens, past {MAX_TOKENS:,}")
    return int(derived), key


def quantization_bits(qcfg: Any) -> tuple[str | None, float | None]:
    """(method, bits per weight) from a quantization_config block."""
    if not isinstance(qcfg, dict):
        return None, None
    method = str(qcfg.get("quant_method") or qcfg.get("quant_algo") or "") or None
    for key in ("bits", "w_bit", "weight_bits", "num_bits"):
        if isinstance(qcfg.get(key), (int, float)):
            return method, float(qcfg[key])
    groups = qcfg.get("config_groups")
    if isinstance(groups, dict):  # compressed-tensors: the weights' num_bits of the first group
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, dict) else None
            if isinstance(weights, dict) and isinstance(weights.get("num_bits"), (int, float)):
                return method, float(weights["num_bits"])
    if qcfg.get("load_in_4bit"):
        return method or "bitsandbytes", 4.0
    if qcfg.get("load_in_8bit"):
        return method or "bitsandbytes", 8.0
    algo = str(qcfg.get("quant_algo") or "").lower()
    if "fp4" in algo:
        return method, 4.0
    if method and method.lower() in QUANT_DEFAULT_BITS:
        return method, float(QUANT_DEFAULT_BITS[method.lower()])
    return method, None
