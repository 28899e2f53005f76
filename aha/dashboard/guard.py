"""Which requests the dashboard answers: only those whose Host names this server, and, for a request that changes
state, only those sent by the dashboard's own page (or by no browser at all) with a JSON body.

Why: any web page open in the same browser can POST to 127.0.0.1 (a "simple" request, e.g. text/plain, skips
the CORS preflight) and, by DNS rebinding (evil.example re-pointed at 127.0.0.1), read the answers as well.
- Host: a rebinding browser sends the attacker's name, so a name that is not localhost, 127.0.0.1, [::1] or
  the configured host is refused (421) on every request. Any port is accepted, so tunnels keep working. When
  the server binds every address (0.0.0.0, ::), an IP literal or this machine's name is accepted too:
  rebinding needs a domain name, never an IP literal.
- Origin: on POST, PUT, PATCH, DELETE an Origin, when present, must be http(s)://<an allowed host>[:port]
  ("null" is refused); Sec-Fetch-Site: cross-site is refused (403). A request with no Origin is accepted:
  browsers send Origin on every such request, so only non-browser clients (curl, scripts, tests) omit it,
  and those could send any header they liked anyway.
- Content type: such a request must say application/json (415). A browser cannot send that cross-site
  without a preflight, which this server never grants.

And what every answer carries (Inert): `X-Content-Type-Options: nosniff`, so that a browser reads each answer as the
type it is sent as, and a Content-Security-Policy: the pages' own (APP_CSP: scripts and styles only from this
server, no inline script, no eval, no framing), or for a run's file the inert FILE_CSP (no script, no requests, a
sandbox), so that a file written into a run folder never runs as this dashboard.
"""

from __future__ import annotations

import ipaddress
import socket

from starlette.datastructures import MutableHeaders
from starlette.responses import JSONResponse

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("0.0.0.0", "::", "")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
JSON_TYPE = "application/json"
APP_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
           "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
"""The pages' policy. Inline styles are allowed: the pages set colours and widths in style attributes."""
FILE_CSP = "default-src 'none'; style-src 'unsafe-inline'; sandbox"
"""A run file's policy: nothing loads or runs (the inline style is the browser's own image view's)."""


def host_name(value: str) -> str | None:
    """A Host value -> its lower-cased name, brackets off an IPv6 literal; None when malformed.
    E.g. "LocalHost:8765" -> "localhost", "[::1]:80" -> "::1", "localhost:80x" -> None."""
    value = value.strip().lower()
    if value.startswith("["):
        name, closed, rest = value[1:].partition("]")
        if not closed:
            return None
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit()):
        return None
    return name or None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


class HostPolicy:
    """The names this server answers to, for a server configured to bind `bind_host`."""

    def __init__(self, bind_host: str):
        bound = bind_host.strip().strip("[]").lower()
        self.any_ip = bound in WILDCARD_BINDS
        self.names = {*LOCAL_NAMES, bound} | ({socket.gethostname().lower()} if self.any_ip else set())

    def allows(self, name: str | None) -> bool:
        return name is not None and (name in self.names or (self.any_ip and _is_ip(name)))

    def allows_origin(self, origin: str) -> bool:
        """E.g. "http://localhost:3000" yes; "null", "file://", "http://evil.example" no."""
        scheme, sep, netloc = origin.strip().partition("://")
        return bool(sep) and scheme.lower() in ("http", "https") and self.allows(host_name(netloc))


def refusal(method: str, headers: dict[str, str], policy: HostPolicy) -> tuple[int, str] | None:
    """(status, message) when the request must be refused, else None. `headers` has lower-cased names."""
    if not policy.allows(host_name(headers.get("host", ""))):
        return 421, "this dashboard answers only to localhost, 127.0.0.1, [::1] or its configured host"
    if method.upper() in SAFE_METHODS:
        return None
    if "origin" in headers and not policy.allows_origin(headers["origin"]):
        return 403, "cross-site request refused: the Origin is not this dashboard"
    if headers.get("sec-fetch-site", "").strip().lower() == "cross-site":
        return 403, "cross-site request refused (Sec-Fetch-Site: cross-site)"
    if headers.get("content-type", "").split(";")[0].strip().lower() != JSON_TYPE:
        return 415, f"the body must be sent as {JSON_TYPE}"
    return None


class Guard:
    """ASGI middleware: refuses (see `refusal`) before the app sees the request."""

    def __init__(self, app, bind_host: str):
        self.app, self.policy = app, HostPolicy(bind_host)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            refused = refusal(scope["method"], headers, self.policy)
            if refused is not None:
                await JSONResponse({"error": refused[1]}, status_code=refused[0])(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Inert:
    """ASGI middleware: every answer with `nosniff` and a Content-Security-Policy (APP_CSP where the handler set
    none)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        async def send_inert(message):
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["X-Content-Type-Options"] = "nosniff"
                headers.setdefault("Content-Security-Policy", APP_CSP)
            await send(message)
        await self.app(scope, receive, send_inert if scope["type"] == "http" else send)
