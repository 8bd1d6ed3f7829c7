"""The report's pictures as SVG, drawn here (no plotting library, no script, no font to fetch):
the memory bars (bars.all_bars), the queue over time with the failure marked, the restarts.

Each chart is a standalone <svg> that scales to its container (viewBox, width 100%), so the same
text is a file beside report.md (memory.svg, queue.svg) and inline in report.html. Elements carry
classes a test can find: axis, legend, failure-marker, segment, series. Every number drawn is the
report's: vLLM's samples and memory figures, the diagnosis's numbers; none is interpolated.
"""

from __future__ import annotations

from markupsafe import escape  # the one escaper of the HTML page too (html.py's template)

from vllm_doctor.data import Life, Report
from vllm_doctor.matching.expr import fmt
from vllm_doctor.render.bars import Bar, all_bars, is_queue, legend

WIDTH = 720
_GAP = 3.0  # between two starts on the restart timeline
FILL = {"weights": "#4c78a8", "activation": "#b279a2", "non_torch": "#eeca3b", "cudagraph": "#72b7b2"}
FILL |= {"kv": "#54a24b", "other": "#9d9d9d", "unlisted": "#c7c7c7", "missing": "#e45756", "free": "#e8e8e8"}
STATUS = {"failed": "#e45756", "degraded": "#f58518", "healthy": "#54a24b", "unknown": "#9d9d9d"}
LINES = (
    ("waiting", "Waiting", "#e45756"),
    ("running", "Running", "#4c78a8"),
    ("kv_usage_pct", "KV usage %", "#54a24b"),
)


# At a phone's width the 720-unit picture is drawn at about half size: its text gets 20 units
# (about 9.5 CSS px at 390 px) there; every layout below leaves room for it. The query is the
# page's width inline, the picture's own width as a file beside report.md.
_STYLE = "<style>@media (max-width: 520px) { svg text { font-size: 20px } }</style>"


def _svg(height: float, title: str, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height:.0f}" width="100%" role="img" '
        f'font-family="system-ui, sans-serif" font-size="13" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>{_STYLE}" + "".join(body) + "</svg>\n"
    )


def _text(x: float, y: float, s: str, cls: str = "", anchor: str = "start", fill: str = "#222") -> str:
    c = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{fill}"{c}>{escape(s)}</text>'


def _anchor(x: float) -> str:
    """Where a label at x hangs so it stays inside the picture."""
    return "end" if x > WIDTH * 0.75 else "start" if x < WIDTH * 0.25 else "middle"


def memory(report: Report) -> str | None:
    """Every capacity diagnosis's bar, one under the other; None when none has numbers."""
    found = all_bars(report)
    if not found:
        return None
    body: list[str] = []
    y = 0.0
    for bar in found:
        y = _bar(bar, y, body)
    return _svg(y + 8, "Memory: " + "; ".join(b.title for b in found), body)


def _bar(bar: Bar, y: float, body: list[str]) -> float:
    """One bar at height `y`: its title, the segments, the axis (0 and the total), the legend."""
    left, width = 10.0, WIDTH - 20.0
    body.append(_text(left, y + 20, bar.title, "bar-title"))
    x, top = left, y + 30
    body.append('<g class="bar">')
    for seg in bar.segments:
        w = seg.value / bar.total * width if bar.total else 0
        tip = f"{seg.label}: {fmt(seg.value)} {bar.unit}"
        body.append(
            f'<rect class="segment seg-{seg.key}" x="{x:.1f}" y="{top:.1f}" width="{w:.1f}" height="30" '
            f'fill="{FILL[seg.key]}" stroke="#fff"><title>{escape(tip)}</title></rect>'
        )
        x += w
    body.append("</g>")
    axis = top + 36
    body.append(f'<g class="axis"><line x1="{left}" y1="{axis}" x2="{left + width}" y2="{axis}" stroke="#555"/>')
    end = "" if bar.sum_only else _text(left + width, axis + 20, f"{fmt(bar.total)} {bar.unit}", anchor="end")
    body.append(_text(left, axis + 20, f"0 {bar.unit}") + end)
    body.append("</g>")
    ly = axis + 20
    if bar.mark:  # its label a row of its own: at a phone's font size it would run into the total's
        mx, ly = left + bar.mark[1] / bar.total * width, ly + 24
        body.append(
            f'<g class="mark"><line x1="{mx:.1f}" y1="{top - 4:.1f}" x2="{mx:.1f}" y2="{top + 34:.1f}" '
            f'stroke="#222" stroke-dasharray="4 3"/>{_text(mx, ly, bar.mark[0], anchor=_anchor(mx))}</g>'
        )
    ly += 32
    body.append('<g class="legend">')  # one column: two do not fit a phone's font size
    for seg, count in legend(bar):
        body.append(
            f'<rect x="{left:.1f}" y="{ly - 11:.1f}" width="12" height="12" fill="{FILL[seg.key]}" stroke="#999"/>'
        )
        label = f"{f'{count} x ' if count > 1 else ''}{seg.label}: {fmt(seg.value)} {bar.unit}"
        body.append(_text(left + 18, ly, _cut(label)))
        ly += 24
    body.append("</g>")
    return ly


