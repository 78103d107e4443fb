"""The Responses API's stream machine and bodies (to be written)."""

from __future__ import annotations

from typing import Any

from sluicegate.core.chunks import ResponseHeader

__all__ = ["ResponsesStream", "response_body"]


class ResponsesStream:
    def __init__(self, header: ResponseHeader, filler: object, step: int) -> None:
        raise NotImplementedError


def response_body(header: ResponseHeader, whole: object) -> dict[str, Any]:
    raise NotImplementedError
