"""The chat and completions endpoints, and the parts every route shares.

``CompletionRoutes`` builds the server's parts from its config (models, ledger,
admission, quotas, Redis, metrics, drain, resumable streams) and answers
``POST /v1/chat/completions`` and ``POST /v1/completions``: read the body (413
over the limit), validate (400), resolve the model (404), template and tokenize,
check the context window (400), submit to the engine (503 when its queue is
full), then answer with an event stream or one JSON body (``sse_response.py``,
``json_response.py``). The Responses and Messages routes plan their own
requests and hand them to the same ``_generate``.

Access comes first, before routing (``access.py``, ``CompletionRoutes.guard``): the
route's API key or admin key (401, 403), or for a route that needs no key, the ``Host``
name (421). Then admission (``server/admission/keys.py``): a draining server, or one
whose ledger file is too far behind, answers 503, then the body is read (415 unless
``application/json``, 413 over the limit); after planning, the key's access to the model
(403), whether the request could ever fit (400 naming ``n`` or ``max_tokens``) and its
quotas (429) are checked, and only then is the engine asked (503 when its queue is full,
with the quota it took given back). 429 and 503 carry ``Retry-After``. Access and quotas
are checked once before planning too, for the least the request can reserve, so a
request they refuse costs no template or tokenizer work.

Every request is recorded once in ``app.state.ledger`` (except those refused by
access: they are only counted), and an admitted one has an ``open`` row in its
file from admission to its end.

Spec: OpenAI API reference, "Chat", "Completions" and "Error codes";
docs/DESIGN.md, "Status first, errors in band".
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Scope

from sluicegate.core.endstate import EndState
from sluicegate.core.errors import EngineError, RequestError
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.core.wire.contracts import Wire
from sluicegate.engines.base import Engine
from sluicegate.engines.clocks import Timers
from sluicegate.server.admission.access import API_KEY, Access
from sluicegate.server.admission.keys import ANONYMOUS, Admission, ApiKey
from sluicegate.server.apis.info_routes import shutting_down
from sluicegate.server.apis.messages_api import MESSAGES_PATHS
from sluicegate.server.config import ServerConfig
from sluicegate.server.http.answers import error_answer, nothing, status_of
from sluicegate.server.http.bodies import read_json_object
from sluicegate.server.http.errors import (
    CLIENT_CLOSED,
    AdmissionError,
    InternalError,
    OverQuota,
    Unavailable,
)
from sluicegate.server.ledger.ledger import Ledger
from sluicegate.server.metering.meter import Meter
from sluicegate.server.metering.metrics import Metrics
from sluicegate.server.prepare.models import ServedModel, ServedModels
from sluicegate.server.prepare.tokens import (
    Plan,
    admission_floor,
    new_response_id,
    plan_chat,
    plan_completion,
)
from sluicegate.server.redis.client import connect
from sluicegate.server.redis.quotas import RedisQuotas
from sluicegate.server.redis.store import open_redis_store
from sluicegate.server.resumable.streams import AttachExisting, ResumableStreams
from sluicegate.server.schemas.chat import ChatCompletionRequest, CompletionRequest
from sluicegate.server.schemas.parse import parse_chat_request, parse_completion_request
from sluicegate.server.stores.memory_store import open_memory_store
from sluicegate.server.streaming.buffer import LiveStreams
from sluicegate.server.streaming.disconnect import DisconnectRace
from sluicegate.server.streaming.generation import RESPONDED_GRACE_S, Generation
from sluicegate.server.streaming.json_response import CompletionResponse
from sluicegate.server.streaming.shared import StreamLimits
from sluicegate.server.streaming.shutdown import Drain
from sluicegate.server.streaming.sse_response import EventStreamResponse

__all__ = ["EXACT_RETRY_AFTER_BYTES", "CompletionRoutes"]

logger = logging.getLogger(__name__)

_Planner = Callable[[dict[str, Any], str, ApiKey | None, bool], Awaitable[Plan]]

# A request short only of tokens/minute quota whose body is at most this many
# bytes is still planned, so that its 429 carries the wait for what it really
# reserves (its prompt counted): rendering and tokenizing that much costs about
# what parsing it did. A larger one (or one sent without Content-Length) is
# refused on the least it can reserve, before any template work, with the wait for
# that least: a lower bound, so its retry may get a second 429 with the rest.
EXACT_RETRY_AFTER_BYTES = 64 * 1024


class CompletionRoutes:
    """The generation endpoints and the guard, sharing the models, config and ledger."""

    def __init__(
        self,
        engines: Sequence[Engine],
        config: ServerConfig,
        clock: Timers | None = None,
    ) -> None:
        self.models = ServedModels(
            engines,
            config.model_aliases,
            config.chat_template,
            config.reasoning_parser,
        )
        engine = self.engine = self.models.default.engine
        self.config = config
        self.ledger = Ledger(
            config.ledger_path, url=config.ledger_url, lease_s=config.ledger_lease_s
        )
        # Shared quotas (and logs) when a Redis is configured; redis-py loads then.
        self.redis = connect(config.redis_url) if config.redis_url else None
        self.quotas = (
            RedisQuotas(self.redis, config.quota, config.retry_after_s)
            if self.redis is not None
            else None
        )
        self.admission = Admission(
            config.api_keys,
            config.quota,
            submit_limit=engine.stats().submit_limit,
            shared=self.quotas,
        )
        self.live = LiveStreams()
        self.drain = Drain(self.live)
        self.metrics_ = Metrics(engine, self.live, [m.engine for m in self.models])
        self.metrics_.watch_ledger(self.ledger)
        self.access = Access(
            self.admission,
            api_keyed=bool(config.api_keys),
            admin_keys=config.admin_keys,
            allowed_hosts=config.allowed_hosts,
        )
        self.limits = StreamLimits(
            heartbeat_interval_s=config.heartbeat_interval_s,
            first_token_timeout_s=config.first_token_timeout_s,
            request_timeout_s=config.request_timeout_s,
            max_buffer_bytes=config.max_stream_buffer_bytes,
            stuck_timeout_s=config.stuck_stream_timeout_s,
            interval_s=config.stream_interval_s,
            cadence_s=config.cadence_s,
            interval_tokens=config.stream_interval,
            clock=clock,
        )
        self.resumable = ResumableStreams(
            open_memory_store(config)
            if self.redis is None
            else open_redis_store(self.redis, config),
            config,
            self.limits,
            self.live,
        )
        kept_bytes = self.resumable.store.capabilities.kept_bytes
        self.metrics_.watch_resumable(self.resumable, kept_bytes)

    async def close_redis(self) -> None:
        """Send the quota give-backs in flight, then close the Redis connections."""
        if self.quotas is not None:
            await self.quotas.aclose()
        if self.redis is not None:
            await self.redis.aclose()

    def guard(self, scope: Scope) -> Response | None:
        """Check the route's key or ``Host`` (``access.py``); the refusal, if any.

        A refusal gets no ledger row (a flood of them would fill it), only a
        count in ``sluicegate_refused_requests_total``.
        """
        try:
            scope[API_KEY] = self.access.check(scope)
        except AdmissionError as exc:
            self.metrics_.refuse(exc.code)
            messages = scope["path"] in MESSAGES_PATHS
            endpoint = Endpoint.MESSAGES if messages else Endpoint.CHAT
            return error_answer(exc, self.config.retry_after_s, endpoint)
        return None

    async def chat_completions(self, request: Request) -> ASGIApp:
        return await self._generate(request, Endpoint.CHAT, self._plan_chat)

    async def completions(self, request: Request) -> ASGIApp:
        return await self._generate(request, Endpoint.COMPLETION, self._plan_completion)

    async def _plan_chat(
        self, body: dict[str, Any], response_id: str, key: ApiKey | None, small: bool
    ) -> Plan:
        request = parse_chat_request(body)
        served = await self._check_admissible(key, request, small)
        return await plan_chat(
            request, response_id, served.engine, served.template, self.config
        )

    async def _plan_completion(
        self, body: dict[str, Any], response_id: str, key: ApiKey | None, small: bool
    ) -> Plan:
        request = parse_completion_request(body)
        served = await self._check_admissible(key, request, small)
        return await plan_completion(request, response_id, served.engine, self.config)

    async def _check_admissible(
        self,
        key: ApiKey | None,
        request: ChatCompletionRequest | CompletionRequest,
        small: bool,
    ) -> ServedModel:
        """Validate, then admission, then template: refuse what admission would
        refuse however the prompt tokenizes (403, 400, 429) before the template
        and the tokenizer run, by admitting the least the plan reserves and
        giving it back (``_admit`` admits the plan's own reserve after). A
        ``small`` request short only of tokens goes on to be planned, so that its
        429 names the wait for its real reserve (see ``EXACT_RETRY_AFTER_BYTES``).
        Returns the model the request names (404 for none served)."""
        served = self.models.resolve(request.model)
        tokens, sequences = admission_floor(request)
        try:
            await self.admission.probe(key, served.id, tokens, sequences)
        except OverQuota as error:
            if not (small and error.tokens_only):
                raise
        return served

    async def _generate(
        self,
        request: Request,
        endpoint: Endpoint,
        planner: _Planner,
        ended: Callable[[Wire], Awaitable[None]] | None = None,
    ) -> ASGIApp:
        """Everything up to the first byte; then the streaming or JSON response.

        A refusal before the first byte is answered in ``endpoint``'s API's
        own shape (``errors.error_answer``); ``ended`` is the hook of a
        resumable stream's end (``ResumableStreams.start``)."""
        # scope["path"], not request.url.path: that builds a URL per request.
        meter = Meter(self.ledger, new_response_id(endpoint), request.scope["path"])
        meter.metrics = self.metrics_
        try:
            generation = await self._admit(request, planner, meter)
        except AttachExisting as retry:  # its row is the first request's
            meter.recorded = True
            return retry.response
        except ClientDisconnect:  # gone while sending its body: nothing to answer
            meter.record(EndState.ABORTED, CLIENT_CLOSED)
            return nothing
        except (RequestError, EngineError, AdmissionError) as exc:
            response = error_answer(exc, self.config.retry_after_s, endpoint)
            meter.record(EndState.REJECTED, response.status_code)
            return response
        finally:
            if not meter.recorded and sys.exc_info()[0] is not None:
                meter.record(EndState.ERRORED, status_of(InternalError()))  # a bug
        meter.generation = generation
        meter.open()
        plan = meter.plan
        assert plan is not None, "_admit() plans before it starts a generation"
        if self.resumable.wanted(plan):
            try:
                return await self.resumable.start(generation, plan, meter, ended)
            except Unavailable as exc:  # the store failed before the first byte
                response = error_answer(exc, self.config.retry_after_s, endpoint)
                meter.record(EndState.REJECTED, response.status_code)
                return response
        if plan.stream:
            return self._event_stream(generation, plan, meter)
        return CompletionResponse(
            generation, generation.header, meter.record, self.limits, self.live
        )

    def _event_stream(
        self, generation: Generation, plan: Plan, meter: Meter
    ) -> EventStreamResponse:
        """The stream's response, with the request's padding, cadence and
        stream interval, or the server's where the request sets none."""
        config, limits = self.config, self.limits
        padded = config.obfuscation if plan.obfuscation is None else plan.obfuscation
        cadence_s = config.cadence_s if plan.cadence_s is None else plan.cadence_s
        if cadence_s != limits.cadence_s:
            limits = dataclasses.replace(limits, cadence_s=cadence_s)
        every = plan.stream_interval
        if every is not None and every != limits.interval_tokens:
            limits = dataclasses.replace(limits, interval_tokens=every)
        header = generation.header
        return EventStreamResponse(
            generation, header, limits, meter.record, self.live, padded=padded
        )

    async def _admit(
        self, request: Request, planner: _Planner, meter: Meter
    ) -> Generation:
        """Draining, body (the key was checked by ``guard``), validation, model
        access and quota (for the least the request can reserve), template and
        tokens, quota (for the plan's reserve), engine: in this order.

        Raises:
            AdmissionError: 401/403/429/503 (nothing reached the engine).
            RequestError: the body is invalid (400/404/413).
            EngineError: the engine refused (503 for a full queue).
            ClientDisconnect: the client left while sending the body, or before
                the engine accepted the request.
        """
        if self.drain.draining:
            raise shutting_down(self.config)
        if self.ledger.behind:
            raise Unavailable(
                "The usage ledger cannot keep up (its file is locked or its database"
                " unreachable); retry later",
                "ledger_behind",
                self.config.retry_after_s,
            )
        key: ApiKey | None = request.scope.get(API_KEY)  # checked by guard()
        meter.key_id = key.key_id if key is not None else ANONYMOUS
        body = await read_json_object(request, self.config.max_body_bytes)
        declared = request.headers.get("content-length")  # checked by the read
        small = declared is not None and int(declared) <= EXACT_RETRY_AFTER_BYTES
        plan = meter.plan = await planner(body, meter.response_id, key, small)
        grant = meter.grant = await self.admission.admit_async(
            key, plan.header.model, plan.reserve_tokens, len(plan.choices)
        )
        engine = self.models.resolve(plan.header.model).engine
        resumable = self.resumable.wanted(plan)
        if resumable:  # before the engine: a retry with its key attaches instead
            key_header = request.headers.get("idempotency-key")
            try:
                await self.resumable.open(plan, meter.key_id, key_header, body)
            except BaseException:
                grant.refund()
                raise
        generation = Generation(engine, plan, self.limits.clock)
        try:
            generation.start()
            if generation.awaits_acceptance or generation.awaits_cached:
                # An engine that answers with a status first (an upstream server):
                # its refusal is this response's status, not a 200 then an error;
                # once it answered 200, a long prefill waits RESPONDED_GRACE_S (or
                # a shorter heartbeat interval) before the headers and heartbeats.
                # One that reuses prompt prefixes says how much at its first
                # output, which a first event that says the usage waits for, a
                # heartbeat interval at most (Anthropic's message_start, too,
                # comes once the prompt is read).
                heartbeat_s = self.limits.heartbeat_interval_s
                patience_s = min(RESPONDED_GRACE_S, heartbeat_s)
                with DisconnectRace(request.receive) as race:
                    await generation.accepted(patience_s)
                    await generation.cached_known(heartbeat_s)
                if race.reason is not None:  # gone before the engine accepted it
                    generation.abort_unfinished()
                    grant.refund()
                    raise ClientDisconnect
        except (EngineError, RequestError):
            grant.refund()  # the engine refused it (a full queue): it cost nothing
            if resumable:
                await self.resumable.close_unstarted(plan)
            raise
        except ClientDisconnect:
            if resumable:
                await self.resumable.close_unstarted(plan)
            raise
        return generation