def queue(report: Report) -> str | None:
    """Running, waiting (left axis, up to the report's waiting max) and KV usage (right axis, 0-100%)
    over the samples, with where the queue diagnosis starts and how the server ended marked."""
    pts = [p for p in report.series if p.get("waiting") is not None or p.get("kv_usage_pct") is not None]
    if len(pts) < 2:
        return None
    left, right, top, bottom, height = 60.0, WIDTH - 66.0, 64.0, 254.0, 316
    xs = _xs(pts)
    x0, x1 = min(xs), max(xs)
    span = x1 - x0 or 1

    def px(x: float) -> float:
        return left + (x - x0) / span * (right - left)

    stats = report.facts.get("stats") or {}
    wmax = max(stats.get("waiting_max") or 0, stats.get("running_max") or 0, 1)
    unit = "scrape" if report.facts.get("metrics") else "line"
    body = [_axes(pts, left, right, top, bottom, wmax, unit)]
    for name, label, colour in LINES:
        scale = 100.0 if name == "kv_usage_pct" else float(wmax)
        coords = [
            (px(x), bottom - p[name] / scale * (bottom - top))
            for x, p in zip(xs, pts, strict=True)
            if p.get(name) is not None
        ]
        if len(coords) < 2:
            continue
        path = " ".join(f"{a:.1f},{b:.1f}" for a, b in coords)
        body.append(
            f'<g class="series series-{name}"><polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>'
        )
        for (a, b), p in zip(coords, [p for p in pts if p.get(name) is not None], strict=True):
            tip = f"{unit} {p['line']}{' ' + p['time'] if p['time'] else ''}: {label} {fmt(p[name])}"
            body.append(
                f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.5" fill="{colour}"><title>{escape(tip)}</title></circle>'
            )
        body.append("</g>")
    for i, (x, label) in enumerate(_markers(report, pts, xs, unit)):  # a row each: they may be close
        anchor = "end" if px(x) > WIDTH / 2 else "start"
        body.append(
            f'<g class="failure-marker"><line x1="{px(x):.1f}" y1="{top - 6}" x2="{px(x):.1f}" y2="{bottom}" '
            f'stroke="#b00" stroke-width="2" stroke-dasharray="6 3"/>'
            f"{_text(min(px(x), right), top - 34 + 24 * i, label, anchor=anchor, fill='#b00')}</g>"
        )
    body.append(_line_legend(bottom + 50))
    return _svg(height, "Queue over time: running, waiting, KV cache usage", body)


def _xs(pts: list[dict]) -> list[float]:
    """Seconds from the log's clock when every sample has one and they run forward; else line numbers."""
    secs = [_seconds(p.get("time")) for p in pts]
    known = [s for s in secs if s is not None]
    if len(known) == len(pts) and known == sorted(known) and known[-1] != known[0]:
        return [float(s) for s in known]
    return [float(p["line"]) for p in pts]


def _seconds(time: str | None) -> int | None:
    """A sample's time ("11-30 01:58:49", facts.line_time's form) in seconds, months of 31 days."""
    try:
        mo, d, h, m, s = int(time[0:2]), int(time[3:5]), int(time[6:8]), int(time[9:11]), int(time[12:14])  # type: ignore[index]
    except (TypeError, ValueError):
        return None
    return ((mo * 31 + d) * 24 + h) * 3600 + m * 60 + s


