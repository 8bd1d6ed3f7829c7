"""The sizing checks of a started server: tensor parallelism where the weights fit one GPU
(tp_unneeded), and several vLLM servers sharing a GPU whose memory fractions add up to a card or
more (gpu_sharing, from this machine's NVML process list and each server's command line); and the
weights per GPU the cache-oom fit sizes TP with (weights_per_gpu): vLLM's own "Model loading
took", else capacity/weights.per_gpu (the headers as vLLM loads them, else an estimate, said so)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm_doctor.knowledge.contract import CheckInput, CheckResult, check

if TYPE_CHECKING:
    from vllm_doctor.capacity.shape import ModelShape

WEIGHTS_READS = frozenset({"memory.weights_gib", "weights_gib", "dtype", "quantization"})


def weights_per_gpu(inp: CheckInput, shape: ModelShape, tp: int) -> tuple[float, str | None]:
    """(bytes of weights on each GPU, where the figure comes from; None when the log states it):
    vLLM's own figure, else capacity/weights.per_gpu at the log's dtype and quantization."""
    from vllm_doctor.capacity import arithmetic as cap
    from vllm_doctor.capacity import weights

    logged = inp.get("memory.weights_gib", "weights_gib")
    if logged is not None:
        return float(logged) * cap.GIB, None
    return weights.per_gpu(shape, tp, inp.get("dtype"), inp.get("quantization"))


@check(
    reads={"tensor_parallel_size", "pipeline_parallel_size", "weights_gib", "memory.total_gib"},
    returns={"tp_unneeded", "weights_total_gib", "card_gib", "weights_share_pct"},
)
def tp_unneeded(inp: CheckInput) -> CheckResult:
    """TP > 1 while the whole model's weights (per-GPU weights x TP) take at most half of one card:
    the all-reduce of every layer adds latency that one GPU would not pay."""
    tp, pp = inp.get("tensor_parallel_size"), inp.get("pipeline_parallel_size")
    per_gpu, card = inp.get("weights_gib"), inp.get("memory.total_gib")
    snap = inp.options.gpu_snapshot
    if card is None and snap is not None and snap.available and snap.devices:
        card = round(min(d.total_mib for d in snap.devices) / 1024, 1)
    if not tp or int(tp) < 2 or (pp and int(pp) > 1) or per_gpu is None or not card:
        return CheckResult({})
    total = round(float(per_gpu) * int(tp), 1)
    out: dict[str, Any] = {
        "weights_total_gib": total,
        "card_gib": round(float(card)),
        "weights_share_pct": round(100 * total / float(card), 1),
    }
    from vllm_doctor.capacity.weights import fits_one_gpu

    out["tp_unneeded"] = fits_one_gpu(total, float(card))
    return CheckResult(out)


@check(
    reads=set(),  # this machine's GPU snapshot (options), each process's server from capacity/colocated.py
    returns={"gpu_oversubscribed", "shared_gpu", "shared_gpu_servers", "utilization_sum", "servers_on_gpu"},
)
def gpu_sharing(inp: CheckInput) -> CheckResult:
    """Several vLLM servers on one GPU: their --gpu-memory-utilization fractions must sum under 1.0."""
    snap = inp.options.gpu_snapshot
    if snap is None or not snap.available:
        return CheckResult({})
    worst: tuple[float, int, list[tuple[int, str | None, float]]] | None = None
    for device in snap.devices:
        servers: dict[int, tuple[int, str | None, float]] = {}
        for p in device.processes:
            if p.server_pid is not None and p.server_utilization is not None:
                servers[p.server_pid] = (p.server_pid, p.server_model, p.server_utilization)
        if len(servers) >= 2:
            total = round(sum(s[2] for s in servers.values()), 2)
            if worst is None or total > worst[0]:
                worst = (total, device.index, sorted(servers.values()))
    if worst is None:
        return CheckResult({})
    total, index, shares = worst
    from vllm_doctor.capacity.colocated import oversubscribed

    named = ", ".join(f"pid {pid}{f' ({model})' if model else ''} {util:g}" for pid, model, util in shares)
    return CheckResult(
        {
            "gpu_oversubscribed": oversubscribed(util for _, _, util in shares),
            "shared_gpu": index,
            "shared_gpu_servers": named,
            "utilization_sum": total,
            "servers_on_gpu": len(shares),
        }
    )
