"""The REST front door against web pages: the Host a request names, and the type of what it sends.

A web page the user visits can make the browser send requests to ``127.0.0.1``. Two rules keep it
from driving the gateway:

* **Host.** On a loopback bind every request must name a loopback host (``localhost``, ``127.x.y.z``,
  ``[::1]``, any port) or one of ``allowed_hosts``; anything else is ``421 Misdirected Request``. A
  page that rebinds its own DNS name to 127.0.0.1 (DNS rebinding) is then still refused: its
  browser sends the page's name as Host. Beyond loopback the check runs only when ``allowed_hosts``
  is set (such a gateway needs bearer tokens anyway). A request without a Host header (HTTP/1.0)
  passes: a browser always sends one. ``allowed_hosts: ["*"]`` turns the check off.
* **Content-Type.** Every request that may change something (any method but GET, HEAD and OPTIONS)
  must send ``application/json`` (any parameters, e.g. ``; charset=utf-8``) or
  ``application/octet-stream`` (the binary tensor extension; tritonclient's asyncio client sends it
  for every POST), else ``415``. A browser sends neither cross-site without asking first (a CORS
  preflight, which the gateway never grants), while ``text/plain``, forms and multipart it sends
  freely. A request with no Content-Type at all (tritonclient's sync client, ``curl -X POST``
  without a body) passes unless it carries an ``Origin`` header naming another site: browsers add
  ``Origin`` to every POST, and a page may POST a body without a type.

The check runs in front of authentication and the infer fast path, before any body is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import orjson

from sloserve.gateway.config import is_loopback

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ACCEPTED_TYPES = (b"application/json", b"application/octet-stream")
_CACHE = 256  # Host values remembered as accepted (a client sends the same one every time)


def host_name(value: str) -> str:
    """The host part of a Host header, lower case, without its port or IPv6 brackets.

    >>> host_name("LocalHost:8000"), host_name("[::1]:8000"), host_name("127.0.0.1"), host_name("::1")
    ('localhost', '::1', '127.0.0.1', '::1')
    """
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        return v[1:end] if end > 0 else v
    if v.count(":") == 1:  # name:port (an unbracketed IPv6 address has several colons)
        return v.split(":", 1)[0]
    return v


def loopback_name(name: str) -> bool:
    """Whether a Host's name (see :func:`host_name`) can only mean this machine."""
    return is_loopback(name)


class FrontDoor:
    """ASGI middleware: 421 for a Host this server does not answer to, 415 for a state-changing
    request whose Content-Type a web page could send cross-site (see the module docstring)."""

    def __init__(self, app: Callable, *, loopback: bool, allowed_hosts: Iterable[str] = ()):
        self.app = app
        allowed = {host_name(h) for h in allowed_hosts}
        self.loopback = loopback
        # on a loopback bind the Host is always checked; beyond it only against a non-empty list
        self.check_host = (loopback or bool(allowed)) and "*" not in allowed
        self.allowed = frozenset(allowed)
        self._good_hosts: set[bytes] = set()
        self._good_types: set[bytes] = set()

    @classmethod
    def from_settings(cls, app: Callable, settings) -> FrontDoor:
        return cls(app, loopback=is_loopback(settings.host), allowed_hosts=settings.allowed_hosts)

    def host_allowed(self, raw: bytes) -> bool:
        name = host_name(raw.decode("latin-1"))
        return loopback_name(name) or name in self.allowed

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = origin = None
        ctypes: list[bytes] = []
        for k, v in scope["headers"]:
            if k == b"host":
                host = v
            elif k == b"content-type":
                ctypes.append(v)
            elif k == b"origin":
                origin = v
        if self.check_host and host is not None and host not in self._good_hosts:
            if not self.host_allowed(host):
                return await _refuse(send, 421, self._misdirected(host))
            if len(self._good_hosts) < _CACHE:
                self._good_hosts.add(host)
        if scope["method"] not in SAFE_METHODS:
            if ctypes:
                for ct in ctypes:
                    if ct not in self._good_types:
                        if ct.split(b";", 1)[0].strip().lower() not in ACCEPTED_TYPES:
                            return await _refuse(send, 415, _unaccepted(scope, ct))
                        if len(self._good_types) < _CACHE:
                            self._good_types.add(ct)
            elif origin is not None and not _same_origin(origin, host):
                return await _refuse(send, 415, _untyped_from_a_page(scope, origin))
        return await self.app(scope, receive, send)

    def _misdirected(self, host: bytes) -> str:
        names = "localhost, 127.0.0.1 and [::1]" + (f" and {sorted(self.allowed)}" if self.allowed else "")
        where = "listens on a loopback address and " if self.loopback else ""
        return (
            f"this server does not answer to Host {host.decode('latin-1')!r:.100}: it "
            f"{where}answers {names} (any port) only; if a proxy or a DNS name of yours points here, add that "
            "name to allowed_hosts (SLOSERVE_ALLOWED_HOSTS)"
        )


_EXPECTED = (
    "send Content-Type: application/json (or application/octet-stream with the binary tensor extension's "
    "Inference-Header-Content-Length)"
)


def _unaccepted(scope: dict, ctype: bytes) -> str:
    what = f"{scope['method']} {scope['path']:.200}"
    return f"Content-Type {ctype.decode('latin-1')!r:.100} is not accepted for {what}: {_EXPECTED}"


def _untyped_from_a_page(scope: dict, origin: bytes) -> str:
    return (
        f"{scope['method']} {scope['path']:.200} from a web page (Origin {origin.decode('latin-1')!r:.100}) without "
        f"a Content-Type is not accepted: {_EXPECTED}"
    )


def _same_origin(origin: bytes, host: bytes | None) -> bool:
    """Whether ``Origin`` names this very server (a page it serves itself, such as /docs)."""
    _, sep, rest = origin.partition(b"://")
    return bool(sep) and host is not None and rest.lower() == host.lower()


async def _refuse(send: Callable, status: int, message: str) -> None:
    body = orjson.dumps({"error": message})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),  # the body, if any, is never read
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
