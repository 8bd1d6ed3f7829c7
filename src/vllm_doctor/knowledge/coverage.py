"""`vllm-doctor rules coverage`: of a release's startup raise sites (the atlas), how many a hand
rule names, how many the atlas names (knowledge/atlasmatch.py: alone, or a terse template with its
exception type), and which neither can (too little literal text to be told apart). A site counts as named by a hand rule when one of a
diagnosis rule's patterns matches the message rendered with sample values ("7" for each
placeholder), as the engine would read it on a traceback's last line."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_doctor.data import Rule
from vllm_doctor.knowledge.atlasmatch import PLACEHOLDER, area, told_apart, told_apart_typed

# the startup paths: what runs between `vllm serve` and the server's first request
STARTUP = (
    "vllm/config", "vllm/engine/arg_utils", "vllm/v1/core/kv_cache", "vllm/v1/worker", "vllm/worker",
    "vllm/distributed", "vllm/v1/executor", "vllm/executor", "vllm/model_executor/model_loader", "vllm/platforms",
)  # fmt: skip


@dataclass
class Area:
    name: str
    sites: int = 0
    by_rules: int = 0
    by_atlas: int = 0
    neither: list[str] = field(default_factory=list)  # the templates too short to be told apart


def rendered(template: str) -> str:
    """The message as a log line holds it: sample values, one line."""
    return PLACEHOLDER.sub("7", template).replace("{{", "{").replace("}}", "}").replace("\n", " ")


def coverage(rules: list[Rule], version: str | None = None) -> tuple[str, list[Area]]:
    """(the release read, its areas): the newest release the atlas read at or below `version`."""
    from vllm_doctor import atlas
    from vllm_doctor.matching.loader import compile_regex
    from vllm_doctor.versions import version_tuple

    releases = atlas.message_releases()
    want = version_tuple(version) if version else None
    index = max((i for i, r in enumerate(releases) if not want or version_tuple(r) <= want), default=0)
    patterns = [p for r in rules if r.kind == "diagnosis" and not r.fallback for p in r.patterns]
    areas: dict[str, Area] = {}
    for t in atlas.templates():
        if t["kind"] != "raise" or not t["file"].startswith(STARTUP) or not any(a <= index <= b for a, b in t["spans"]):
            continue
        a = areas.setdefault(area(t["file"]), Area(area(t["file"])))
        a.sites += 1
        text = rendered(t["template"])
        if any(
            (not p.needs or any(n in text for n in p.needs)) and compile_regex(p.regex).search(text) for p in patterns
        ):
            a.by_rules += 1
        elif told_apart(t) or told_apart_typed(t):
            a.by_atlas += 1
        else:
            a.neither.append(t["template"])
    return releases[index], sorted(areas.values(), key=lambda a: -a.sites)


def lines(release: str, areas: list[Area]) -> list[str]:
    """The table the command prints: per area, then all of them, then what neither names."""
    total = Area("all startup areas", sum(a.sites for a in areas), sum(a.by_rules for a in areas),
                 sum(a.by_atlas for a in areas), [t for a in areas for t in a.neither])  # fmt: skip
    out = [f"vLLM {release}: startup raise sites named by a hand rule, by the atlas, by neither", ""]
    out.append(f"{'area':28} {'sites':>6} {'hand rules':>12} {'atlas':>7} {'neither':>8}")
    for a in [*areas, total]:
        share = f"{a.by_rules} ({100 * a.by_rules // max(1, a.sites)}%)"
        out.append(f"{a.name:28} {a.sites:>6} {share:>12} {a.by_atlas:>7} {len(a.neither):>8}")
    if total.neither:
        out += ["", "Too little literal text to be told apart (kept in the atlas, never named):"]
        out += [f"  {t[:100]}" for t in total.neither]
    return out
