"""One upstream sequence served with failover: lease an upstream, POST, read.

``serve`` leases an upstream from the pool (``pool.py``), POSTs the request
(``config.py`` builds its body) over that upstream's ``HopClient``
(``http.py``), and reads a 200's stream into the sequence (``stream.py``). A
refusal that another upstream might not give (a connect error, 429, 5xx, or a
200 that ends before any content) is tried on the next eligible upstream
(``refusals.py`` says which); once every upstream has been tried, the last
refusal is the sequence's. The engine (``engine.py``) runs one ``serve`` task
per sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from sluicegate.core.errors import EngineError, UpstreamsBusy
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.engines.base import ModelInfo
from sluicegate.engines.upstream.config import UpstreamConfig, request_body
from sluicegate.engines.upstream.http import HopClient, HopError, HopResponse
from sluicegate.engines.upstream.pool import (
    Lease,
    Outcome,
    PoolRefusal,
    RefusalReason,
    UpstreamPool,
)
from sluicegate.engines.upstream.refusals import (
    REFUSAL_BODY_MAX_BYTES,
    hop_failure,
    refusal_of,
)
from sluicegate.engines.upstream.sequence import UpstreamSequence
from sluicegate.engines.upstream.stream import BeforeContent, read_stream

__all__ = ["serve"]


async def serve(
    seq: UpstreamSequence,
    pool: UpstreamPool,
    upstreams: Sequence[UpstreamConfig],
    clients: Sequence[HopClient],
    model: ModelInfo,
    counts: dict[str, int],
    rejected_usage: list[int],
) -> None:
    """Serve ``seq`` from ``pool``: lease an upstream, POST the request, read
    its stream into ``seq``; on a refusal another upstream might not give, the
    next one. ``counts`` (tokens, by the engine's counter names) and
    ``rejected_usage`` (per upstream) are the engine's, updated here.

    Raises:
        EngineError: the sequence's failure; a refusal (``EngineRefused``) while
            no content was sent.
    """
    tried: list[int] = []
    refusal: EngineError | None = None
    while True:
        lease = await _lease(pool, tried, refusal)
        upstream = upstreams[lease.member]
        client = clients[lease.member]
        outcome = Outcome.FAILURE
        response: HopResponse | None = None
        try:
            seq.lease = lease
            try:
                body = request_body(
                    seq.request,
                    upstream.model or model.id,
                    continuous_usage=upstream.continuous_usage,
                )
            except TypeError as exc:  # orjson: a value that is not JSON
                outcome = Outcome.SUCCESS  # not the upstream's fault
                raise EngineError(f"the request cannot be sent: {exc}") from exc
            path = _PATHS[seq.request.text_prompt.endpoint]  # type: ignore[union-attr]
            try:
                response = await client.post(path, body)
            except HopError as exc:
                refusal, outcome = hop_failure(exc, upstream)
                tried.append(lease.member)
                continue
            if response.status != 200:
                refused, outcome, again = refusal_of(
                    response.status,
                    await _read_some(response),
                    response.header("retry-after"),
                    upstream,
                )
                if not again:
                    raise refused
                refusal = refused
                tried.append(lease.member)
                continue
            outcome = Outcome.SUCCESS  # a client that leaves is no failure
            if not seq.responded.done():
                seq.responded.set_result(None)
            try:
                outcome = await read_stream(
                    seq,
                    response,
                    lease,
                    upstreams,
                    counts,
                    model.context_length,
                )
            except BeforeContent as failed:  # a 200, then nothing: a refusal
                refused, outcome, again = failed.refusal
                if not again:
                    raise refused from None
                refusal = refused
                seq.usage = None  # the next upstream counts anew
                tried.append(lease.member)
                continue
            return
        finally:
            if seq.timed_out is not None:
                outcome = Outcome.FAILURE
            if seq.usage_rejected:
                seq.usage_rejected = False
                rejected_usage[lease.member] += 1
            if response is not None:
                await response.aclose()
            seq.lease = None
            lease.release(outcome)


async def _lease(
    pool: UpstreamPool, tried: list[int], refusal: EngineError | None
) -> Lease:
    """An upstream of ``pool`` not in ``tried``, when one is free; the last
    ``refusal`` once every upstream has been tried."""
    future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()

    def refuse(why: PoolRefusal) -> None:
        if refusal is not None and why.reason is RefusalReason.NONE_ELIGIBLE:
            future.set_exception(refusal)  # every upstream tried: the last no
            return
        message = {
            RefusalReason.NONE_ELIGIBLE: "no upstream of the model is healthy",
            RefusalReason.QUEUE_FULL: "every upstream is busy and the queue full",
            RefusalReason.QUEUE_TIMEOUT: "no upstream was free in time",
        }[why.reason]
        future.set_exception(UpstreamsBusy(message, retry_after_s=why.retry_after_s))

    ticket = pool.request(future.set_result, refuse, tried)
    try:
        return await future
    except asyncio.CancelledError:
        ticket.cancel()
        if future.done() and not future.cancelled() and not future.exception():
            future.result().release(Outcome.SUCCESS)
        raise


_PATHS = {Endpoint.CHAT: "chat/completions", Endpoint.COMPLETION: "completions"}


async def _read_some(response: HopResponse) -> bytes:
    """Up to ``REFUSAL_BODY_MAX_BYTES`` of a refusal's body (a broken one: ``b""``)."""
    parts: list[bytes] = []
    size = 0
    with contextlib.suppress(HopError):
        async for data in response:
            parts.append(data)
            size += len(data)
            if size >= REFUSAL_BODY_MAX_BYTES:
                break
    return b"".join(parts)[:REFUSAL_BODY_MAX_BYTES]
