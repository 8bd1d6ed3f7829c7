"""What the tracebacks of a server's life say: which failure it did not survive, and where it was raised.

The `series = "traceback"` fact rules (rules/facts/traceback-*.toml, fatal-exit.toml) record every
frame, exception line and fatal line in order (Facts.traceback). These checks read them:
`failure_site` names the first failure of the lifetime that the server did not survive (no
"ready" after it, not part of a shutdown, not a request error it kept serving through) with its
exception, message and the vLLM module and function that raised it (a traceback raised in a
signal handler or under "Exception ignored in" is a teardown, never one); `fatal_context` says whether
the line a rule matched was such a failure, for rules that read traceback frames. `hub_target`
says what a Hub 404 is about; `log_names` writes the log's model and vLLM version as a fix uses them.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote_plus

from vllm_doctor.data import TracebackRecord, cut_evidence
from vllm_doctor.facts import Facts
from vllm_doctor.knowledge.contract import CheckInput, CheckResult, check

FRAME_GAP = 12  # lines between two frames of one traceback (code lines, ^^^ markers, interleaved workers)
MESSAGE_CHARS = 200
ISSUES = "https://github.com/vllm-project/vllm/issues?q="
_PUNCT = "()[]{}'\"`,.:;=<>"
_PACKAGES = ("/site-packages/", "/dist-packages/")


def module_of(path: str) -> str:
    """`…/site-packages/vllm/v1/core/kv_cache_utils.py` -> `vllm.v1.core.kv_cache_utils`."""
    p = path.replace("\\", "/")
    for marker in _PACKAGES:
        if marker in p:
            p = p.rsplit(marker, 1)[1]
            break
    else:
        if "/vllm/" in p:
            p = "vllm/" + p.rsplit("/vllm/", 1)[1]
        else:
            p = p.rsplit("/", 1)[-1]
    return p[:-3].replace("/", ".") if p.endswith(".py") else p.replace("/", ".")


class LifePhases:
    """The phases of one lifetime as the checks need them: where it became ready, where a shutdown began."""

    def __init__(self, facts: Facts):
        phases = list(facts.phases)
        self.ready = [(line, src) for line, src, name, _p in phases if name == "ready"]
        # ready lines a process prefix places: uvicorn's bare "INFO:" lines go to stderr, and a capture
        # of both streams can put them after stdout's last line, an error the server died of included
        self.ready_placed = [(line, src) for line, src, name, proc in phases if name == "ready" and proc]
        self.shutdown = [(line, src) for line, src, name, _p in phases if name == "shutdown_started"]
        last = facts.stats.last
        self.last_stats = (last[0], last[1]) if last else None

    def survived(self, line: int, source: int) -> bool:
        """The server went on after this line: became ready after it, or printed stats after it."""
        if any(src == source and at > line for at, src in self.ready):
            return True
        return self.last_stats is not None and self.last_stats[1] == source and self.last_stats[0] > line

    def served_after(self, line: int, source: int) -> bool:
        """Like survived, on the evidence that holds in any capture: stats after the line, or a ready
        line with a process prefix after it."""
        if any(src == source and at > line for at, src in self.ready_placed):
            return True
        return self.last_stats is not None and self.last_stats[1] == source and self.last_stats[0] > line

    def in_shutdown(self, line: int, source: int) -> bool:
        return any(src == source and at < line for at, src in self.shutdown)

    def fatal(self, line: int, source: int) -> bool:
        return not self.survived(line, source) and not self.in_shutdown(line, source)


def _frames_before(records: list[TracebackRecord], index: int) -> list[TracebackRecord]:
    """The frames of the traceback that ends at records[index] (an exception or a fatal line),
    from the same process, nearest last; a frame record itself counts as the last frame."""
    end = records[index]
    out: list[TracebackRecord] = []
    at = end.line
    for r in reversed(records[: index + 1]):
        if r.source != end.source or (r.process and end.process and r.process != end.process):
            continue
        if r is not end and "exc_type" in r.fields:
            break  # the traceback before this one
        if "function" in r.fields:
            if at - r.line > FRAME_GAP and out:
                break
            out.append(r)
            at = r.line
        elif at - r.line > FRAME_GAP:
            break
    return out[::-1]


def _frames_after(records: list[TracebackRecord], index: int) -> list[TracebackRecord]:
    """The frames of the traceback that a fatal line (a traceback header, "EngineCore failed to
    start.") opens, when its end was cut off."""
    start = records[index]
    out: list[TracebackRecord] = []
    at = start.line
    for r in records[index + 1 :]:
        if r.source != start.source or (r.process and start.process and r.process != start.process):
            continue
        if r.line - at > FRAME_GAP or "exc_type" in r.fields:
            break
        if "function" in r.fields:
            out.append(r)
            at = r.line
    return out


def _raiser(frames: list[TracebackRecord]) -> TracebackRecord | None:
    """The frame that raised: the innermost one in vLLM, else the innermost one."""
    inside = [f for f in frames if "/vllm/" in str(f.fields.get("file", "")).replace("\\", "/")]
    chosen = inside or frames
    return chosen[-1] if chosen else None


def _records(inp: CheckInput) -> list[TracebackRecord]:
    return sorted(inp.facts.traceback, key=lambda r: (r.source, r.line))  # merged lifetimes: in line order


def _same(a: TracebackRecord, b: TracebackRecord) -> bool:
    return a.source == b.source and not (a.process and b.process and a.process != b.process)


def teardown(records: list[TracebackRecord]) -> set[int]:
    """The records of tracebacks that are part of a teardown: one with a frame in a signal handler
    (the server was told to stop) or one under Python's "Exception ignored in" (ignored by definition),
    from its header to its exception line."""
    out: set[int] = set()
    for i, r in enumerate(records):
        # (a frame joined to its code line can read "signal_handlerraise": the join lost the newline)
        if not str(r.fields.get("function", "")).startswith("signal_handler") and "teardown" not in r.fields:
            continue
        group = {i}
        at = r.line
        for j in range(i - 1, -1, -1):  # up to the header: frames of the same traceback above it
            o = records[j]
            if not _same(o, r):
                continue
            if "exc_type" in o.fields or "teardown" in o.fields or at - o.line > FRAME_GAP:
                break
            group.add(j)
            at = o.line
        at = r.line
        for j in range(i + 1, len(records)):  # down to its exception line
            o = records[j]
            if not _same(o, r):
                continue
            if o.line - at > FRAME_GAP or "teardown" in o.fields:
                break
            group.add(j)
            at = o.line
            if "exc_type" in o.fields:
                break
        out |= group
    return out


def failure(inp: CheckInput) -> tuple[int, list[TracebackRecord]] | None:
    """The first failure the lifetime did not survive (index into the records), and its frames."""
    records = _records(inp)
    life = LifePhases(inp.facts)
    ignored = teardown(records)
    live = [
        i
        for i, r in enumerate(records)
        if r.level not in ("INFO", "DEBUG", "WARNING") and i not in ignored and life.fatal(r.line, r.source)
    ]
    for kind in ("exc_type", "fatal", "function"):
        chosen = next((i for i in live if kind in records[i].fields), None)
        if chosen is not None:
            frames = _frames_before(records, chosen)
            return chosen, frames if frames or kind != "fatal" else _frames_after(records, chosen)
    return None


def search_text(exc_type: str | None, message: str | None, function: str | None, module: str | None) -> str:
    """Words to search vLLM's issues with: the exception, its message without this log's numbers,
    and where it was raised."""
    said = [w.strip(_PUNCT) for w in (message or "").split()]
    said = [w for w in said if w and not any(c.isdigit() for c in w) and "/" not in w][:8]  # not this log's numbers
    words = [exc_type or "", function or "", *said]
    if not said and module:
        words.append(module.rsplit(".", 1)[-1])
    return " ".join(w for w in words if w)


_SITE = {"failure_found", "exc_type", "exc_message", "exc_module", "exc_function", "exc_file", "exc_lineno",
         "exc_code", "raised_at", "fatal", "failure_process", "search_text", "search_url", "frames_seen",
         "vllm_template", "vllm_site", "vllm_releases", "vllm_area", "vllm_advice", "vllm_config_check"}  # fmt: skip
CONFIG_AREAS = ("config validation", "engine arguments")
_PYDANTIC = re.compile(r"\d+ validation errors? for \w+")
_VALUE_ERROR = re.compile(r"^Value error, |\s*\[type=\w+$")  # the head and tail around pydantic's message


@check(reads={"vllm_version", "pydantic_value_error"}, returns=_SITE)
def failure_site(inp: CheckInput) -> CheckResult:
    """The failure the server did not survive (from the traceback records and the phases):
    exception, message, the vLLM module and function that raised it, and the text to search vLLM's
    issues with; and, where vLLM's own source has the message (the atlas: knowledge/atlasmatch.py),
    its template, raise site, releases, area and advice."""
    found = failure(inp)
    if found is None:
        return CheckResult({"failure_found": False})
    index, frames = found
    rec = _records(inp)[index]
    out: dict[str, Any] = {"failure_found": True, "frames_seen": len(frames)}
    exc_type, message = rec.fields.get("exc_type"), rec.fields.get("exc_message")
    if exc_type:
        out["exc_type"] = exc_type
    if rec.fields.get("fatal") and not str(rec.fields["fatal"]).startswith("Traceback"):
        out["fatal"] = rec.fields["fatal"]
    raiser = _raiser(frames)
    module = function = None
    if raiser is not None:
        module, function = module_of(str(raiser.fields.get("file", ""))), raiser.fields.get("function")
        out.update(exc_module=module, exc_function=function, exc_file=raiser.fields.get("file"),
                   raised_at=f"{module}.{function}")  # fmt: skip
        if raiser.fields.get("lineno") is not None:
            out["exc_lineno"] = raiser.fields["lineno"]
        code = (frames[-1].fields.get("code") or "").strip()
        if code:
            out["exc_code"] = code[:MESSAGE_CHARS]
            if exc_type and not message and code.startswith("assert "):
                message = code  # a bare AssertionError: the assert is its message
    wrapped = inp.get("pydantic_value_error")
    if message and wrapped and _PYDANTIC.match(str(message)):  # "1 validation error for VllmConfig":
        message = _VALUE_ERROR.sub("", str(wrapped))  # the message is its "Value error, ..." line
    if message:
        message = str(message).strip()
        out["exc_message"] = message[:MESSAGE_CHARS]
        from vllm_doctor.knowledge.atlasmatch import name

        named = name(exc_type, message, inp.get("vllm_version"))
        if named is not None:
            out.update(vllm_template=named.template, vllm_site=named.site, vllm_releases=named.releases,
                       vllm_area=named.area, vllm_config_check=named.area in CONFIG_AREAS)  # fmt: skip
            if named.advice:
                out["vllm_advice"] = named.advice
    if rec.process:
        out["failure_process"] = rec.process
    text = search_text(exc_type or out.get("fatal"), message, function, module)
    if text:
        out["search_text"] = text
        out["search_url"] = ISSUES + quote_plus(text)
    shown = [cut_evidence(rec.line, rec.text, rec.source)]
    if raiser is not None and raiser is not rec:
        shown.append(cut_evidence(raiser.line, raiser.text, raiser.source))
    return CheckResult(out, shown)


@check(reads=set(), returns={"survived", "during_shutdown", "fatal_here"})  # reads the phases and stats
def fatal_context(inp: CheckInput) -> CheckResult:
    """Whether the line the rule matched (a traceback frame, say) belongs to a failure the server
    did not survive: no ready after it, no shutdown before it, no serving on through it."""
    match = inp.match
    if match is None:
        return CheckResult()
    source = match.evidence[0].source if match.evidence else 0
    life = LifePhases(inp.facts)
    survived = life.survived(match.first_line, source)
    during = life.in_shutdown(match.first_line, source)
    return CheckResult({"survived": survived, "during_shutdown": during, "fatal_here": not survived and not during})


_HUB_KINDS = {"Repository": "repo", "Revision": "revision", "Entry": "file"}


@check(reads={"kind", "repo", "revision", "file"}, returns={"missing", "missing_repo", "missing_revision",
                                                           "missing_file", "hub_missing"})  # fmt: skip
def hub_target(inp: CheckInput) -> CheckResult:
    """Which thing a Hub 404 is about: the repo, the revision or a file, from the error's class
    or phrase (Repository/Revision/Entry Not Found) and else from its URL."""
    kind = str(inp.get("kind") or "")
    said = " ".join(e.text for e in inp.match.evidence) if inp.match else ""
    kind = next((k + " Not Found" for k in _HUB_KINDS if k + " Not Found" in said), kind)  # the most specific said
    repo = str(inp.get("repo") or "").rstrip(".") or None
    revision = str(inp.get("revision") or "").rstrip(".") or None
    file = str(inp.get("file") or "").rstrip(".") or None
    missing = next((v for k, v in _HUB_KINDS.items() if kind.startswith(k)), None)
    if missing is None:  # a plain "404 Client Error: Not Found for url": a revision asked for, else the file
        # (config.json is the first file fetched: without it, the repo id is the likelier mistake)
        missing = (
            "revision" if revision and revision != "main" else "file" if file and file != "config.json" else "repo"
        )
    out: dict[str, Any] = {"missing": missing}
    for name, value in (("missing_repo", repo), ("missing_revision", revision), ("missing_file", file)):
        if value:
            out[name] = value
    where = f" in {repo}" if repo else ""
    at = f" at revision {revision}" if revision else ""
    out["hub_missing"] = {
        "file": f"file {file or '(unnamed)'}{where}{at}",
        "revision": f"revision {revision or '(unnamed)'}{where}",
        "repo": f"repo {repo}" if repo else "such repo",
    }[missing]
    return CheckResult(out)


# a Hugging Face repo id (org/name) and a release PyPI serves (0.7.3, 0.6.3.post1, 0.8.0rc1; not a
# development build's 0.7.1.dev12+g1234abc nor a local version's +cpu)
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.\-]{0,95}/[A-Za-z0-9][\w.\-]{0,95}")
_RELEASE = re.compile(r"\d+\.\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?")


@check(reads={"model", "vllm_version"}, returns={"model_repo", "model_dir", "vllm_release"})
def log_names(inp: CheckInput) -> CheckResult:
    """The log's names as a fix writes them: the model as a Hub repo id or as a local directory, and
    the vLLM version when pip can install it."""
    out: dict[str, Any] = {}
    model = str(inp.get("model") or "").strip()
    if model.startswith(("/", "./", "../", "~")):
        out["model_dir"] = model.rstrip("/") or "/"
    elif _REPO_ID.fullmatch(model) and not model.lower().endswith((".gguf", ".bin", ".safetensors", ".json")):
        out["model_repo"] = model
    version = str(inp.get("vllm_version") or "").strip()
    if _RELEASE.fullmatch(version):
        out["vllm_release"] = version
    return CheckResult(out)
