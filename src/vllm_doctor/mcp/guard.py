"""What a client may ask the server to read: files under the --root directories only, resolved
(a symlink out of a root is refused), regular files of at most 1 GiB; URLs under an --allow-url
prefix only. Every refusal is a Refused with one sentence, which the tool returns as its error."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from vllm_doctor.errors import DoctorError

MAX_FILE = 1 << 30  # 1 GiB: a log larger than this is a job for the CLI, not a tool call
MAX_TEXT = 64 << 20  # log text given inline: a JSON-RPC message this size is already a lot


class Refused(DoctorError):
    """A request the server will not carry out, said in one sentence."""


@dataclass(frozen=True)
class Guard:
    roots: tuple[Path, ...]
    urls: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, roots: list[str], urls: list[str]) -> Guard:
        """The roots resolved once (default: the current directory); each must be a directory."""
        resolved = []
        for r in roots or ["."]:
            p = Path(os.path.realpath(r))
            if not p.is_dir():
                raise DoctorError(f"--root {r}: not a directory")
            resolved.append(p)
        return cls(tuple(resolved), tuple(urls))

    def file(self, given: str, what: str = "path") -> Path:
        """The real path of a readable regular file under a root, or Refused."""
        if not given or "\x00" in given:
            raise Refused(f"The {what} {given!r} is not a valid path.")
        raw = Path(given).expanduser()
        joined = raw if raw.is_absolute() else self.roots[0] / raw
        if not self._inside(Path(os.path.abspath(joined))):
            raise Refused(f"The {what} {given!r} is outside the allowed roots ({self._named()}).")
        real = Path(os.path.realpath(joined))
        if not self._inside(real):
            raise Refused(f"The {what} {given!r} resolves (through a symbolic link) outside the allowed roots.")
        try:
            st = os.stat(real)
        except OSError as e:
            raise Refused(f"The {what} {given!r} cannot be read ({e.strerror or e}).") from None
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"The {what} {given!r} is {_kind(st.st_mode)}, not a regular file.")
        if st.st_size > MAX_FILE:
            raise Refused(f"The {what} {given!r} is {st.st_size / (1 << 30):.1f} GiB, over the 1 GiB limit.")
        if not os.access(real, os.R_OK):
            raise Refused(f"The {what} {given!r} is not readable.")
        return real

    def directory(self, given: str) -> Path:
        """The real path of a directory under a root (a local model), or Refused."""
        real = Path(os.path.realpath(os.path.expanduser(given)))
        if not self._inside(real):
            raise Refused(f"The model directory {given!r} is outside the allowed roots ({self._named()}).")
        return real

    def url(self, given: str) -> str:
        """`given` when it lies under an --allow-url prefix: the same scheme, host and port (compared
        parsed: a string prefix would let http://host:80 pass http://host:8000 or http://host:80.evil),
        and a path under the prefix's."""
        if not any(_under(given, prefix) for prefix in self.urls):
            allowed = ", ".join(self.urls) if self.urls else "none: start the server with --allow-url PREFIX"
            raise Refused(f"The URL {given!r} is not under an allowed prefix ({allowed}).")
        return given

    def _inside(self, p: Path) -> bool:
        return any(p == r or r in p.parents for r in self.roots)

    def _named(self) -> str:
        return ", ".join(str(r) for r in self.roots)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):  # fmt: skip
        if test(mode):
            return name
    return "not a plain file"


def _under(given: str, prefix: str) -> bool:
    from urllib.parse import urlsplit

    try:
        g, p = urlsplit(given), urlsplit(prefix)
        same = (g.scheme, g.hostname, g.port) == (p.scheme, p.hostname, p.port) and g.username is None
    except ValueError:  # a port that is not a number
        return False
    base = p.path.rstrip("/")
    return same and bool(g.hostname) and (g.path == base or g.path.startswith(base + "/") or not base)


def text_size(text: str) -> None:
    if len(text) > MAX_TEXT:
        raise Refused(f"The log text is {len(text) / (1 << 20):.0f} MiB, over the 64 MiB limit; give a path instead.")
