"""The forms of a bulk family's line (read/bulk.py): a rule's form as a whole line behind what
collectors and terminals add, compiled for a region's split, a match at a line's start and a test
of a line; and, where a region's lines share one literal lead ("(APIServer pid=1) INFO:     "),
the form of that lead, which `re` finds by a fast search and tries at no other line."""

from __future__ import annotations

import re

_META = set(".^$*+?{}[]|()\\")


# What collectors put before a line (lineparse._PLAIN's, in bytes, one line): docker's or a CRI
# file's stamp (`_t1`, `_t2`: a line with one has a time), a pod's or compose service's name
# (`_ctr`: part of the run key); and what a rule's form names `{process}` (`{process?}` where it may
# be absent): V1's process prefix, in colour or not (`_key`: the process, part of the run key).
_STAMP = (
    rb"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,12})?(?:Z|[+-]\d\d:?\d\d)?(?:[ \t]+(?:stdout|stderr)[ \t]+[FP])?"
)
LEAD = (
    rb"(?P<_t1>" + _STAMP + rb"[ \t]+)?(?P<_ctr>\[pod/[\w.\-/]{1,200}\] |[A-Za-z][\w.\-]{0,100}[ \t]+\| )?"
    rb"(?P<_t2>" + _STAMP + rb"[ \t]+)?"
)


PROCESS = r"(?:\x1b\[[\d;]{0,16}m)?(?P<_key>\([A-Za-z_][\w\-]{0,40} pid=\d{1,10}\))(?:\x1b\[[\d;]{0,16}m)?"


def compile_form(text: str) -> tuple[re.Pattern[bytes], re.Pattern[bytes], re.Pattern[bytes], bytes, bytes]:
    """A rule's bulk form as a whole line behind LEAD: (for re.split, _split: the newline before
    the line, the line as its first group, then the groups; the same from a line's start, for a
    match at one; without any group; the literal that opens the form past its process, and the
    rest). A pattern that opens with the newline is tried only at a line's start (`re` finds its
    first byte by a fast search; a multiline ^ is tried at every byte)."""
    head, body = next(((PROCESS if h == "{process}" else f"(?:{PROCESS} )?", text[len(h) :])
                       for h in ("{process}", "{process?}") if text.startswith(h)), ("", text))  # fmt: skip
    lead, i = "", 0
    while i < len(body) and (body[i] not in _META or (body[i] == "\\" and body[i + 1 : i + 2] in _META)):
        lead += body[i + 1] if body[i] == "\\" else body[i]
        i += 2 if body[i] == "\\" else 1
    whole = rb"(?:" + LEAD + (head + body).encode("utf-8") + rb")(?m:$)"
    plain = re.sub(rb"\(\?P<\w+>", b"(?:", whole)
    return (re.compile(rb"\n(" + whole + b")"), re.compile(b"(" + whole + b")"), re.compile(plain),
            lead.encode("utf-8"), body[i:].encode("utf-8"))  # fmt: skip


LEADS = 8  # literal leads a family keeps compiled


def lead_form(region: bytes, forms: tuple, line: re.Pattern[bytes], anchors: tuple[bytes, ...],
              cache: dict[bytes, re.Pattern[bytes]]) -> tuple[re.Pattern[bytes], tuple] | None:  # fmt: skip
    """The form of the region's first family line's literal lead (all it has before the form's
    own lead literal: "(APIServer pid=1) INFO:     ", colour and all), and the run key of its
    lines: a pattern `re` finds by a fast search for that literal, tried at no other line. None
    where that line has a stamp (no two lines share one) or is of no form."""
    lit = forms[3]
    at = min((i for i in (region.find(a) for a in anchors) if i >= 0), default=-1)
    if not lit or at < 0:
        return None
    start = region.rfind(b"\n", 0, at) + 1
    m = line.match(region, start)
    if m is None or m["_t1"] is not None or m["_t2"] is not None:
        return None
    cut = region.find(lit, start, m.end()) + len(lit)
    lead = region[start:cut]
    if (pattern := cache.get(lead)) is None:
        if len(cache) >= LEADS:
            cache.clear()
        escaped = re.escape(lead)
        rest = forms[4]
        pattern = cache[lead] = re.compile(b"(" + escaped + rb"(?<![^\n]" + escaped + b")(?:" + rest + rb"))(?m:$)")
    return pattern, (m["_ctr"], m.groupdict().get("_key"))
