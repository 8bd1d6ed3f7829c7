"""The pictures' numbers, and the terminal's pictures: a capacity diagnosis's memory as one bar,
a queue diagnosis's samples as sparklines. Pure functions; svg.py draws the same data.

Every segment is a number vLLM printed (its memory profile, the diagnosis's numbers), or a
difference of two of them, labelled as such ("others at start (total - free)"); this machine's
GPU only when the log is from it, as NVML's own MiB. Nothing is
drawn when there is nothing to draw: no numbers, fewer than two samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vllm_doctor.data import Diagnosis, Report
from vllm_doctor.matching.expr import fmt

CAPACITY = frozenset({"cache-oom", "weights-oom", "warmup-oom", "kv-capacity", "gpu-memory-occupied"})
SLOTS_DRAWN = 8  # a KV cache of up to this many worst-case sequences is drawn one slot each


def is_queue(category: str) -> bool:
    return category.startswith("queue-") or category == "priority-preemption"


@dataclass(frozen=True)
class Segment:
    key: str  # weights activation non_torch cudagraph kv other unlisted missing free: its colour and letter
    label: str
    value: float


@dataclass(frozen=True)
class Bar:
    title: str
    unit: str  # "GiB", "tokens" or "MiB" (NVML's)
    total: float
    segments: tuple[Segment, ...]
    mark: tuple[str, float] | None = None  # a line across the bar: (label, value), e.g. total x utilization
    name: str = "KV cache"  # the terminal's label before the bar
    sum_only: bool = False  # the total is only the segments' sum (no figure of vLLM's): not printed

    def __post_init__(self) -> None:  # a negative KV cache (V0 prints one) or an empty part is not drawn
        object.__setattr__(self, "segments", tuple(s for s in self.segments if s.value > 0))


_PROFILE = (
    ("weights", "weights", "weights_gib"),
    ("activation", "activation", "activation_gib"),
    ("non_torch", "non-torch", "non_torch_gib"),
    ("cudagraph", "CUDA graphs", "cudagraph_gib"),
    ("kv", "KV cache", "kv_gib"),
)


def memory_bars(report: Report, d: Diagnosis) -> list[Bar]:
    """A capacity diagnosis's bars: what failed (one sequence against the cache, or PyTorch's
    out-of-memory figures) and the memory profile, else the cache in worst-case sequences; then
    this machine's GPU when the log is from it."""
    if d.category not in CAPACITY:
        return []
    found = [b for b in (_need(d) or _torch_oom(d), _profile(report, d)) if b is not None]
    found += [b for b in (None if found else _slots(report, d), gpu_bar(report)) if b is not None]
    return [b for b in found if b.segments and b.total > 0]


def all_bars(report: Report, upto: Diagnosis | None = None) -> list[Bar]:
    """Every capacity diagnosis's bars once, in order (those before `upto` only, if given)."""
    out: list[Bar] = []
    for d in report.diagnoses:
        if d is upto:
            break
        out += [b for b in memory_bars(report, d) if b not in out]
    return out


# (what one sequence needs, what the cache holds, unit): the pairs the cache-OOM rules state
_NEED = (
    ("needed_gib", "available_gib", "GiB"),
    ("concurrency_tokens", "kv_tokens", "tokens"),
    ("max_model_len", "kv_tokens", "tokens"),
    ("len", "kv_cache.tokens", "tokens"),
)
_UNIT_GIB = {"B": 2.0**-30, "KiB": 2.0**-20, "MiB": 2.0**-10, "GiB": 1.0, "TiB": 1024.0}


def _need(d: Diagnosis) -> Bar | None:
    n = d.numbers
    for need_name, have_name, unit_name in _NEED:
        need, have = _num(n.get(need_name)), _num(n.get(have_name))
        if need is not None and have is not None and need > have:
            unit = unit_name
            break
    else:
        return None
    short = _num(n.get("missing_gib")) if unit == "GiB" else None
    return Bar(
        f"KV cache against one sequence of --max-model-len ({fmt(need)} {unit})",
        unit,
        need,
        (
            Segment("kv", "KV cache available", have),
            Segment("missing", "short of one sequence", short if short is not None else need - have),
        ),
    )


def _torch_oom(d: Diagnosis) -> Bar | None:
    """PyTorch's out-of-memory message: the GPU's total, what was free, the allocation that failed."""
    n = d.numbers
    alloc_gib, total_gib, free_gib = (_gib(n, k) for k in ("alloc", "total", "free"))
    if alloc_gib is None or total_gib is None or free_gib is None:
        return None
    alloc, total, free = (fmt(n[k]) for k in ("alloc", "total", "free"))
    segs = [
        Segment("other", "in use (total - free)", round(total_gib - free_gib, 2)),
        Segment("free", f"free ({free} {n['free_unit']})", free_gib),
    ]
    if alloc_gib > free_gib:
        segs.append(
            Segment("missing", f"short of the {alloc} {n['alloc_unit']} allocation", round(alloc_gib - free_gib, 2))
        )
    mark = (f"GPU total {total} {n['total_unit']}", total_gib)
    return Bar(
        f"GPU memory at the out-of-memory error ({total} {n['total_unit']})",
        "GiB",
        sum(s.value for s in segs),
        tuple(segs),
        mark,
        "Memory",
        sum_only=True,
    )


