"""The OpenAPI document of the two generation endpoints, built from their models.

Served at ``GET /openapi.json`` so that schema-driven tools (clients, fuzzers such as
schemathesis) see exactly what the server validates: the request bodies are the JSON
schemas of the pydantic models in ``server/schemas/chat.py``. Responses are described by
status and content type only; their shapes are the OpenAI objects.

Spec: OpenAPI 3.1; OpenAI API reference, "Create chat completion", "Create
completion".
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sluicegate import __version__
from sluicegate.server.schemas.chat import ChatCompletionRequest, CompletionRequest

__all__ = ["openapi_document"]

_ERROR = {"description": "OpenAI error object", "content": {"application/json": {}}}


def _operation(summary: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "summary": summary,
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        },
        "responses": {
            "200": {
                "description": "JSON, or an event stream when ``stream`` is true",
                "content": {"application/json": {}, "text/event-stream": {}},
            },
            "400": _ERROR,
            "401": _ERROR,
            "404": _ERROR,
            "413": _ERROR,
            "429": _ERROR,
            "503": _ERROR,
        },
    }


@cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document (a JSON-able dict) of the generation endpoints.

    Built once per process (pydantic's JSON schemas of the two request models
    take about 8 ms of CPU, which every app created paid): every call returns
    the same dict, which callers must not change.
    """
    return {
        "openapi": "3.1.0",
        "info": {"title": "sluicegate", "version": __version__},
        "paths": {
            "/v1/chat/completions": {
                "post": _operation(
                    "Create chat completion", ChatCompletionRequest.model_json_schema()
                )
            },
            "/v1/completions": {
                "post": _operation(
                    "Create completion", CompletionRequest.model_json_schema()
                )
            },
        },
    }
