"""The Messages API's routes: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

Both go through the chat path (``messages_api.to_chat_request``); a message is
then planned, admitted, metered and streamed as any generation, written by
``core/wire/messages.py``, its refusals in Anthropic's shape.

Spec: Anthropic API reference, "Messages" and "Count message tokens".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from sluicegate.core.errors import EngineError, RequestError
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.engines.base import OutputKind
from sluicegate.engines.upstream.count import TRIED
from sluicegate.server.admission.keys import ApiKey
from sluicegate.server.apis.messages_api import to_chat_request
from sluicegate.server.apis.translated import named_as, plan_translated
from sluicegate.server.http.answers import error_answer, json_answer
from sluicegate.server.http.bodies import read_json_object
from sluicegate.server.http.errors import AdmissionError
from sluicegate.server.prepare.plan import Plan
from sluicegate.server.prepare.tokens import plan_chat
from sluicegate.server.schemas.anthropic_messages import parse_messages_request

if TYPE_CHECKING:
    from sluicegate.server.apis.completion_routes import CompletionRoutes

__all__ = ["MessagesRoutes"]

CHAT_NAMES = {
    "stop": "stop_sequences",
    "response_format": "output_config.format",
    "tools[].function.parameters": "tools[].input_schema",
}
"""The Messages API's names of the chat parameters its requests become."""


class MessagesRoutes:
    """The two Messages endpoints over the app's generation routes."""

    def __init__(self, routes: CompletionRoutes) -> None:
        self._routes = routes

    async def create(self, request: Request) -> ASGIApp:
        """``POST /v1/messages``: a message, streamed or whole."""
        return await self._routes._generate(request, Endpoint.MESSAGES, self._plan)

    async def _plan(
        self, body: dict[str, Any], response_id: str, key: ApiKey | None, small: bool
    ) -> Plan:
        request = parse_messages_request(body)
        return await plan_translated(
            self._routes,
            Endpoint.MESSAGES,
            CHAT_NAMES,
            lambda: to_chat_request(request),
            response_id,
            key,
            small,
        )

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, the prompt's
        tokens through the model's chat template; nothing is generated.

        An engine that takes text (an upstream server) has the prompt counted
        by the upstream's tokenizer (``engines/upstream/count.py``); one with
        no counter is a 400 naming the model, never a 0 a client would take
        for a count; one whose counter is slower than its ``count_timeout_s``
        is a 504 that says so.
        """
        config = self._routes.config
        try:
            body = await read_json_object(request, config.max_body_bytes)
            with named_as(CHAT_NAMES):
                asked = parse_messages_request(body, counting=True)
                translation = to_chat_request(asked)
                chat = translation.chat
                with named_as(translation.names):
                    served = self._routes.models.resolve(chat.model)
                    plan = await plan_chat(
                        chat, "count_tokens", served.engine, served.template, config
                    )
            engine = served.engine
            if engine.output_kind is OutputKind.TEXT:
                counted = None
                if engine.capabilities.counts_prompts:
                    counted = await engine.count_prompt(plan.requests()[0], body)
                if counted is None:
                    raise RequestError(
                        f"count_tokens cannot count the prompts of {chat.model!r}:"
                        " its upstream offers no token counter (asked"
                        f" {TRIED})",
                        code="count_unavailable",
                    )
                return json_answer({"input_tokens": counted})
        except (RequestError, EngineError, AdmissionError) as exc:
            return error_answer(exc, config.retry_after_s, Endpoint.MESSAGES)
        return json_answer({"input_tokens": plan.header.prompt_tokens})
