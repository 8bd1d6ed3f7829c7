"""How many GPUs a log's server split the model over when the log does not say, and the
tensor-parallel sizes that split a quantised weight into whole groups or tiles.

Excerpts rarely carry --tensor-parallel-size, but its processes show: V0's
`(VllmWorkerProcess pid=N)` workers exist only beside a driver on another GPU, V1's
`(Worker_TP1 pid=N)` / `(VllmWorker TP1 pid=N)` / `(VllmWorker rank=1 pid=N)` name a rank, torch's
`[rank3]:` too. A single GPU shows as V1's `(Worker pid=N)` (0.10.2+, TP = PP = 1) or frames of
the single-process executors. The model's config.json says how a per-partition size came about
(intermediate_size 14336 = 4 x 3584).
"""

from __future__ import annotations

import re
from typing import Any

from vllm_doctor.knowledge.contract import CheckInput, CheckResult, check

_RANKED = re.compile(
    r"\((?:Worker_|VllmWorker[ _])(?:PP\d{1,3}_)?TP(?P<tp>\d{1,4})\b"  # (Worker_TP1 pid=) (VllmWorker TP1 pid=)
    r"|\(VllmWorker rank=(?P<rank>\d{1,4}) "  # 0.6.5-0.10.0
    r"|^\s*\[rank(?P<trank>\d{1,4})\]:"  # torch's own prefix
)
_WORKERS = re.compile(r"\((?:VllmWorkerProcess|RayWorkerWrapper) pid=")  # V0 multiproc / Ray workers
_SINGLE = re.compile(r"\(Worker pid=\d{1,9}\)|/(?:uniproc_executor|gpu_executor)\.py\"")
_PROCESS_RANK = re.compile(r"(?:^|_)TP(?P<tp>\d{1,4})$|^rank(?P<rank>\d{1,4})$")
MAX_TP = 64
_FULL_DIMS = ("intermediate_size", "moe_intermediate_size", "hidden_size")


def _texts(inp: CheckInput) -> list[str]:
    texts = [r.text for r in inp.facts.traceback]
    if inp.match is not None:
        texts += [e.text for e in inp.match.evidence]
    return texts


def _processes(inp: CheckInput) -> set[str]:
    names = {r.process for r in inp.facts.traceback if r.process}
    return names | {p for _l, _s, _n, p in inp.facts.phases if p}


def gpus_seen(inp: CheckInput) -> tuple[int, bool, str | None]:
    """(the least number of tensor-parallel ranks the log shows, whether it proves one GPU, what shows it)."""
    ranks: set[int] = set()
    workers = single = False
    for text in _texts(inp):
        for m in _RANKED.finditer(text):
            ranks.add(int(m["tp"] or m["rank"] or m["trank"]))
        workers = workers or bool(_WORKERS.search(text))
        single = single or bool(_SINGLE.search(text))
    for name in _processes(inp):
        found = _PROCESS_RANK.search(name)
        if found:
            ranks.add(int(found["tp"] or found["rank"]))
        workers = workers or name in ("VllmWorkerProcess", "RayWorkerWrapper")
    least = max(ranks) + 1 if ranks else 0
    if least > 1:
        return least, False, f"a worker of tensor-parallel rank {least - 1}"
    if workers:
        return 2, False, "worker processes beside the engine"
    return (1 if single else 0), single, "a single-GPU worker" if single else None


def _full_dimension(inp: CheckInput, per_gpu: int, tp: int | None) -> tuple[int, str, int] | None:
    """(the whole dimension a per-GPU size was cut from, its config name, the TP that cut it)."""
    shape = inp.options.shape
    config = shape.text_config if shape is not None else {}
    for key in _FULL_DIMS:
        full = config.get(key)
        if not isinstance(full, int) or full <= per_gpu or full % per_gpu:
            continue
        cut = full // per_gpu
        if cut <= MAX_TP and (tp is None or cut == tp):
            return full, key, cut
    if tp:
        return per_gpu * tp, "the whole weight", tp
    return None


_RETURNS = {"single_gpu", "multi_gpu", "tp_evidence", "tp_at_least", "tp_inferred", "quant_dimension",
            "quant_dimension_name", "quant_tp_sizes", "quant_tp_below"}  # fmt: skip


@check(reads={"tensor_parallel_size", "tp", "pipeline_parallel_size", "what", "dimension", "limit"}, returns=_RETURNS)
def quant_tp(inp: CheckInput) -> CheckResult:
    """Whether a quantised weight's shape error is a tensor-parallel split (TP > 1: stated, shown by
    the worker processes, or hinted by the message) or a kernel limit on a proven single GPU, and
    the TP sizes that cut the weight into whole groups."""
    stated = inp.get("tensor_parallel_size", "tp")
    least, single, why = gpus_seen(inp)
    out: dict[str, Any] = {}
    confidence = None
    if stated is not None:
        tp: int | None = int(stated)
        out["single_gpu"] = tp == 1
        out["tp_evidence"] = f"--tensor-parallel-size {tp}"
    elif least > 1 and not (inp.get("pipeline_parallel_size") or 1) > 1:
        tp = None
        out.update(single_gpu=False, tp_at_least=least, tp_evidence=why)
        confidence = "medium"
    else:
        tp = None
        out["single_gpu"] = single  # nothing proves one GPU: the message's own hint (per-partition sizes,
        if not single:  # "too large tensor parallel size") is taken at its word, at low confidence
            out["tp_evidence"] = "the message's own hint"
            confidence = "low"
        else:
            out["tp_evidence"] = why
    out["multi_gpu"] = not out["single_gpu"]
    dim, limit = inp.get("dimension"), inp.get("limit")
    if dim is not None and "partition" in str(inp.get("what") or ""):
        full = _full_dimension(inp, int(dim), tp)
        if full is not None:
            whole, name, cut = full
            out.update(quant_dimension=whole, quant_dimension_name=name)
            if tp is None and name != "the whole weight":
                out["tp_inferred"] = cut
            if limit:
                sizes = [t for t in range(1, MAX_TP + 1) if whole % t == 0 and (whole // t) % int(limit) == 0]
                shape = inp.options.shape
                if shape is not None:  # and that split the heads too
                    from vllm_doctor.capacity.arithmetic import tp_ok

                    sizes = [t for t in sizes if tp_ok(t, shape.attention_heads or None, shape.kv_heads or None)]
                else:  # heads unknown: the sizes almost every model's heads allow
                    sizes = [t for t in sizes if t & (t - 1) == 0]
                out["quant_tp_sizes"] = sizes[:8]
                below = [t for t in sizes if t < (tp or cut)]
                if below:
                    out["quant_tp_below"] = below[-1]
    return CheckResult(out, confidence=confidence)
