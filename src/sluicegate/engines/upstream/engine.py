"""An engine that streams from OpenAI-compatible upstream servers, with failover.

``UpstreamEngine`` serves one model from a pool of upstreams (vLLM, SGLang,
TGI, llama.cpp's server, Ollama, another sluicegate). ``generate`` starts one
task per sequence that leases an upstream from the pool (``engines/upstream/pool.py``),
POSTs ``<url>/chat/completions`` or ``<url>/completions`` with ``stream: true``
and usage included, and pushes ``TextOutput`` into the sequence's
``UpstreamOutputs`` as the upstream's bytes are read (``core/upstream/reader.py``
decides what they mean). Each upstream has one pool of HTTP/1.1 keep-alive
connections, a ``HopClient`` (``engines/upstream/http.py``: aiohttp's).

Before any content, the sequence may still be refused: ``accepted()`` raises
``EngineRefused`` (the upstream's 429 or 503 with its ``Retry-After``, its 4xx
with its message) or ``EngineUnavailable`` (no upstream could be reached), so
the server answers with a status. A refusal that another upstream might not
give (a connect error, 429, 5xx) is first tried on the next eligible upstream.
The sequence is accepted at the stream's first content (a text, a tool call or
a finish), not at the upstream's 200: a 200 whose stream breaks, errs or ends
before that is such a refusal too (``failure_before_content``). Once accepted,
a failure (a reset, an in-band error, a stream without ``[DONE]``, a time
limit) is the sequence's ``EngineError``.

The parts: a sequence's state (``sequence.py``), its failover from one
upstream to the next (``failover.py``), its time limits (``limits.py``), the
reading of a 200's stream (``stream.py``: text, tool calls, usage) and the health
checks (``health.py``).

Invariants:
    - ``abort()`` and ``UpstreamOutputs.close()`` cancel the sequence's task,
      which closes the HTTP response at once: the upstream sees the client go
      and aborts its own request (that is what frees its KV cells).
    - Token counts follow the upstream's usage (``stream.py``).
    - Time limits are one timer per sequence, re-armed when it fires and at the
      first token, never per chunk.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import orjson

from sluicegate.core.errors import (
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    RequestError,
    UpstreamTimedOut,
)
from sluicegate.engines.base import (
    Capabilities,
    EngineStats,
    GenerateRequest,
    ModelInfo,
    OutputKind,
)
from sluicegate.engines.clocks import Timers
from sluicegate.engines.upstream.config import (
    UpstreamConfig,
    request_body,
    upstream_from_dict,
)
from sluicegate.engines.upstream.context import CONTINUOUS_USAGE_OWNERS, UpstreamFacts
from sluicegate.engines.upstream.count import PromptCounter
from sluicegate.engines.upstream.estimate import COUNT_BEFORE_ESTIMATE_S, PromptEstimate
from sluicegate.engines.upstream.failover import serve
from sluicegate.engines.upstream.health import check_health
from sluicegate.engines.upstream.http import AiohttpHop
from sluicegate.engines.upstream.limits import arm
from sluicegate.engines.upstream.pool import PoolMember, UpstreamCounters, UpstreamPool
from sluicegate.engines.upstream.sequence import (
    LOGPROBS_UNAVAILABLE,
    UpstreamOutputs,
    UpstreamSequence,
    end,
)
from sluicegate.engines.values import RECENT_IDS

__all__ = ["UpstreamEngine", "UpstreamOutputs"]

logger = logging.getLogger(__name__)


class UpstreamEngine:
    """A ``TextEngine`` over a pool of OpenAI-compatible servers.

    Args:
        model: the served model (its ``id`` is what clients ask for, and the
            upstream's model name unless an upstream sets its own).
        upstreams: the pool, in order (>= 1).
        max_queued, queue_timeout_s, eject_after_failures, cooldown_s,
            retry_after_s: the pool's (``UpstreamPool``).
        health_interval_s: seconds between active health checks (``0``: none).
        timers: the clock of the pool (queue waits, ejections), of the
            health checks and of the counter's absent routes; ``None``: the
            running event loop (tests step a ``ManualClock``).

    Raises:
        ValueError: no upstream, or a setting out of range.
    """

    def __init__(
        self,
        model: ModelInfo,
        upstreams: Sequence[UpstreamConfig],
        *,
        max_queued: int = 256,
        queue_timeout_s: float = 30.0,
        eject_after_failures: int = 3,
        cooldown_s: float = 10.0,
        retry_after_s: float = 1.0,
        health_interval_s: float = 5.0,
        timers: Timers | None = None,
    ) -> None:
        if not upstreams:
            raise ValueError("expected at least one upstream, got none")
        self._model = model
        self._upstreams = list(upstreams)
        self._pool_options = (max_queued, queue_timeout_s, eject_after_failures)
        self._pool_times = (cooldown_s, retry_after_s)
        self._health_interval_s = health_interval_s
        self._timers = timers
        self._clients = [AiohttpHop(u) for u in self._upstreams]
        self._counter = PromptCounter(self._upstreams[0], timers=timers)
        self._pool: UpstreamPool | None = None
        self._health: asyncio.Task[None] | None = None
        self._sequences: dict[str, UpstreamSequence] = {}
        self._closed = False
        self._rejected_usage = [0] * len(self._upstreams)
        self._counts = dict.fromkeys(
            ("prompt", "generated", "finished", "aborted", "failed"), 0
        )
        self._aborted_ids: deque[str] = deque(maxlen=RECENT_IDS)
        self._estimate = PromptEstimate()  # learned from the upstreams' usage
        self._no_logprobs_learnt: list[str] = []  # names, in the order learnt

    @classmethod
    def from_config(
        cls,
        model: ModelInfo,
        upstreams: Sequence[Mapping[str, Any]],
        environ: Mapping[str, str],
        **options: Any,
    ) -> UpstreamEngine:
        """An engine from a config file's entries (``upstream_from_dict``'s shape).

        Raises:
            ValueError: as ``upstream_from_dict``, or as the constructor.
        """
        return cls(
            model, [upstream_from_dict(s, environ) for s in upstreams], **options
        )

    @property
    def output_kind(self) -> Literal[OutputKind.TEXT]:
        """``OutputKind.TEXT``: a ``TextEngine``."""
        return OutputKind.TEXT

    @property
    def capabilities(self) -> Capabilities:
        """A pool of upstreams (``upstream_counters``), prompts counted by the
        first upstream's tokenizer (``count_prompt``), logprobs as the
        upstream gives them, listenable outputs accepted at the upstream's
        first content."""
        return Capabilities(
            upstreams=True,
            counts_prompts=True,
            logprobs=True,
            listenable=True,
            late_acceptance=True,
        )

    @property
    def model(self) -> ModelInfo:
        """The served model."""
        return self._model

    @property
    def upstreams(self) -> tuple[UpstreamConfig, ...]:
        """The pool's upstreams, in order."""
        return tuple(self._upstreams)

    async def count_prompt(
        self,
        request: GenerateRequest,
        messages_body: Mapping[str, Any],
        *,
        estimate: bool = False,
    ) -> int | None:
        """``request``'s prompt tokens by the first upstream's tokenizer, or ``None``
        when it offers none (``count.py``); with ``estimate``, then (or when no
        count came within ``COUNT_BEFORE_ESTIMATE_S`` or the upstream's shorter
        ``count_timeout_s``) this engine's estimate (``estimate.py``).

        Raises:
            UpstreamTimedOut: without ``estimate``, the counter did not answer
                within the upstream's ``count_timeout_s`` (a 504).
        """
        first = self._upstreams[0]
        model = first.model or self._model.id
        chat = orjson.loads(request_body(request, model, continuous_usage=False))
        wait_s = first.timeouts.count_s
        if estimate:  # the counter's own limit, where that is shorter, bounds it
            wait_s = min(wait_s or COUNT_BEFORE_ESTIMATE_S, COUNT_BEFORE_ESTIMATE_S)
        try:
            counted = await self._counter.count(model, chat, messages_body, wait_s)
        except TimeoutError as exc:
            if not estimate:
                why = "its upstream's token counter did not answer within"
                raise UpstreamTimedOut(
                    f"count_tokens cannot count the prompts of {self._model.id!r}"
                    f" now: {why} {wait_s:g} s (it is asked again on the next request)"
                ) from exc
            counted = None
        return self._estimate.fill(request.text_prompt, counted, estimate)

    def learn(self, facts: Sequence[UpstreamFacts]) -> None:
        """What each upstream told of itself at start-up, in pool order
        (``context.py``): the model's window where the configuration
        set none (the first upstream that told one), and continuous usage
        for an upstream left unset whose kind reports it. Before the first
        request."""
        if not self._model.context_length:
            told = next((f.context_length for f in facts if f.context_length), None)
            if told is not None:
                self._model = dataclasses.replace(self._model, context_length=told)
        for i, (upstream, fact) in enumerate(zip(self._upstreams, facts, strict=True)):
            if upstream.continuous_usage is None:
                on = fact.owned_by in CONTINUOUS_USAGE_OWNERS
                self._upstreams[i] = dataclasses.replace(upstream, continuous_usage=on)

    @property
    def pool(self) -> UpstreamPool:
        """The pool (created on the first ``generate``, on the event loop)."""
        if self._pool is None:
            loop = asyncio.get_running_loop()
            timers = self._timers or loop
            members = [PoolMember(u.name, u.max_streams) for u in self._upstreams]
            max_queued, queue_timeout_s, eject_after = self._pool_options
            cooldown_s, retry_after_s = self._pool_times
            self._pool = UpstreamPool(
                members,
                timers,
                max_queued=max_queued,
                queue_timeout_s=queue_timeout_s,
                eject_after_failures=eject_after,
                cooldown_s=cooldown_s,
                retry_after_s=retry_after_s,
            )
            if self._health_interval_s > 0:
                checks = (self._pool, self._upstreams, self._clients)
                self._health = loop.create_task(
                    check_health(*checks, self._health_interval_s, timers)
                )
        return self._pool

    def upstream_counters(self) -> list[UpstreamCounters]:
        """Each upstream's state and counters (``[]`` before the first request)."""
        if self._pool is None:
            return []
        rows = zip(self._pool.counters(), self._rejected_usage, strict=True)
        return [dataclasses.replace(r, usage_rejected_total=n) for r, n in rows]

    def generate(self, request: GenerateRequest) -> UpstreamOutputs:
        """Start ``request`` on an upstream; its outputs are ``TextOutput``.

        Raises:
            EngineUnavailable: the engine is closed.
            RequestError: ``logprobs_unavailable`` (a 400): logprobs asked of a
                pool with an upstream that gives none (configured, or learnt).
            EngineError: the request has no ``text_prompt``, or its id runs.
        """
        if self._closed:
            raise EngineUnavailable("the upstream engine is closed")
        if request.text_prompt is None:
            raise EngineError("an upstream engine needs the prompt as text")
        if request.request_id in self._sequences:
            raise EngineError(f"request {request.request_id!r} is running already")
        if request.params.logprobs is not None:
            # Any member may serve it: the pool gives what its least able gives.
            unable = next((u for u in self._upstreams if not u.logprobs), None)
            if unable is not None:
                raise RequestError(
                    f"logprobs are not available from the upstream {unable.name}",
                    param="logprobs",
                    code=LOGPROBS_UNAVAILABLE,
                )
        pool = self.pool
        loop = asyncio.get_running_loop()
        seq = UpstreamSequence(request, loop.time(), self._estimate)
        request_id = request.request_id
        seq.accept, seq.responded = loop.create_future(), loop.create_future()
        seq.outputs = UpstreamOutputs(
            lambda: self.abort(request_id), seq.accept, seq.responded
        )
        self._sequences[request_id] = seq
        seq.task = loop.create_task(self._run(seq, pool))
        arm(seq, self._upstreams)
        return seq.outputs

    def abort(self, request_id: str, *, stopped: bool = False) -> None:
        """Close ``request_id``'s upstream stream at once; idempotent.
        ``stopped`` (a stop string matched here): counted as finished."""
        seq = self._sequences.get(request_id)
        if seq is not None and seq.task is not None and not seq.task.done():
            seq.stopped = stopped
            seq.task.cancel()

    def stats(self) -> EngineStats:
        """Streams in flight and waiting, token counts from the upstreams' usage,
        and the upstreams learnt to give no logprobs."""
        c = self._counts
        pool = self._pool
        return EngineStats(
            queued=0 if pool is None else pool.queued,
            running=0 if pool is None else pool.in_flight,
            kv_cells_used=0,
            kv_cells_total=0,
            prompt_tokens=c["prompt"],
            generated_tokens=c["generated"],
            wasted_tokens=0,
            finished_requests=c["finished"],
            aborted_requests=c["aborted"],
            failed_requests=c["failed"],
            running_ids=tuple(self._sequences),
            aborted_ids=tuple(self._aborted_ids),
            logprobs_unavailable_learnt=tuple(self._no_logprobs_learnt),
        )

    def _learn_no_logprobs(self, i: int) -> None:
        """Upstream ``i`` answered a request for logprobs without any: later
        ones are refused (``generate``), and ``stats`` names it."""
        upstream = self._upstreams[i]
        if upstream.logprobs:
            self._upstreams[i] = dataclasses.replace(upstream, logprobs=False)
            self._no_logprobs_learnt.append(upstream.name)
            logger.warning(
                "the upstream %s answered a request for logprobs without any; "
                "requests for logprobs are refused until a restart",
                upstream.name,
            )

    async def aclose(self) -> None:
        """Abort every stream, stop the health checks, close the clients."""
        self._closed = True
        tasks = [s.task for s in self._sequences.values() if s.task is not None]
        if self._health is not None:
            tasks.append(self._health)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in self._clients:
            await client.aclose()
        await self._counter.aclose()

    # -- one sequence ----------------------------------------------------------

    async def _run(self, seq: UpstreamSequence, pool: UpstreamPool) -> None:
        try:
            await serve(
                seq,
                pool,
                self._upstreams,
                self._clients,
                self._model,
                self._counts,
                self._rejected_usage,
            )
        except asyncio.CancelledError:
            if seq.result is None:
                if seq.timed_out is None:
                    end(seq, "finished" if seq.stopped else "aborted", None)
                else:
                    message = f"the {seq.timed_out} ran out"
                    error: EngineError = EngineTimeout(message)
                    if not seq.accept.done():  # no content yet: a status
                        error = UpstreamTimedOut(message, code=error.code)
                    end(seq, "failed", error)
            if seq.timed_out is None:
                raise
        except EngineError as error:
            if seq.result is None:
                end(seq, "failed", error)
        finally:
            if seq.timer is not None:
                seq.timer.cancel()
            self._counts[seq.result or "failed"] += 1
            if seq.result == "aborted":
                self._aborted_ids.append(seq.request.request_id)
            if (i := seq.no_logprobs) is not None:  # later requests: a 400
                self._learn_no_logprobs(i)
            del self._sequences[seq.request.request_id]
