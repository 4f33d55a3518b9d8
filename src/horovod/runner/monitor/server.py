"""The live page's HTTP server: Python's ``ThreadingHTTPServer``, in a daemon thread of the launcher.

Every path needs the job's page token, ``?token=...`` (a random ``secrets.token_urlsafe``, made per job and shown
only in the URL the launcher prints; it is not the job secret, which never leaves the launcher and the ranks):
without it the answer is 401, with a wrong one 403, whatever the path. With it:

- ``GET /``: the page (:mod:`.page`);
- ``GET /api/status``: the job's status as JSON (:meth:`.status.JobStatus.snapshot`);
- ``POST /api/stacks``: every rank's Python stack, asked at once, within 2 s (:meth:`.status.JobStatus.stacks`).

Requests are logged at DEBUG without their query (the token). Responses are never cached, send no referrer, and
the page may run its own inline script only (a Content-Security-Policy nonce).
"""
from __future__ import annotations

import hmac
import json
import logging
import secrets
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional, Tuple
from urllib.parse import parse_qs, urlsplit

from . import page
from .status import JobStatus

log = logging.getLogger(__name__)

MAX_BODY = 1 << 16


class Monitor:
    """The live page of one job: ``start()`` serves it and returns its URL, ``stop()`` ends it."""

    def __init__(self, status: JobStatus, address: str = "127.0.0.1", port: int = 0,
                 token: Optional[str] = None) -> None:
        self.status = status
        self.token = token or secrets.token_urlsafe(24)
        self._server = _Server((address, port), _handler(self))
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """The page's URL, token included."""
        host = self._server.server_address[0]
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/?token={self.token}"

    def start(self) -> str:
        """Serve in a daemon thread; returns :attr:`url`."""
        self.status.watch()
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="horovod-monitor", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving and close the socket (a request in progress may finish in its own thread)."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5.0)
            self._thread = None
        self._server.server_close()

    def authorize(self, query: str) -> Tuple[int, str]:
        """(HTTP status, message) of a request's token: 200, 401 (none given) or 403 (a wrong one)."""
        given = parse_qs(query).get("token", [""])[0]
        if not given:
            return 401, "This page needs the token of the URL that horovodrun printed (?token=...)."
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return 403, "Wrong token: use the URL that horovodrun printed for this job."
        return 200, ""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: Tuple[str, int], handler) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def handle_error(self, request, client_address) -> None:
        log.debug("live page: a request from %s failed", client_address[0], exc_info=True)


def _handler(monitor: Monitor):
    class Handler(BaseHTTPRequestHandler):
        server_version = "horovod-monitor"
        sys_version = ""
        timeout = 10            # a client that stalls mid-request is dropped

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = 0
            if 0 < length <= MAX_BODY:
                self.rfile.read(length)             # nothing is read from a body; drain it
            self._route("POST")

        def do_HEAD(self) -> None:
            self._route("HEAD")

        def _route(self, method: str) -> None:
            parts = urlsplit(self.path)
            code, message = monitor.authorize(parts.query)
            if code != 200:
                self._send(code, message.encode(), "text/plain; charset=utf-8",
                           {"WWW-Authenticate": "Token"} if code == 401 else None)
                return
            routes = {"/": ("GET", self._page), "/api/status": ("GET", self._status),
                      "/api/stacks": ("POST", self._stacks)}
            if parts.path not in routes:
                self._send(404, b"Not found.", "text/plain; charset=utf-8")
                return
            wanted, serve = routes[parts.path]
            if method != wanted and not (method == "HEAD" and wanted == "GET"):
                self._send(405, f"Use {wanted} here.".encode(), "text/plain; charset=utf-8", {"Allow": wanted})
                return
            try:
                serve()
            except Exception as exc:        # the page must never take the launcher down
                log.debug("live page: %s %s failed", method, parts.path, exc_info=True)
                self._send(500, f"{type(exc).__name__}: {exc}".encode(), "text/plain; charset=utf-8")

        def _page(self) -> None:
            nonce = secrets.token_urlsafe(16)
            csp = (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; "
                   "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
            self._send(200, page.render(nonce), "text/html; charset=utf-8", {"Content-Security-Policy": csp})

        def _status(self) -> None:
            self._json(monitor.status.snapshot())

        def _stacks(self) -> None:
            self._json(monitor.status.stacks())

        def _json(self, value: dict) -> None:
            self._send(200, json.dumps(value).encode(), "application/json")

        def _send(self, code: int, body: bytes, kind: str, headers: Optional[dict] = None) -> None:
            self.send_response(code, HTTPStatus(code).phrase)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("X-Frame-Options", "DENY")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:
            # Never the query: it holds the token.
            log.debug("live page: %s %s from %s", getattr(self, "command", None),
                      urlsplit(getattr(self, "path", "") or "").path, self.client_address[0])

        def log_request(self, code="-", size="-") -> None:
            self.log_message("")

    return Handler
