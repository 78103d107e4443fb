"""Cross-origin access for named web origins: preflights and response headers.

A page on another origin (a playground served elsewhere, a web app) may call the
server from a browser only if the server says so: off by default, on for the
origins ``ServerConfig.cors_origins`` names (``--cors-origin``). ``Cors`` is
consulted by the app before routing and before the access guard, so that

- a preflight (``OPTIONS`` with ``Access-Control-Request-Method``) from an allowed
  origin is answered 204 at once: it carries no key, and the browser sends the
  real request (with its key) only after it;
- every response to an allowed origin, refusals by the guard (401, 403, 421,
  429) and event streams included, carries ``Access-Control-Allow-Origin``, so
  the page can read the OpenAI error body instead of an opaque network error.

A request from any other origin, or without ``Origin``, is served as if this
module did not exist (no header is added; its preflight gets the 405 or 401 of
any ``OPTIONS``), and the browser keeps the answer from the page.

Invariants:
    - Only the response start is touched: event-stream bodies go through the
      server's own ``send`` (``sse_response.BODY_SEND``), unchanged.
    - Credentials (cookies) are never allowed: keys travel in
      ``Authorization``, which a preflight lists in ``Allow-Headers``.

Deliberate divergences: the allowed request headers are a fixed list
(``ALLOW_HEADERS``), never an echo of what the preflight asks for; Chromium's
Private Network Access preflight is answered for allowed origins only.

Spec: WHATWG Fetch, "CORS protocol" (3.2) and "CORS-preflight fetch"; WICG,
"Private Network Access".
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette import status
from starlette.responses import Response
from starlette.types import Message, Scope, Send

__all__ = ["ALLOW_HEADERS", "ANY_ORIGIN", "Cors", "normalize_origin"]

ANY_ORIGIN = "*"
ALLOW_HEADERS = (
    "authorization, content-type, x-api-key, anthropic-version, anthropic-beta,"
    " idempotency-key, last-event-id"
)
"""Request headers a cross-origin page may send (besides the CORS-safelisted):
the key (either API's way), the Messages API's version headers, a resumable
request's ``Idempotency-Key`` and a resume's ``Last-Event-ID``."""
_ALLOW_METHODS = "GET, POST, DELETE"
_EXPOSE_HEADERS = "retry-after"
_MAX_AGE_S = 600
_MAX_ORIGIN_CHARS = 2048


def normalize_origin(origin: str) -> str:
    """``scheme://host[:port]`` lower-case, as browsers send ``Origin``; or ``*``.

    Raises:
        ValueError: not ``*`` and not an ``http``/``https`` origin (a path,
            query, user name or other scheme is refused, naming the value).
    """
    origin = origin.strip()
    if origin == ANY_ORIGIN:
        return origin
    parts = urlsplit(origin)
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        raise ValueError(
            f"a CORS origin is 'http(s)://host[:port]' or '*', got {origin!r}"
        )
    return f"{parts.scheme}://{parts.netloc.lower()}"


class Cors:
    """The CORS rules of one server.

    Args:
        origins: allowed origins (``normalize_origin`` forms; ``*``: any).

    Raises:
        ValueError: an origin is malformed (see ``normalize_origin``).
    """

    def __init__(self, origins: Iterable[str]) -> None:
        self._origins = frozenset(normalize_origin(o) for o in origins)

    def allowed(self, scope: Scope) -> bytes | None:
        """The ``Access-Control-Allow-Origin`` value for this request, or ``None``
        when it has no ``Origin`` or one not allowed."""
        value: bytes
        for name, value in scope["headers"]:
            if name == b"origin":
                if len(value) > _MAX_ORIGIN_CHARS:
                    return None
                origin = value.decode("latin-1").lower()
                if origin in self._origins:
                    return value
                return b"*" if ANY_ORIGIN in self._origins else None
        return None

    def preflight(self, scope: Scope) -> Response | None:
        """The 204 answer to an allowed origin's preflight; ``None`` otherwise."""
        if scope["method"] != "OPTIONS":
            return None
        origin = self.allowed(scope)
        names = {name for name, _ in scope["headers"]}
        if origin is None or b"access-control-request-method" not in names:
            return None
        headers = {
            "access-control-allow-origin": origin.decode("latin-1"),
            "access-control-allow-methods": _ALLOW_METHODS,
            "access-control-allow-headers": ALLOW_HEADERS,
            "access-control-max-age": str(_MAX_AGE_S),
            "vary": "Origin",
        }
        if b"access-control-request-private-network" in names:
            headers["access-control-allow-private-network"] = "true"
        return Response(status_code=status.HTTP_204_NO_CONTENT, headers=headers)

    def wrap(self, scope: Scope, send: Send) -> Send:
        """``send``, adding the CORS headers to the response start of an allowed
        origin's request; ``send`` itself for any other request."""
        origin = self.allowed(scope)
        if origin is None:
            return send
        extra = [
            (b"access-control-allow-origin", origin),
            (b"access-control-expose-headers", _EXPOSE_HEADERS.encode()),
            (b"vary", b"Origin"),
        ]

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        return send_with_cors
