"""HTTP for a /metrics scrape that a hostile server cannot stretch: a deadline for the whole
scrape that shuts its sockets (a blocked read returns at once, even while the server drips a
byte at a time into the headers), and redirects followed only to the same scheme, host and port.
Its errors never repeat a URL's password nor a secret query value (`?token=`): `masked`."""

from __future__ import annotations

import re
import threading
from typing import Any

MASK = "[REDACTED]"  # render/redact.py's mask (read/ is below render/)
_SECRET_PARAM = re.compile(r"(?i)token|key|secret|passw|pwd|sig|auth|credential")


def secrets_of(url: str) -> list[str]:
    """A URL's password and the values of its secret-looking query parameters, as written and
    percent-decoded, longest first (read by hand: urlsplit gives up on a bad port)."""
    from urllib.parse import unquote

    authority = re.split(r"[/?#]", url.partition("://")[2], maxsplit=1)[0]
    found = [authority.rpartition("@")[0].partition(":")[2]]
    for pair in re.split(r"[&;]", url.partition("?")[2].partition("#")[0]):
        name, _, value = pair.partition("=")
        if value and _SECRET_PARAM.search(name):
            found.append(value)
    found += [unquote(v) for v in found]
    return sorted({v for v in found if len(v) >= 3}, key=len, reverse=True)  # shorter: no secret, and common


def masked(text: str, url: str) -> str:
    """`text` (an error about `url`) without the URL's secrets, wherever the message repeats them."""
    for secret in secrets_of(url):
        text = text.replace(secret, MASK)
    return text


class Deadline:
    """Shuts the scrape's sockets when its time is up: a blocked read returns at once."""

    def __init__(self, seconds: float):
        self.expired = False
        self.sockets: list[Any] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        import socket

        self.expired = True
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self) -> None:
        self._timer.cancel()


def opener(url: str, deadline: Deadline, error: type[Exception]) -> Any:
    """urllib with the scrape's sockets known to the deadline, and redirects followed only
    to the same scheme, host and port (not to another machine, not to ftp://)."""
    import urllib.request
    from urllib.parse import urlsplit

    def same_origin(a: str, b: str) -> bool:
        x, y = urlsplit(a), urlsplit(b)
        return (x.scheme, x.hostname, x.port) == (y.scheme, y.hostname, y.port)

    class Redirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            if not same_origin(req.full_url, newurl):
                fp.close()
                raise error(f"{url}: redirected to {newurl}, another host or scheme; not followed")
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    def watched(klass: Any) -> Any:
        class Watched(klass):
            def connect(self) -> None:
                super().connect()
                deadline.sockets.append(self.sock)

        return Watched

    class Http(urllib.request.HTTPHandler):
        def do_open(self, http_class, req, **kw):
            return super().do_open(watched(http_class), req, **kw)

    class Https(urllib.request.HTTPSHandler):
        def do_open(self, http_class, req, **kw):
            return super().do_open(watched(http_class), req, **kw)

    return urllib.request.build_opener(Http, Https, Redirects)