def _axes(pts: list[dict], left: float, right: float, top: float, bottom: float, wmax: int, unit: str) -> str:
    first, last = pts[0], pts[-1]
    at = [(p.get("time") or "")[6:] or f"{unit} {p['line']}" for p in (first, last)]
    out = [f'<g class="axis axis-x"><line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#555"/>']
    out += [_text(left, bottom + 22, at[0]), _text(right, bottom + 22, at[1], anchor="end"), "</g>"]
    out.append(f'<g class="axis axis-y"><line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#555"/>')
    out += [_text(left - 6, bottom, "0", anchor="end"), _text(left - 6, top + 4, str(wmax), anchor="end")]
    out.append("</g>")
    out.append(f'<g class="axis axis-kv"><line x1="{right}" y1="{top}" x2="{right}" y2="{bottom}" stroke="#555"/>')
    out += [_text(right + 6, bottom, "0%"), _text(right + 6, top + 4, "100%"), "</g>"]
    return "".join(out)


def _markers(report: Report, pts: list[dict], xs: list[float], unit: str) -> list[tuple[float, str]]:
    """Where a queue diagnosis's evidence starts, and the end of a server that died: at the sample
    on or after the line (the last one for an end)."""
    out = []
    d = next((d for d in report.diagnoses if is_queue(d.category) and d.evidence), None)
    if d is not None:
        line = min(e.line for e in d.evidence)
        i = next((i for i, p in enumerate(pts) if p["line"] >= line), len(pts) - 1)
        at = (pts[i].get("time") or "")[6:] or f"{unit} {pts[i]['line']}"
        out.append((xs[i], f"{d.category} from {at}"))
    life = report.lifetimes[report.shown - 1] if report.lifetimes and report.shown else None
    if life is not None and life.end in ("fatal", "abrupt"):
        out.append((xs[-1], f"ended: {life.outcome}"))
    if len(out) == 2 and out[0][0] == out[1][0]:
        out = [(out[0][0], f"{out[0][1]}; {out[1][1]}")]
    return out


def _line_legend(y: float) -> str:
    out = ['<g class="legend">']
    for i, (_, label, colour) in enumerate(LINES):
        x = 60 + i * 170
        out.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 22}" y2="{y - 4}" stroke="{colour}" stroke-width="3"/>')
        out.append(_text(x + 28, y, label))
    x = 60 + len(LINES) * 170
    out.append(
        f'<line x1="{x}" y1="{y - 12}" x2="{x}" y2="{y + 2}" stroke="#b00" stroke-width="2" stroke-dasharray="4 2"/>'
    )
    out.append(_text(x + 8, y, "failure") + "</g>")
    return "".join(out)