def _gib(numbers: dict[str, Any], name: str) -> float | None:
    """A number and its unit ("846.0", "MiB") in GiB, to two places; None without either."""
    value, scale = _num(numbers.get(name)), _UNIT_GIB.get(str(numbers.get(f"{name}_unit")))
    return None if value is None or scale is None else round(value * scale, 2)


def _profile(report: Report, d: Diagnosis) -> Bar | None:
    m = dict(report.facts.get("memory") or {})
    for key in ("total_gib", "free_gib", "requested_gib"):
        if _num(d.numbers.get(key)) is not None:
            m[key] = d.numbers[key]
    total = _num(m.get("total_gib"))
    if m.get("kv_gib") is None:
        m["kv_gib"] = (report.facts.get("kv_cache") or {}).get("available_gib")
    segs = [Segment(k, label, v) for k, label, name in _PROFILE if (v := _num(m.get(name))) is not None and v > 0]
    others = _num(d.numbers.get("held_by_others_gib"))
    free = _num(m.get("free_gib"))
    if others is None and total is not None and free is not None and total - free > 0:
        others = round(total - free, 2)
    if others:
        segs.append(Segment("other", "others at start (total - free)", others))
    if total is None or not segs:
        return None
    rest = round(total - sum(s.value for s in segs), 2)
    requested = _num(m.get("requested_gib"))
    if rest > total * 0.005:
        segs.append(Segment("free", _rest(segs, rest, total, requested), rest))
    mark = (f"total x utilization {fmt(requested)} GiB", requested) if requested else None
    return Bar(
        f"GPU memory ({fmt(total)} GiB)", "GiB", max(total, sum(s.value for s in segs)), tuple(segs), mark, "Memory"
    )


def gpu_bar(report: Report) -> Bar | None:
    """This machine's GPU 0 now, from NVML, when the log is from this machine: each process's
    MiB and the free MiB, as the report's GPU line states them."""
    gpu = report.facts.get("gpu") or {}
    if gpu.get("this_host") is not True or not gpu.get("available") or not gpu.get("devices"):
        return None
    dev = gpu["devices"][0]
    segs = [Segment("other", f"pid {p['pid']} {p['name']}", p["used_mib"]) for p in dev["processes"] if p["used_mib"]]
    unlisted = dev["used_mib"] - sum(s.value for s in segs)
    if unlisted > 0:
        segs.append(Segment("unlisted", "used, by no process listed", unlisted))
    segs.append(Segment("free", "free", dev["free_mib"]))
    return Bar(
        f"GPU {dev['index']} {dev['name']} now (NVML, this machine)",
        "MiB",
        dev["total_mib"],
        tuple(segs),
        None,
        "GPU now",
    )


def _rest(segs: list[Segment], rest: float, total: float, requested: float | None) -> str:
    """What the memory outside every segment is, as far as the numbers say."""
    if all(s.key == "other" for s in segs):
        return "free at start"
    if requested is not None and abs(rest - (total - requested)) < 0.05:
        return "beyond utilization"
    return "not accounted for"


def _slots(report: Report, d: Diagnosis) -> Bar | None:
    tokens, length = _num(d.numbers.get("kv_tokens")), _num(d.numbers.get("max_model_len"))
    seqs = d.numbers.get("worst_case_sequences")
    if tokens is None or not length or not isinstance(seqs, int) or seqs < 1:
        return None
    if seqs <= SLOTS_DRAWN:
        segs = [Segment("kv", "sequence of --max-model-len", length) for _ in range(seqs)]
    else:
        segs = [Segment("kv", f"{seqs} sequences of --max-model-len", seqs * length)]
    rest = tokens - seqs * length
    if rest > 0:
        segs.append(Segment("free", "less than one more sequence", rest))
    return Bar(f"KV cache ({fmt(tokens)} tokens) in sequences of --max-model-len", "tokens", tokens, tuple(segs))


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


# ---- the terminal ------------------------------------------------------------------------------

LETTER = {"weights": "W", "activation": "A", "non_torch": "N", "cudagraph": "G", "kv": "K", "other": "O"}
LETTER |= {"unlisted": "U", "missing": "!", "free": "."}
COLOUR = {"weights": "blue", "activation": "magenta", "non_torch": "yellow", "cudagraph": "cyan", "kv": "green"}
COLOUR |= {"other": "bright_black", "unlisted": "white", "missing": "red", "free": "white"}
BAR_WIDTH = 48
SPARK_WIDTH = 32
RAMP = "▁▂▃▄▅▆▇█"
PLAIN_RAMP = "_.:-=+*#"


