"""The Messages API's routes: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

Both go through the chat path (``messages_api.to_chat_request``); a message is
then planned, admitted, metered and streamed as any generation, written by
``core/wire/messages.py``, its refusals in Anthropic's shape.

Spec: Anthropic API reference, "Messages" and "Count message tokens".
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from sluicegate.core.errors import EngineError, RequestError
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.core.wire.contracts import Wire
from sluicegate.engines.base import OutputKind
from sluicegate.engines.upstream.count import TRIED
from sluicegate.server.admission.keys import ApiKey
from sluicegate.server.apis.messages_api import parse_messages_request, to_chat_request
from sluicegate.server.config import ServerConfig
from sluicegate.server.http.answers import error_answer, json_answer
from sluicegate.server.http.bodies import read_json_object
from sluicegate.server.http.errors import AdmissionError
from sluicegate.server.prepare.models import ServedModel, ServedModels
from sluicegate.server.prepare.plan import Plan
from sluicegate.server.prepare.tokens import plan_chat
from sluicegate.server.schemas.chat import ChatCompletionRequest

__all__ = [
    "MESSAGES_PATHS",
    "Generating",
    "MessagesRoutes",
    "named_as",
    "with_endpoint",
]

MESSAGES_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
"""The paths whose refusals (the guard's too) are in Anthropic's shape."""

_Planner = Callable[[dict[str, Any], str, ApiKey | None, bool], Awaitable[Plan]]


CHAT_NAMES = {
    "stop": "stop_sequences",
    "response_format": "output_config.format",
    "tools[].function.parameters": "tools[].input_schema",
}
"""The Messages API's names of the chat parameters its requests become."""


@contextlib.contextmanager
def named_as(names: Mapping[str, str]) -> Iterator[None]:
    """Inside: a ``RequestError`` from the chat checks an API's request goes
    through names that API's parameters (``RequestError.rename_params``)."""
    try:
        yield
    except RequestError as exc:
        exc.rename_params(names)
        raise


class Generating(Protocol):
    """What the routes need of the app's generation routes (``CompletionRoutes``)."""

    models: ServedModels
    config: ServerConfig

    async def _generate(
        self,
        request: Request,
        endpoint: Endpoint,
        planner: _Planner,
        ended: Callable[[Wire], Awaitable[None]] | None = None,
    ) -> ASGIApp: ...

    async def _check_admissible(
        self, key: ApiKey | None, request: ChatCompletionRequest, small: bool
    ) -> ServedModel: ...


def with_endpoint(plan: Plan, endpoint: Endpoint) -> Plan:
    """``plan``, its responses written by ``endpoint``'s stream machine."""
    header = dataclasses.replace(plan.header, endpoint=endpoint)
    return dataclasses.replace(plan, header=header)


class MessagesRoutes:
    """The two Messages endpoints over the app's generation routes."""

    def __init__(self, routes: Generating) -> None:
        self._routes = routes

    async def create(self, request: Request) -> ASGIApp:
        """``POST /v1/messages``: a message, streamed or whole."""
        return await self._routes._generate(request, Endpoint.MESSAGES, self._plan)

    async def _plan(
        self, body: dict[str, Any], response_id: str, key: ApiKey | None, small: bool
    ) -> Plan:
        routes = self._routes
        request = parse_messages_request(body)
        with named_as(CHAT_NAMES):
            chat = to_chat_request(request)
            served = await routes._check_admissible(key, chat, small)
            plan = await plan_chat(
                chat, response_id, served.engine, served.template, routes.config
            )
        return with_endpoint(plan, Endpoint.MESSAGES)

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, the prompt's
        tokens through the model's chat template; nothing is generated.

        An engine that takes text (an upstream server) has the prompt counted
        by the upstream's tokenizer (``engines/upstream/count.py``); one with
        no counter is a 400 naming the model, never a 0 a client would take
        for a count.
        """
        config = self._routes.config
        try:
            body = await read_json_object(request, config.max_body_bytes)
            with named_as(CHAT_NAMES):
                chat = to_chat_request(parse_messages_request(body, counting=True))
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
