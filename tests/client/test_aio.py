from __future__ import annotations

from collections.abc import Sequence

import pytest

from sluicegate.client import AsyncClient, TimeoutKind, Timeouts
from sluicegate.core.endstate import EndState
from sluicegate.core.errors import StreamClosed, StreamConsumed
from sluicegate.core.sse import DONE

from .wire import Gap, async_transport, bytewise, chat_frames, error_body, good_body

MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make(parts: Sequence[bytes | Gap], timeouts: Timeouts | None = None) -> AsyncClient:
    return AsyncClient(transport=async_transport(parts), timeouts=timeouts)


@pytest.mark.anyio
async def test_good_stream_fed_byte_by_byte_is_finished() -> None:
    async with make(bytewise(good_body())) as client:
        stream = client.astream_chat(MESSAGES, model="m")
        texts = [d.text async for d in stream]
        result = await stream.aresult()
    assert texts == ["Hel", "lo", " wörld 🤖"]
    assert result.end_state is EndState.FINISHED


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("parts", "state"),
    [
        (chat_frames(["a"]), EndState.TRUNCATED),
        ([error_body()], EndState.ERRORED),
        ([b"data: {]\n\n", DONE], EndState.TRUNCATED),
    ],
    ids=["no-done", "error-frame", "malformed"],
)
async def test_bad_streams_end_in_their_state(
    parts: list[bytes], state: EndState
) -> None:
    async with make(list(parts)) as client:
        assert (await client.achat(MESSAGES, model="m")).end_state is state


@pytest.mark.anyio
async def test_rejected_completion_is_rejected() -> None:
    client = AsyncClient(transport=async_transport([b"{}"], status=429))
    result = await client.acomplete("p", model="m")
    assert result.end_state is EndState.REJECTED
    assert result.status == 429
    await client.aclose()


@pytest.mark.anyio
async def test_idle_gap_times_out() -> None:
    frames = chat_frames(["a"])
    client = make([frames[0], Gap(3.0), *frames[1:], DONE], Timeouts(idle_s=1.0))
    result = await client.achat(MESSAGES, model="m")
    assert result.timeout is TimeoutKind.IDLE
    assert result.end_state is EndState.ABORTED


@pytest.mark.anyio
async def test_closing_mid_stream_aborts() -> None:
    client = make(chat_frames(["a", "b"]))
    async with client.astream_chat(MESSAGES, model="m") as stream:
        async for _ in stream:
            break
    result = await stream.aresult()
    assert result.end_state is EndState.ABORTED
    assert result.text == "a"
    with pytest.raises(StreamClosed):
        stream.__aiter__()


@pytest.mark.anyio
async def test_iterating_twice_is_misuse() -> None:
    stream = make([good_body()]).astream_chat(MESSAGES, model="m")
    stream.__aiter__()
    with pytest.raises(StreamConsumed):
        stream.__aiter__()
    await stream.aclose()
    assert (await stream.aresult()).end_state is EndState.ABORTED
