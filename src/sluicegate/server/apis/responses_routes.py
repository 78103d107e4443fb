"""The Responses API's routes: create, retrieve, cancel and delete a response.

A Responses body goes through ``responses_api.to_chat_request``; it is then
planned, admitted, metered and streamed as any generation, written by
``core/wire/responses.py``; its refusals are in OpenAI's error shape.

A stored response (``response_store.py``) is a resumable stream whatever the
client asked; its ``POST`` is answered by what the client asked for:

::

    stream   background   the answer
    true     any          the log's event stream (each event with an id: line)
    false    true         the response object at once (in_progress)
    false    false        the response object once it ended (``WholeFromLog``)

A background response keeps generating with no reader until it ends or is
cancelled; another stored one, for the grace period (``resume_grace_s``).

Spec: OpenAI API reference, "Create a model response", "Get a model response",
"Cancel a response", "Delete a model response".
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from sluicegate.core.errors import RequestError
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.core.wire.contracts import Wire
from sluicegate.core.wire.responses import response_object
from sluicegate.server.admission.keys import ANONYMOUS, ApiKey
from sluicegate.server.apis.response_store import StoredResponses
from sluicegate.server.apis.responses_api import (
    ResponsesRequest,
    input_items,
    parse_responses_request,
    response_echo,
    to_chat_request,
)
from sluicegate.server.apis.translated import plan_translated
from sluicegate.server.apis.whole_from_log import WholeFromLog
from sluicegate.server.http.answers import error_answer, json_answer
from sluicegate.server.http.errors import (
    StoreError,
    Unavailable,
    store_error_code,
    store_refusal_message,
)
from sluicegate.server.prepare.plan import Plan
from sluicegate.server.resumable.log_response import LogStreamResponse
from sluicegate.server.resumable.requests import owner_of
from sluicegate.server.resumable.streams import ResumableStreams

if TYPE_CHECKING:
    from sluicegate.server.apis.completion_routes import CompletionRoutes

__all__ = ["ResponsesRoutes"]

logger = logging.getLogger(__name__)


CHAT_NAMES = {
    "max_tokens": "max_output_tokens",
    "messages": "input",
    "response_format": "text.format",
    "tools[].function.parameters": "tools[].parameters",
}
"""The Responses API's names of the chat parameters its requests become."""


@dataclasses.dataclass(slots=True)
class _Asked:
    """What one ``POST`` asked, kept by its planner for its answer; ``kept`` is
    set once its first record is written (its end hook waits for it)."""

    request: ResponsesRequest | None = None
    items: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    plan: Plan | None = None
    record: dict[str, Any] | None = None
    kept: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


class ResponsesRoutes:
    """The Responses API's endpoints over the app's generation routes.

    Args:
        routes: the app's generation routes.
        resumable: the app's resumable streams (where stored responses go).
    """

    def __init__(self, routes: CompletionRoutes, resumable: ResumableStreams) -> None:
        self._routes = routes
        self._resumable = resumable
        self._stored = StoredResponses(resumable)

    def routes(self) -> list[Route]:
        """The Starlette routes of the four endpoints."""
        one = "/v1/responses/{response_id}"
        stored = self._stored
        return [
            Route("/v1/responses", self.create, methods=["POST"]),
            Route(one, stored.retrieve, methods=["GET"]),
            Route(one, stored.delete, methods=["DELETE"]),
            Route(one + "/cancel", stored.cancel, methods=["POST"]),
            Route(one + "/input_items", self.input_items, methods=["GET"]),
        ]

    async def input_items(self, request: Request) -> Response:
        """``GET /v1/responses/{id}/input_items``: not served, a 400 naming it."""
        refused = RequestError(
            "Listing input items is not supported by this server; a stored"
            " response's input is chained with previous_response_id",
            code="unsupported_endpoint",
        )
        return error_answer(refused)

    async def create(self, request: Request) -> ASGIApp:
        """``POST /v1/responses``: a response, streamed or whole, stored or not."""
        asked = _Asked()

        async def plan(
            body: dict[str, Any], response_id: str, key: ApiKey | None, small: bool
        ) -> Plan:
            return await self._plan(asked, body, response_id, key, small)

        async def ended(machine: Wire) -> None:
            await asked.kept.wait()
            if asked.record is not None:
                await self._stored.ended(asked.record, machine)

        try:
            answer = await self._routes._generate(
                request, Endpoint.RESPONSES, plan, ended
            )
            ask, planned = asked.request, asked.plan
            if not isinstance(answer, LogStreamResponse) or planned is None:
                return answer  # not stored, or refused
            assert ask is not None, "the planner parsed the request"
            if answer.response_id != planned.header.id:
                return await self._retried(request, answer, ask)  # the key's log
            try:
                asked.record = await self._stored.keep(
                    planned.header, asked.items, ask.background
                )
            except StoreError as exc:  # the shared store cannot be reached
                return await self._unkept(answer, exc)
        finally:
            asked.kept.set()
        if ask.stream:
            return answer
        if ask.background:
            await answer.aclose()  # nobody reads it: it runs on its own
            snapshot = response_object(planned.header, "in_progress", [])
            return json_answer({**snapshot, "background": True})
        return WholeFromLog(answer, self._stored, owner_of(request))

    async def _unkept(self, answer: LogStreamResponse, exc: StoreError) -> Response:
        """A response whose record could not be kept (nothing could retrieve
        it): aborted, and its client answered the 503 of an unreachable store."""
        refused = self._resumable.unavailable(exc)
        if answer.answered is not None:  # a whole plan's row: this status
            answer.answered(refused.status_code)
        await answer.aclose()
        self._resumable.abort(answer.response_id)
        return refused

    async def _retried(
        self, request: Request, answer: LogStreamResponse, ask: ResponsesRequest
    ) -> ASGIApp:
        """A retry that its ``Idempotency-Key`` attached to a kept response:
        answered as the first ``POST`` was, from that response."""
        if ask.stream:
            return answer
        if not ask.background:
            return WholeFromLog(answer, self._stored, owner_of(request))
        await answer.aclose()
        return await self._stored.current(answer.response_id, owner_of(request))

    async def _plan(
        self,
        asked: _Asked,
        body: dict[str, Any],
        response_id: str,
        key: ApiKey | None,
        small: bool,
    ) -> Plan:
        routes = self._routes
        ask = parse_responses_request(body)
        default = routes.config.store_responses
        stored = ask.background or (default if ask.store is None else ask.store)
        history: list[dict[str, Any]] = []
        if ask.previous_response_id is not None:
            owner = key.key_id if key is not None else ANONYMOUS
            try:
                history = await self._stored.history(ask.previous_response_id, owner)
            except StoreError as exc:  # the shared store cannot be reached
                logger.warning("stored responses unreadable, refusing: %s", exc)
                raise Unavailable(
                    store_refusal_message(exc),
                    store_error_code(exc),
                    routes.config.retry_after_s,
                ) from exc
        plan = await plan_translated(
            routes,
            Endpoint.RESPONSES,
            CHAT_NAMES,
            lambda: to_chat_request(ask, stored, history),
            response_id,
            key,
            small,
        )
        plan = dataclasses.replace(
            plan,
            header=dataclasses.replace(plan.header, echo=response_echo(ask)),
            background=ask.background,
            whole=stored and not ask.stream and not ask.background,
        )
        if stored:
            asked.request, asked.plan = ask, plan
            asked.items = [*history, *input_items(ask)]
        return plan