def cells(bar: Bar, width: int = BAR_WIDTH) -> list[int]:
    """Characters per segment, summing to `width`; every segment gets at least one."""
    raw = [s.value / bar.total * width if bar.total else 0 for s in bar.segments]
    out = [max(1, int(r)) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - int(raw[i]), reverse=True):
        if sum(out) >= width:
            break
        out[i] += 1
    while sum(out) > width and max(out) > 1:
        out[out.index(max(out))] -= 1
    return out


def bar_lines(bar: Bar, colour: bool) -> list[Any]:
    """The bar and its legend, as rich Text (colour) or plain text with one letter per segment."""
    from rich.text import Text

    line = Text(f"  {bar.name:<9} ", style="bold" if colour else "")
    for i, (seg, n) in enumerate(zip(bar.segments, cells(bar), strict=True)):
        alt = i % 2 == 1 and seg.key == "kv" == bar.segments[i - 1].key  # neighbouring KV slots stay apart
        if colour:
            line.append(_swatch(seg.key) * n, style=f"not bold {'bright_green' if alt else COLOUR[seg.key]}")
        else:
            line.append((LETTER[seg.key].lower() if alt else LETTER[seg.key]) * n)
    line.append("" if bar.sum_only else f"  {fmt(bar.total)} {bar.unit}")
    out = [line]
    row = Text("  ")
    items = [
        (seg.key, f"{f'{count} x ' if count > 1 else ''}{seg.label} {fmt(seg.value)} {bar.unit}")
        for seg, count in legend(bar)
    ]
    if bar.mark:
        items.append(("mark", f"{bar.mark[0]}"))
    for key, item in items:
        if row.cell_len + len(item) + 5 > 79:
            out.append(row)
            row = Text("  ")
        elif row.plain.strip():
            row.append("   ")
        mark = "|" if key == "mark" else _swatch(key) if colour else LETTER[key]
        row.append(mark + " ", style=COLOUR.get(key, "") if colour else "")
        row.append(item, style="dim" if colour and key == "mark" else "")
    out.append(row)
    return out


def _swatch(key: str) -> str:
    return "░" if key == "missing" else "█"


def legend(bar: Bar) -> list[tuple[Segment, int]]:
    """One legend entry per kind and label, with how many segments it stands for (KV slots): the
    terminal's legend and the SVG's."""
    seen: dict[tuple[str, str], list[Segment]] = {}
    for s in bar.segments:
        seen.setdefault((s.key, s.label), []).append(s)
    return [(segs[0], len(segs)) for segs in seen.values()]


def points(report: Report, name: str) -> list[tuple[int, float]]:
    """(line, value) of every drawn sample that has `name`."""
    return [(p["line"], float(p[name])) for p in report.series if p.get(name) is not None]


def spark(series: list[tuple[int, float]], top: float, width: int = SPARK_WIDTH, colour: bool = True) -> str:
    """The series in at most `width` characters, each the highest sample of its stretch of lines."""
    ramp = RAMP if colour else PLAIN_RAMP
    if len(series) > width:
        lo, hi = series[0][0], series[-1][0]
        buckets: list[float | None] = [None] * width
        for x, v in series:
            i = min(width - 1, (x - lo) * width // max(1, hi - lo + 1))
            buckets[i] = max(v, buckets[i] or 0.0)
        values, last = [], 0.0
        for b in buckets:
            last = b if b is not None else last
            values.append(last)
    else:
        values = [v for _, v in series]
    return "".join(ramp[min(len(ramp) - 1, int(v / top * (len(ramp) - 1) + 0.5)) if top > 0 else 0] for v in values)


def queue_lines(report: Report, colour: bool) -> list[str]:
    """Waiting and KV usage over the samples, when two or more were drawn; the max is the report's."""
    waiting, kv = points(report, "waiting"), points(report, "kv_usage_pct")
    stats = report.facts.get("stats") or {}
    out = []
    times = [p["time"] for p in report.series if p.get("time")]
    span = f", {times[0][6:]} to {times[-1][6:]}" if len(times) > 1 else ""
    top = stats.get("waiting_max") or max((v for _, v in waiting), default=0)
    if len(waiting) > 1:
        out.append(f"  Waiting   {spark(waiting, top, colour=colour)}  max {fmt(top)}{span}")
    if len(kv) > 1:
        kv_max = stats.get("kv_usage_max_pct")
        out.append(f"  KV usage  {spark(kv, 100.0, colour=colour)}  max {fmt(kv_max)}%")
    return out


def show(console: Any, report: Report, d: Diagnosis) -> None:
    """Print the diagnosis's pictures on a rich console: colour blocks on a terminal, letters and
    ASCII under NO_COLOR and in pipes."""
    if console.width < 80:
        return  # a bar squeezed under 80 columns reads as noise: the summary has the numbers
    colour = not console.no_color and console.color_system is not None
    drawn = all_bars(report, upto=d)  # a profile or a GPU shared by two diagnoses: drawn once
    for bar in memory_bars(report, d):
        if bar not in drawn:
            drawn.append(bar)
            for line in bar_lines(bar, colour):
                console.print(line)
    for text in queue_lines(report, colour) if is_queue(d.category) else []:
        console.print(text, markup=False, highlight=False)
