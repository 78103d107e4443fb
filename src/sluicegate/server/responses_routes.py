"""The Responses API's route: ``POST /v1/responses``, through the chat path.

A Responses body goes through ``responses_api.to_chat_request``; it is then
planned, admitted, metered and streamed as any generation, written by
``core/responses_wire.py``; its refusals are in OpenAI's error shape.

Spec: OpenAI API reference, "Create a model response".
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp

from sluicegate.core.chunks import Endpoint
from sluicegate.server.admission import ApiKey
from sluicegate.server.answers import error_response
from sluicegate.server.messages_routes import Generating, with_endpoint
from sluicegate.server.plan import Plan
from sluicegate.server.prepare import plan_chat
from sluicegate.server.responses_api import parse_responses_request, to_chat_request

__all__ = ["ResponsesRoutes"]


class ResponsesRoutes:
    """``POST /v1/responses`` over the app's generation routes."""

    def __init__(self, routes: Generating) -> None:
        self._routes = routes

    async def create(self, request: Request) -> ASGIApp:
        """``POST /v1/responses``: a response, streamed or whole."""
        return await self._routes._generate(
            request, Endpoint.RESPONSES, self._plan, error_response
        )

    async def _plan(
        self, body: dict[str, Any], response_id: str, key: ApiKey | None, small: bool
    ) -> Plan:
        routes = self._routes
        chat = to_chat_request(parse_responses_request(body))
        served = await routes._check_admissible(key, chat, small)
        plan = await plan_chat(
            chat, response_id, served.engine, served.template, routes.config
        )
        return with_endpoint(plan, Endpoint.RESPONSES)
