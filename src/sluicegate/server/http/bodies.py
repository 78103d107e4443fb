"""Request bodies: JSON only, read with a size limit, decoded as one JSON object.

The ``Content-Type`` must be ``application/json`` (parameters such as
``charset`` allowed), or the body is not read (415): a web page can make a
browser POST ``text/plain`` to any server without asking it first (no CORS
preflight), while ``application/json`` needs the server's consent, which this
server never gives.

The size limit is checked twice: against ``Content-Length`` before reading
anything, and against the bytes actually received while reading (a chunked body
has no ``Content-Length``, and a client may send more than it declared).

A body sent with ``Content-Encoding: gzip`` or ``deflate`` (zlib) is decoded as
it arrives, as Anthropic's and OpenAI's APIs take compressed bodies: the same
limit bounds the bytes received and the bytes decoded, and decoding stops at
the first byte past it (413), so a small body that inflates to gigabytes costs
at most the limit in memory and in work. Another coding is refused unread (415
``unsupported_content_encoding``), as is a body that is not valid for its
coding (400 ``invalid_encoding``): it was read as JSON before, and refused as
such or, worse, taken.

Spec: RFC 9110, "8.4. Content-Encoding", "15.5.14. 413 Content Too Large" and
"15.5.16. 415 Unsupported Media Type"; RFC 1950-1952 (zlib, deflate, gzip);
WHATWG Fetch, "CORS-safelisted request-header"; OpenAI API reference, "Error
codes".
"""

from __future__ import annotations

import zlib
from typing import Any

import orjson
from starlette.requests import Request

from sluicegate.core.errors import (
    BodyTooLarge,
    RequestError,
    UnsupportedMediaType,
    bounded_repr,
)

__all__ = ["CODINGS", "read_json_object"]

CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""The content codings a body may come in (besides ``identity``), each with the
``wbits`` zlib decodes it with (gzip's header, or zlib's)."""


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    """The request body as a JSON object.

    Args:
        request: the incoming request; its body stream is consumed.
        max_bytes: the largest body accepted, in bytes.

    Returns:
        The decoded object (a ``dict`` with ``str`` keys).

    Raises:
        UnsupportedMediaType: 415, no ``Content-Type: application/json``, or
            a ``Content-Encoding`` not in ``CODINGS``
            (``unsupported_content_encoding``).
        BodyTooLarge: 413, by ``Content-Length``, by bytes received, or by
            bytes decoded.
        RequestError: 400 for an invalid ``Content-Length``, a body that is not
            valid for its coding (``invalid_encoding``), not UTF-8 JSON, or
            JSON that is not an object.
    """
    content_type = request.headers.get("content-type")
    media_type = (content_type or "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise UnsupportedMediaType(content_type)
    coding = request.headers.get("content-encoding", "").strip().lower()
    if coding not in ("", "identity", *CODINGS):
        raise UnsupportedMediaType(content_type, coding)
    decoder = zlib.decompressobj(CODINGS[coding]) if coding in CODINGS else None
    declared = request.headers.get("content-length")
    if declared is not None:
        # ASCII digits only ("²".isdigit()), and few enough for int() (19 digits
        # is over any body's size already).
        if not (declared.isascii() and declared.isdigit()) or len(declared) > 19:
            raise RequestError(
                f"Invalid Content-Length header: {bounded_repr(declared)}"
            )
        if int(declared) > max_bytes:
            raise BodyTooLarge(max_bytes, int(declared))
    chunks: list[bytes] = []
    seen = decoded = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > max_bytes:
            raise BodyTooLarge(max_bytes, seen)
        if decoder is None:
            chunks.append(chunk)
        else:
            decoded = _inflate(decoder, chunk, chunks, decoded, max_bytes, coding)
    if decoder is not None and (not decoder.eof or decoder.unused_data):
        why = "it ends early" if not decoder.eof else "data follows its end"
        raise _invalid(coding, why)
    try:
        body = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise RequestError(
            f"The request body is not valid JSON: {exc}", code="invalid_json"
        ) from exc
    if not isinstance(body, dict):
        raise RequestError(
            f"The request body must be a JSON object; got {type(body).__name__} "
            f"({_json_kind(body)})",
            code="invalid_json",
        )
    return body


def _inflate(
    decoder: Any, data: bytes, out: list[bytes], size: int, max_bytes: int, coding: str
) -> int:
    """Decode ``data`` into ``out``; the decoded size so far. No call yields
    more than the bytes left under ``max_bytes`` and one: what does not fit
    stays in ``unconsumed_tail`` until the limit is known to be passed."""
    while data:
        try:
            piece = decoder.decompress(data, max_bytes - size + 1)
        except zlib.error as exc:
            raise _invalid(coding, str(exc)) from exc
        size += len(piece)
        if size > max_bytes:
            raise BodyTooLarge(max_bytes, max_bytes, coding)
        out.append(piece)
        data = decoder.unconsumed_tail
    return size


def _invalid(coding: str, why: str) -> RequestError:
    return RequestError(
        f"The request body is not valid {coding}: {why}", code="invalid_encoding"
    )


_JSON_KINDS = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _json_kind(value: object) -> str:
    return _JSON_KINDS.get(type(value), type(value).__name__)