def restarts(report: Report) -> str | None:
    """The server's starts left to right (_lanes), coloured by status, a red tick where one died;
    listed under the lane with time, lines and outcome. None for a single start."""
    lives = report.lifetimes
    if len(lives) < 2:
        return None
    left, right, lane = 10.0, WIDTH - 10.0, 30.0
    order, (start, end, apart) = _lanes(report)
    total = sum(extent for _, extent in order)
    room = right - left - _GAP * (len(order) - 1)
    body = ['<g class="lifetimes">']
    a, previous = left, None
    for life, extent in order:
        # half the room shared alike, half by extent: a start of a few lines stays visible, none overlaps
        w = room * (0.5 / len(order) + (0.5 * extent / total if total else 0.5 / len(order)))
        b = a + w
        if previous is not None and previous.sources[1] != life.sources[0] and apart:
            body.append(f'<line class="input-edge" x1="{a - _GAP / 2:.1f}" y1="{lane - 8}" x2="{a - _GAP / 2:.1f}" '
                        f'y2="{lane + 36}" stroke="#555" stroke-dasharray="2 2"/>')  # fmt: skip
        edge = ' stroke="#000" stroke-width="2"' if life.index == report.shown else ' stroke="#fff"'
        tip = f"#{life.index} {life.started or 'no time'}: {life.report.status}, {life.outcome}"
        body.append(
            f'<rect class="life status-{life.report.status}" x="{a:.1f}" y="{lane}" width="{w:.1f}" height="28" '
            f'fill="{STATUS.get(life.report.status, "#9d9d9d")}"{edge}><title>{escape(tip)}</title></rect>'
        )
        if w > 36:
            body.append(_text(a + 4, lane + 20, f"#{life.index}", fill="#fff"))
        if life.end == "fatal":
            body.append(
                f'<line class="failure-marker" x1="{b:.1f}" y1="{lane - 6}" x2="{b:.1f}" y2="{lane + 34}" stroke="#b00" stroke-width="3"/>'
            )
        a, previous = b + _GAP, life
    body.append("</g>")
    axis = lane + 40
    body.append(f'<g class="axis"><line x1="{left}" y1="{axis}" x2="{right}" y2="{axis}" stroke="#555"/>')
    body.append(_text(left, axis + 20, start) + _text(right, axis + 20, end, anchor="end") + "</g>")
    y = axis + 50
    body.append('<g class="legend">')
    for life, _ in order[:30]:
        colour = STATUS.get(life.report.status, "#9d9d9d")
        body.append(f'<rect x="{left}" y="{y - 12}" width="12" height="12" fill="{colour}"/>')
        shown = " (shown)" if life.index == report.shown else ""
        body.append(
            _text(left + 18, y, _cut(f"#{life.index} {life.started or 'no time'} · {_where(life, report)}{shown}"))
        )
        body.append(_text(left + 18, y + 22, _cut(f"{life.report.status}: {life.outcome}")))
        y += 50
    if len(lives) > 30:
        body.append(_text(left + 18, y, f"and {len(lives) - 30} more starts"))
        y += 24
    body.append("</g>")
    return _svg(y - 16, f"{len(lives)} server starts in this input", body)


def _lanes(report: Report) -> tuple[list[tuple[Life, float]], tuple[str, str, bool]]:
    """The starts in the order drawn, each with its extent, and the axis's ends (and whether the
    inputs are drawn apart): by the log's clock when every start has its times, so inputs given out
    of order still read in time; else by input, then line (each file's lines count from 1)."""
    lives = report.lifetimes
    secs = [(_seconds(life.started), _seconds(life.ended)) for life in lives]
    timed = [(life, a, b) for life, (a, b) in zip(lives, secs, strict=True) if a is not None and b is not None]
    if len(timed) == len(lives):
        timed.sort(key=lambda t: (t[1], t[0].index))
        first, last = timed[0][0], max(timed, key=lambda t: t[2])[0]
        lanes = [(life, float(max(0, b - a))) for life, a, b in timed]  # no year: a start over new year is 0 long
        return lanes, (str(first.started), str(last.ended), False)
    top: dict[int, int] = {}  # the last line drawn of each input
    for life in lives:
        for src, line in zip(life.sources, life.lines, strict=True):
            top[src] = max(top.get(src, 0), line)
    offset, at = {}, 0
    for src in sorted(top):
        offset[src], at = at, at + top[src]
    order = sorted(lives, key=lambda life: (life.sources[0], life.lines[0]))

    def extent(life: Life) -> float:
        return float(offset[life.sources[1]] + life.lines[1] - offset[life.sources[0]] - life.lines[0])

    out = [(life, extent(life)) for life in order]
    several = len(top) > 1
    first, last = order[0], max(order, key=lambda life: (life.sources[1], life.lines[1]))
    ends = (_at(report, first.sources[0], first.lines[0]), _at(report, last.sources[1], last.lines[1]))
    return out, (*ends, several)


def _at(report: Report, source: int, line: int) -> str:
    return f"{_name(report, source)} line {line}" if len(report.paths) > 1 else f"line {line}"


def _name(report: Report, source: int) -> str:
    return report.paths[source].rsplit("/", 1)[-1] if source < len(report.paths) else "?"


def _where(life: Life, report: Report) -> str:
    """A start's lines, and of which input when there are several."""
    (s0, s1), (l0, l1) = life.sources, life.lines
    if len(report.paths) < 2:
        return f"lines {l0}-{l1}"
    if s0 == s1:
        return f"{_name(report, s0)} lines {l0}-{l1}"
    return f"{_name(report, s0)} line {l0} to {_name(report, s1)} line {l1}"


def _cut(text: str, most: int = 62) -> str:
    """A legend line short enough for the picture at a phone's font size."""
    return text if len(text) <= most else text[: most - 1] + "…"
