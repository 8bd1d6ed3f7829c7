"""`vllm-doctor plan`: the capacity arithmetic before a server starts, from a model's config.json
(or its shape given by hand) and the GPU's memory, shown step by step with a ready `vllm serve` line.

Build a Plan with make_plan(PlanRequest); render/plan.py renders it (text, markdown, json).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from vllm_doctor.capacity import arithmetic as cap
from vllm_doctor.capacity import defaults, kvcache, serving, start
from vllm_doctor.capacity.arithmetic import Budget, Size, Step, fmt_int, fmt_list, fmt_size
from vllm_doctor.capacity.gpu import GpuSnapshot, headroom
from vllm_doctor.capacity.shape import QUANT_DEFAULT_BITS, ConfigError, ModelShape
from vllm_doctor.errors import DoctorError

DEFAULT_TP_LIMIT = 8  # TP sizes listed when the GPU count is unknown


class PlanError(DoctorError):
    """Input the plan cannot work with; the message is one line."""


@dataclass
class PlanRequest:
    models: list[str] = field(default_factory=list)  # repo ids or local directories
    configs: list[str] = field(default_factory=list)  # --config files, one model each
    params: str | None = None  # by hand: "7B"
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    dtype: str | None = None
    gpu_memory: str = "auto"  # "80GB", "80GiB" or "auto" (NVML)
    gpus: int | None = None
    utilization: float = field(default_factory=lambda: defaults.utilization(None))  # the release's (0.92 for 0.32)
    max_model_len: int | None = None
    tp: int = 1
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    target_concurrency: int | None = None
    block_size: int = 0  # 0: vLLM's default, 16, or 128 on the CPU backend (VLLM_CPU_KVCACHE_SPACE)
    prompt_len: int | None = None
    samples: int = 1
    overhead: str | None = None  # activation peak + non-torch + CUDA graphs, per GPU
    offline: bool = False
    kv_cache_memory: str | None = None  # --kv-cache-memory-bytes: the KV space per GPU, set explicitly
    cpu_kvcache_space: str | None = None  # VLLM_CPU_KVCACHE_SPACE (whole GiB): the CPU backend's KV space
    device: str | None = None  # "cpu": the CPU backend (also when its KV space is given)
    hybrid_manager: bool = True  # False: --disable-hybrid-kv-cache-manager
    prefix_caching: bool = True  # False: --no-enable-prefix-caching
    max_num_batched_tokens: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # the variables of the start (VLLM_ALLOW_LONG_MAX_MODEL_LEN, ...)

    @property
    def cpu(self) -> bool:
        return self.cpu_kvcache_space is not None or str(self.device or "").lower() == "cpu"


@dataclass
class ModelPlan:
    name: str
    shape: ModelShape
    dtype: str
    kv_dtype: str
    element_bytes: float
    budget: Budget
    utilization: float
    max_model_len: int | None
    max_model_len_from: str  # "--max-model-len" or "the model's maximum"
    steps: list[Step]
    valid_tp_sizes: list[int]
    target_concurrency: int | None
    serve_command: str  # "" when no TP size up to the GPUs leaves the cache room
    serve_tp: int | None = None  # the TP size the serve line uses
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def sequences(self) -> int | None:
        return self.budget.sequences(self.max_model_len) if self.max_model_len else None

    @property
    def max_model_len_for_target(self) -> int | None:
        if not self.target_concurrency:
            return None
        return self.budget.max_len_for(self.target_concurrency)

    @property
    def fits(self) -> bool:
        return not self.problems


@dataclass
class Plan:
    gpu_bytes: float
    gpu_unit: str
    gpu_source: str
    gpus: int
    models: list[ModelPlan]
    utilization: float
    block_size: int
    block_examples: list[Step] = field(default_factory=list)
    split: list[float] | None = None  # fractions when several models share the card
    split_failed: bool = False
    snapshot: GpuSnapshot | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.split_failed and all(m.fits for m in self.models)


# ---------------------------------------------------------------------------------------------
# Building the plan


def make_plan(req: PlanRequest, snapshot: GpuSnapshot | None = None) -> Plan:
    """Raises PlanError (one line) for input it cannot work with."""
    try:
        space = serving.kv_space(req.kv_cache_memory, req.cpu_kvcache_space)
    except ValueError as e:
        raise PlanError(str(e)) from None
    cpu = req.cpu
    req = replace(req, block_size=req.block_size or (kvcache.CPU_BLOCK_SIZE if cpu else cap.DEFAULT_BLOCK_SIZE))
    _check_numbers(req)
    shapes = _shapes(req)
    snap_notes: list[str] = []
    if space and (cpu or (str(req.gpu_memory).lower() == "auto" and not (snapshot and snapshot.available))):
        gpu_bytes, unit, source = 0.0, "GiB", f"none needed: {space[1]} sets the KV space"
    else:
        gpu_bytes, unit, source, snap_notes = _gpu_memory(req, snapshot)
    present = len(snapshot.devices) if snapshot and snapshot.available else 0
    gpus = req.gpus or present or req.tp
    tp_limit = req.gpus or present or max(DEFAULT_TP_LIMIT, req.tp)  # "up to the GPUs present", when known
    if req.tp > gpus:
        raise PlanError(f"--tensor-parallel-size {req.tp} needs {req.tp} GPUs; {gpus} given (--gpus) or present (NVML)")
    try:
        overhead = cap.parse_size(req.overhead).bytes if req.overhead else None  # None: the default, as check's
    except ValueError as e:  # -100GB, nanGB
        raise PlanError(f"--overhead {e}") from None
    several = len(shapes) > 1
    models = [
        _model_plan(req, name, shape, gpu_bytes, unit, overhead, tp_limit, req.utilization, space,
                    serving.FIRST_PORT + i if several else None)
        for i, (name, shape) in enumerate(shapes)
    ]  # fmt: skip
    plan = Plan(gpu_bytes, unit, source, gpus, models, req.utilization, req.block_size, snapshot=snapshot,
                notes=snap_notes)  # fmt: skip
    if several:
        _split(plan, req, gpu_bytes, unit, overhead, tp_limit, space)
    plan.block_examples = _block_examples(req, models[0] if len(models) == 1 else None)
    return plan


def _check_numbers(req: PlanRequest) -> None:
    if not 0 < req.utilization <= 1:
        raise PlanError(f"--gpu-memory-utilization {req.utilization} must be in (0, 1]")
    for flag, value in (
        ("--tensor-parallel-size", req.tp),
        ("--block-size", req.block_size),
        ("--samples", req.samples),
    ):
        if value is not None and value < 1:
            raise PlanError(f"{flag} must be at least 1")


def _shapes(req: PlanRequest) -> list[tuple[str, ModelShape]]:
    from vllm_doctor.capacity import modelcfg

    by_hand = any(v is not None for v in (req.layers, req.kv_heads, req.head_dim, req.heads))
    out: list[tuple[str, ModelShape]] = []
    for ref in req.models:
        shape, note = modelcfg.load(ref, offline=req.offline)
        if shape is None:  # explain goes on without a config; a plan cannot
            why = (note or f"{ref}: no config.json").replace("; going on without the model config", "")
            raise PlanError(f"{why}; give --config FILE, or the shape with --layers --kv-heads --head-dim --params")
        out.append((ref, shape))
    for path in req.configs:
        try:
            shape, _ = modelcfg.load(None, config_file=path, offline=req.offline)
        except ConfigError as e:
            raise PlanError(str(e)) from None
        assert shape is not None  # an explicit --config either loads or raises ConfigError
        out.append((path, shape))
    if not out:
        layers, kv_heads, head_dim = req.layers, req.kv_heads, req.head_dim
        if layers is None or kv_heads is None or head_dim is None:
            given = (("--layers", layers), ("--kv-heads", kv_heads), ("--head-dim", head_dim))
            missing = [flag for flag, value in given if value is None]
            raise PlanError(
                "give a MODEL (repo id or directory), --config FILE, or the shape by hand: "
                + ", ".join(missing)
                + " missing"
            )
        shape = ModelShape(layers=layers, attention_heads=req.heads or 0, kv_heads=kv_heads,
                           head_dim=head_dim, name=None, source="given on the command line")  # fmt: skip
        out.append(("<model>", shape))
    elif by_hand:
        for _, shape in out:  # a flag given by hand overrides the config
            shape.layers = req.layers or shape.layers
            shape.attention_heads = req.heads or shape.attention_heads
            shape.kv_heads = req.kv_heads or shape.kv_heads
            shape.head_dim = req.head_dim or shape.head_dim
    if req.params:
        try:
            count = cap.parse_count(req.params)
        except ValueError as e:
            raise PlanError(f"--params {e}") from None
        for _, shape in out:
            shape.params, shape.params_source, shape.params_by_dtype, shape.tally = count, "given", None, None
    for name, shape in out:
        if not shape.params:
            raise PlanError(f"{name}: the parameter count is unknown: pass --params (e.g. 7B)")
    return out


def _gpu_memory(req: PlanRequest, snapshot: GpuSnapshot | None) -> tuple[float, str, str, list[str]]:
    notes: list[str] = []
    if str(req.gpu_memory).lower() != "auto":
        try:
            size: Size = cap.parse_size(req.gpu_memory)
        except ValueError as e:
            raise PlanError(f"--gpu-memory {e}") from None
        return size.bytes, size.unit, f"--gpu-memory {req.gpu_memory}", notes
    if snapshot is None or not snapshot.available:
        reason = snapshot.reason if snapshot else "no GPU snapshot"
        raise PlanError(f"--gpu-memory auto needs NVML (GPU checks skipped: {reason}); give --gpu-memory 80GB or 80GiB")
    count = req.gpus or req.tp
    devices = snapshot.devices[:count]
    smallest = min(devices, key=lambda d: d.total_mib)
    for d in devices:
        if d.used_mib > 0:
            notes.append(
                f"GPU {d.index} already has {d.used_mib:,} MiB in use by {len(d.processes)} process(es): vLLM's fraction "
                f"must shrink to at most {headroom(d):.2f} (free {d.free_mib:,} of {d.total_mib:,} MiB)"
            )
    return smallest.total_mib * cap.UNITS["MIB"], "GiB", f"NVML: {smallest.name}, {smallest.total_mib:,} MiB", notes


def _weights(req: PlanRequest, shape: ModelShape, dtype: str) -> tuple[float, str]:
    """(bytes of weights, the work behind it): the safetensors headers as vLLM loads them, else the
    parameter count at the bytes its quantisation stores (an estimate, said so)."""
    from vllm_doctor.capacity import weights

    quant = req.quantization
    # a quantised checkpoint loads as stored; an unquantised one as stored, or quantised online to fp8
    if shape.tally is not None and (not quant or shape.quant_method or quant.lower().startswith("fp8")):
        return weights.loaded_bytes(shape.tally, dtype, None if shape.quant_method else quant)
    bits = None
    if quant:
        q = quant.lower()
        bits = shape.quant_bits if shape.quant_bits else QUANT_DEFAULT_BITS.get(q)
        if bits is None:
            raise PlanError(
                f"--quantization {quant}: bits per weight unknown; give a model whose config.json has a quantization_config"
            )
    elif shape.quant_bits:
        bits = shape.quant_bits
    if shape.params_source != "given" and (quant or shape.quant_method):
        return weights.estimated_bytes(shape, dtype, quant, bits)
    per_param, how = cap.weight_bytes_per_param(dtype, bits)
    source = "" if shape.params_source == "given" else f" ({shape.params_source})"
    params = shape.params
    assert params, "_shapes refuses a model without a parameter count"
    return params * per_param, f"{fmt_int(params)} params{source} x {per_param:g} B ({how})"


def _model_plan(
    req: PlanRequest, name: str, shape: ModelShape, gpu_bytes: float, unit: str, overhead: float | None, tp_limit: int,
    utilization: float, space: tuple[float, str] | None = None, port: int | None = None,
) -> ModelPlan:  # fmt: skip
    dtype = cap.serving_dtype(req.dtype, shape.dtype)
    if cap.dtype_bytes(dtype) is None:
        raise PlanError(f"--dtype {dtype}: unknown (bfloat16, float16, float32, fp8)")
    if req.kv_cache_dtype.lower() != "auto" and cap.dtype_bytes(req.kv_cache_dtype) is None:
        raise PlanError(f"--kv-cache-dtype {req.kv_cache_dtype}: unknown (auto, fp8, fp8_e4m3, fp8_e5m2)")
    element_bytes, kv_dtype = cap.kv_element_bytes(req.kv_cache_dtype, dtype)
    weights, weights_work = _weights(req, shape, dtype)
    bpt = cap.kv_bytes_per_token(shape, element_bytes, req.tp)
    reserve, how = overhead or 0.0, ""
    if overhead is None and not (space or req.cpu):  # check's default (preflight/fit.py): one verdict for both
        reserve, how = serving.default_overhead(gpu_bytes, shape.params or 0, req.tp)
    budget = Budget(gpu_bytes, utilization, weights, reserve, bpt, req.tp, req.block_size)
    if space:
        budget = serving.FixedBudget(gpu_bytes, utilization, weights, reserve, bpt, req.tp, req.block_size, *space)
    length = req.max_model_len or shape.derived_max_model_len
    device = "cpu" if req.cpu else "cuda"
    budget.kv_hybrid = start.hybrid_on(start.StartQuery(shape, hybrid_manager=req.hybrid_manager, env=req.env))
    budget.kv_prefix = req.prefix_caching
    layout_note = cap.size_as_v1(budget, shape, element_bytes, length, device, req.max_num_batched_tokens)
    if req.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip() not in ("1", "true"):  # no fit past the model's maximum
        budget.length_cap = shape.derived_max_model_len or budget.length_cap
    lay = budget.kv_layout
    if lay is not None and lay.plain:  # every layer full attention (the hybrid manager off too): the page's bytes
        budget.bytes_per_token = bpt = lay.page_bytes // lay.block_size
    length_from = "--max-model-len" if req.max_model_len else "the model's maximum"
    valid = cap.valid_tp_sizes(shape.attention_heads or None, shape.kv_heads, tp_limit)
    mp = ModelPlan(name, shape, dtype, kv_dtype, element_bytes, budget, utilization, length, length_from, [], valid,
                   req.target_concurrency, "")  # fmt: skip
    mp.steps = _steps(mp, weights_work, unit)
    if how:
        mp.notes.append(f"the steps and the serve line reserve {fmt_size(reserve, 'GiB')} per GPU beside the cache, "
                        f"as check does: {how}; --overhead 2GB sets it instead")  # fmt: skip
    if budget.cache_bytes <= 0:
        mp.problems.append(
            f"no room for the KV cache: the weights ({fmt_size(budget.weights_per_gpu, unit)} per GPU) and overheads "
            f"take all of {fmt_size(gpu_bytes, unit)} x {utilization:.2f}"
        )
    elif length and shape.derived_max_model_len and length > budget.length_cap:  # vLLM refuses it before the cache
        mp.problems.append(
            f"--max-model-len {fmt_int(length)} is above the model's maximum {fmt_int(shape.derived_max_model_len)} "
            f"({shape.max_len_key}); vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    elif length and budget.longest_sequence < length:
        mp.problems.append(
            f"one {fmt_int(length)}-token sequence does not fit: the longest is {fmt_int(budget.longest_sequence)} "
            f"(use --max-model-len {budget.longest_sequence}, --kv-cache-dtype fp8, or a larger TP)"
        )
    if req.tp not in valid and (shape.attention_heads or shape.kv_heads):
        mp.problems.append(f"--tensor-parallel-size {req.tp} does not divide the heads; valid sizes: {fmt_list(valid)}")
    if budget.modelled:
        mp.notes.append(layout_note)
    mp.notes.extend(shape.notes)
    mp.serve_command = _serve_command(req, mp, name in req.configs, tp_limit, port)
    if mp.serve_tp and mp.serve_tp != req.tp:  # the plan is the serve line's: its steps and verdict at its TP
        chosen = _model_plan(replace(req, tp=mp.serve_tp), name, shape, gpu_bytes, unit, overhead, tp_limit,
                             utilization, space, port)  # fmt: skip
        chosen.notes.insert(0, f"--tensor-parallel-size {req.tp} does not fit: {'; '.join(mp.problems)}; "
                               f"the plan is for {mp.serve_tp}, which does")  # fmt: skip
        return chosen
    return mp


def _steps(mp: ModelPlan, weights_work: str, unit: str) -> list[Step]:
    b, shape = mp.budget, mp.shape
    per_gpu = f" / TP {b.tp} = {fmt_size(b.weights_per_gpu, unit)} per GPU" if b.tp > 1 else ""
    steps = [
        Step("1 weights", weights_work + per_gpu, fmt_size(b.weights_bytes, unit)),
        Step(
            "2 KV cache memory",
            b.work(unit)
            if isinstance(b, serving.FixedBudget)
            else f"{fmt_size(b.total_bytes, unit)} x {mp.utilization:.2f} - {fmt_size(b.weights_per_gpu, unit)} "
            f"weights - {fmt_size(b.overhead_bytes, unit)} overheads"
            + (f": short by {fmt_size(-b.cache_bytes, unit)}" if b.cache_bytes < 0 else ""),
            fmt_size(max(b.cache_bytes, 0), unit),  # never a negative memory: the work says the shortfall
        ),
        Step(
            "3 KV bytes per token",
            cap.kv_formula(shape, mp.element_bytes, mp.kv_dtype, b.tp),
            f"{fmt_int(b.bytes_per_token)} B",
        ),
    ]
    if b.modelled and mp.max_model_len:
        steps += cap.layout_steps(b, mp.max_model_len, unit)
    else:
        steps += _seed_steps(mp, unit)
    target = mp.max_model_len_for_target
    if mp.target_concurrency:
        steps.append(
            Step(
                f"max-model-len for {mp.target_concurrency} sequences",
                f"the longest at which {mp.target_concurrency} requests' blocks fit in {fmt_int(b.blocks)}"
                if b.modelled
                else f"{fmt_int(b.tokens)} / {mp.target_concurrency}, down to whole blocks of {b.block_size}",
                fmt_int(target or 0),
            )
        )
    return steps


def _serve_command(req: PlanRequest, mp: ModelPlan, from_config: bool, tp_limit: int, port: int | None) -> str:
    """The line that starts: the model by name, reserving the default overhead when --overhead is not
    given, at the first TP size from --tensor-parallel-size up whose cache holds the length asked for
    (or has room at all, for the model's maximum). "" when none up to the GPUs does."""
    b, shape = mp.budget, mp.shape
    cpu = req.cpu  # TP on the CPU backend needs NUMA nodes: keep it, shorten the length
    need = mp.max_model_len if req.max_model_len and not cpu else None
    chosen = None
    for tp in [] if cpu else [t for t in mp.valid_tp_sizes if req.tp <= t <= tp_limit]:
        extra = b.overhead_bytes  # the steps' reserve; the default is by TP (its non-torch memory)
        if not req.overhead and not isinstance(b, serving.FixedBudget):
            extra, _how = serving.default_overhead(b.total_bytes, shape.params or 0, tp)
        bpt = cap.kv_bytes_per_token(shape, mp.element_bytes, tp)
        trial = replace(b, tp=tp, overhead_bytes=extra, bytes_per_token=bpt)
        if serving.fits(trial, need):
            chosen = trial
            break
    if cpu and serving.fits(b, None):
        chosen = b
    if chosen is None:
        mp.notes.append(f"no --tensor-parallel-size up to {tp_limit} leaves the KV cache room"
                        + (f" for {fmt_int(need)} tokens" if need else "") + ": no serve line")  # fmt: skip
        return ""
    mp.serve_tp = chosen.tp
    length = mp.max_model_len
    target = cap.max_len_for(chosen.tokens, mp.target_concurrency, chosen.block_size) if mp.target_concurrency else None
    if target and (not length or target < length):
        length = target
    if length and chosen.longest_sequence and length > chosen.longest_sequence:
        length = chosen.longest_sequence
    length = serving.allowed_length(length, shape, req.env, mp.notes)
    flags = serving.cache_flags(req.hybrid_manager, req.prefix_caching, req.max_num_batched_tokens)
    if req.dtype:
        flags += ["--dtype", req.dtype]
    if req.kv_cache_dtype and req.kv_cache_dtype != "auto":
        flags += ["--kv-cache-dtype", req.kv_cache_dtype]
    if req.quantization:
        flags += ["--quantization", req.quantization]
    if req.block_size != (kvcache.CPU_BLOCK_SIZE if req.cpu else cap.DEFAULT_BLOCK_SIZE):
        flags += ["--block-size", str(req.block_size)]
    line = serving.command(serving.model_ref(mp.name, from_config), length, chosen, mp.utilization, flags, port)
    return serving.with_env(line, req.env)


def _split(
    plan: Plan, req: PlanRequest, gpu_bytes: float, unit: str, overhead: float | None, tp_limit: int,
    space: tuple[float, str] | None,
) -> None:  # fmt: skip
    """Several models on one card: the fraction each gets, within --gpu-memory-utilization together."""
    needs = []
    for mp in plan.models:
        if not mp.max_model_len:
            raise PlanError(f"{mp.name}: its maximum length is unknown; give --max-model-len")
        needs.append(mp.budget.bytes_for(req.target_concurrency or 1, mp.max_model_len))
    fractions = cap.split_card(needs, gpu_bytes, req.utilization)
    if fractions is None:
        plan.split_failed = True
        need = sum(needs) / gpu_bytes
        plan.notes.append(
            f"the models do not fit together: they need {need:.2f} of the card to start, more than "
            f"--gpu-memory-utilization {req.utilization:.2f}"
        )
        return
    plan.split = fractions
    plan.models = [
        _model_plan(req, mp.name, mp.shape, gpu_bytes, unit, overhead, tp_limit, f, space, serving.FIRST_PORT + i)
        for i, (mp, f) in enumerate(zip(plan.models, fractions, strict=False))
    ]
    plan.notes.append(
        f"fractions sum to {sum(fractions):.2f} of the card (within --gpu-memory-utilization {req.utilization:.2f}); "
        "start the servers one after another: each checks at startup that its fraction is still free"
    )


def _block_examples(req: PlanRequest, mp: ModelPlan | None) -> list[Step]:
    b = req.block_size
    out = []
    if mp and mp.max_model_len:
        blocks, wasted = cap.blocks_for(mp.max_model_len, b)
        out.append(Step(f"a {fmt_int(mp.max_model_len)}-token sequence", f"ceil({fmt_int(mp.max_model_len)} / {b})",
                        f"{fmt_int(blocks)} blocks, {wasted} slots empty"))  # fmt: skip
    if req.prompt_len:
        blocks, wasted = cap.blocks_for(req.prompt_len, b)
        out.append(Step(f"a {fmt_int(req.prompt_len)}-token prompt", f"ceil({req.prompt_len} / {b})",
                        f"{blocks} blocks, {wasted} slots empty in the last"))  # fmt: skip
        if req.samples > 1:
            unshared, shared = cap.sampling_blocks(req.prompt_len, req.samples, b)
            out.append(Step(f"{req.samples} samples of that prompt", f"{req.samples} x {blocks} unshared, {blocks} shared",
                            f"{unshared} blocks unshared vs {shared} shared"))  # fmt: skip
    return out


def _seed_steps(mp: ModelPlan, unit: str) -> list[Step]:
    """One plain full-attention group: the seed's steps, memory / bytes per token."""
    b = mp.budget
    steps = [
        Step(
            "4 tokens that fit",
            f"{fmt_size(max(b.cache_bytes, 0), unit)} / {fmt_int(b.bytes_per_token)} B",
            f"{fmt_int(b.tokens)} (about {cap.about(b.tokens)})",
        )
    ]
    if mp.max_model_len:
        steps.append(
            Step(
                f"5 sequences at {fmt_int(mp.max_model_len)}",
                f"{fmt_int(b.tokens)} / {fmt_int(mp.max_model_len)} ({mp.max_model_len_from}), "
                "every sequence at full length",
                fmt_int(mp.sequences or 0),
            )
        )
    bs = b.kv_layout.block_size if b.kv_layout else b.block_size
    steps.append(
        Step(
            "longest sequence",
            f"({fmt_int(b.blocks)} blocks of {bs} - 1 null block) x {bs}",
            fmt_int(b.longest_sequence),
        )
    )
    return steps
