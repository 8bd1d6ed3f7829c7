"""HTTP for a /metrics scrape that a hostile server cannot stretch: a deadline for the whole
scrape that shuts its sockets (a blocked read returns at once, even while the server drips a
byte at a time into the headers), and redirects followed only to the same scheme, host and port."""

from __future__ import annotations

import threading
from typing import Any


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
