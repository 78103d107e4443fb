"""SequenceOutputs: push order, endings, listeners (no re-entry), close and abort."""

from __future__ import annotations

import asyncio
import logging

import anyio
import pytest

from sluicegate.core.errors import EngineError
from sluicegate.core.events import EngineOutput, FinishReason
from sluicegate.engines.base import OutputItem
from sluicegate.engines.outputs import SequenceOutputs


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _out(token: int, reason: FinishReason | None = None) -> EngineOutput:
    return EngineOutput((token,), reason)


class _Aborts:
    """An ``on_close`` callback that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


async def _collect(outputs: SequenceOutputs[EngineOutput]) -> list[EngineOutput]:
    with anyio.fail_after(2):
        return [output async for output in outputs]


# --- iteration ---------------------------------------------------------------


@pytest.mark.anyio
async def test_iteration_yields_pushes_in_order_and_stops_after_the_finish() -> None:
    aborts = _Aborts()
    outputs = SequenceOutputs(aborts)
    outputs.push(_out(1))
    outputs.push(_out(2))
    done_before_finish = outputs.done
    outputs.push(_out(3, FinishReason.STOP))
    assert (done_before_finish, outputs.done) == (False, True)
    outputs.push(_out(4))  # after the finish: dropped
    outputs.fail(EngineError("late"))
    assert await _collect(outputs) == [_out(1), _out(2), _out(3, FinishReason.STOP)]
    await outputs.aclose()
    assert aborts.calls == 0


@pytest.mark.anyio
async def test_iteration_waits_for_each_push_from_the_engine() -> None:
    outputs = SequenceOutputs(_Aborts())
    loop = asyncio.get_running_loop()
    for delay_s, token in [(0.01, 1), (0.02, 2)]:
        loop.call_later(delay_s, outputs.push, _out(token))
    loop.call_later(0.03, outputs.push, _out(3, FinishReason.LENGTH))
    assert await _collect(outputs) == [_out(1), _out(2), _out(3, FinishReason.LENGTH)]


@pytest.mark.anyio
async def test_end_stops_iteration_without_a_finish_reason() -> None:
    outputs = SequenceOutputs(_Aborts())
    asyncio.get_running_loop().call_soon(outputs.end)
    outputs.push(_out(1))
    assert await _collect(outputs) == [_out(1)]
    assert outputs.done
    outputs.push(_out(2))
    assert await _collect(outputs) == []


@pytest.mark.anyio
async def test_fail_raises_that_error_after_the_earlier_outputs() -> None:
    outputs = SequenceOutputs(_Aborts())
    error = EngineError("the model went away")
    outputs.push(_out(1))
    outputs.fail(error)
    outputs.push(_out(2))
    assert outputs.done
    assert await anext(outputs) == _out(1)
    with pytest.raises(EngineError) as caught:
        await anext(outputs)
    assert caught.value is error
    with pytest.raises(StopAsyncIteration):
        await anext(outputs)


@pytest.mark.anyio
async def test_first_waits_for_the_first_output_and_leaves_it_queued() -> None:
    outputs = SequenceOutputs(_Aborts())
    cached = EngineOutput((1,), None, None, 12)
    asyncio.get_running_loop().call_soon(outputs.push, cached)
    with anyio.fail_after(2):
        assert await outputs.first() == cached
        assert await outputs.first() == cached  # still there
    outputs.push(_out(2, FinishReason.STOP))
    assert await _collect(outputs) == [cached, _out(2, FinishReason.STOP)]


@pytest.mark.anyio
async def test_first_of_a_sequence_that_failed_or_ended_is_none() -> None:
    failed, ended = SequenceOutputs(_Aborts()), SequenceOutputs(_Aborts())
    loop = asyncio.get_running_loop()
    loop.call_soon(failed.fail, EngineError("gone"))
    loop.call_soon(ended.end)
    with anyio.fail_after(2):
        assert await failed.first() is None
        assert await ended.first() is None


# --- listen ------------------------------------------------------------------


def test_listen_replays_queued_items_then_hands_each_one_over_at_once() -> None:
    outputs = SequenceOutputs(_Aborts())
    seen: list[OutputItem] = []
    outputs.push(_out(1))
    outputs.push(_out(2))
    outputs.listen(seen.append)
    assert seen == [_out(1), _out(2)]
    outputs.push(_out(3))
    assert seen == [_out(1), _out(2), _out(3)]  # synchronously, from push
    outputs.end()
    outputs.push(_out(4))
    assert seen == [_out(1), _out(2), _out(3), None]


def test_listen_hands_over_a_failure_as_the_error_itself() -> None:
    outputs = SequenceOutputs(_Aborts())
    seen: list[OutputItem] = []
    outputs.listen(seen.append)
    error = EngineError("boom")
    outputs.fail(error)
    outputs.end()
    assert seen == [error]


@pytest.mark.parametrize("queued", [False, True])
def test_a_listener_that_pushes_into_its_own_sequence_is_never_re_entered(
    queued: bool,
) -> None:
    # The listener aborts its own sequence on the first item: the engine pushes
    # the step in flight and ends the sequence from inside that call.
    outputs = SequenceOutputs(_Aborts())
    log: list[tuple[str, OutputItem]] = []

    def listener(item: OutputItem) -> None:
        log.append(("enter", item))
        if item == _out(1):
            outputs.push(_out(2))
            outputs.end()
        log.append(("exit", item))

    if queued:
        outputs.push(_out(1))
        outputs.listen(listener)
    else:
        outputs.listen(listener)
        outputs.push(_out(1))
    assert log == [
        ("enter", _out(1)),
        ("exit", _out(1)),
        ("enter", _out(2)),
        ("exit", _out(2)),
        ("enter", None),
        ("exit", None),
    ]


def test_a_raising_listener_is_logged_aborts_once_and_gets_nothing_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    aborts = _Aborts()
    outputs = SequenceOutputs(aborts)
    seen: list[OutputItem] = []

    def listener(item: OutputItem) -> None:
        seen.append(item)
        raise RuntimeError("a bug in the consumer")

    outputs.listen(listener)
    outputs.push(_out(1))  # never raises into the engine
    assert seen == [_out(1)]
    assert aborts.calls == 1
    [record] = [r for r in caplog.records if r.name == "sluicegate.engines.outputs"]
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
    assert "a bug in the consumer" in str(record.exc_info[1])
    outputs.push(_out(2))
    outputs.end()
    assert seen == [_out(1)]
    assert aborts.calls == 1


def test_a_listener_raising_on_the_last_item_has_nothing_to_abort(
    caplog: pytest.LogCaptureFixture,
) -> None:
    aborts = _Aborts()
    outputs = SequenceOutputs(aborts)

    def listener(item: OutputItem) -> None:
        raise RuntimeError("a bug in the consumer")

    outputs.push(_out(1, FinishReason.STOP))
    outputs.listen(listener)
    assert "listener failed" in caplog.text
    assert aborts.calls == 0


def test_items_held_when_a_base_exception_escapes_a_listener_keep_their_order() -> None:
    # KeyboardInterrupt is not a consumer's bug: it goes through push. What the
    # listener pushed before it escaped is handed over first on the next push.
    outputs = SequenceOutputs(_Aborts())
    seen: list[OutputItem] = []

    def listener(item: OutputItem) -> None:
        seen.append(item)
        if item == _out(1):
            outputs.push(_out(2))
            raise KeyboardInterrupt

    outputs.listen(listener)
    with pytest.raises(KeyboardInterrupt):
        outputs.push(_out(1))
    assert seen == [_out(1)]
    outputs.push(_out(3))
    assert seen == [_out(1), _out(2), _out(3)]


def test_listen_twice_or_after_close_is_refused() -> None:
    outputs = SequenceOutputs(_Aborts())
    outputs.listen(lambda item: None)
    with pytest.raises(RuntimeError, match="nobody listens"):
        outputs.listen(lambda item: None)
    closed = SequenceOutputs(_Aborts())
    closed.close()
    with pytest.raises(RuntimeError, match="open channel"):
        closed.listen(lambda item: None)


# --- close -------------------------------------------------------------------


@pytest.mark.anyio
async def test_close_before_the_end_aborts_once_and_drops_later_items() -> None:
    aborts = _Aborts()
    outputs = SequenceOutputs(aborts)
    seen: list[OutputItem] = []
    outputs.push(_out(1))
    outputs.listen(seen.append)
    outputs.close()
    outputs.close()
    await outputs.aclose()
    assert aborts.calls == 1
    outputs.push(_out(2))
    outputs.end()
    assert seen == [_out(1)]
    assert await _collect(outputs) == []


@pytest.mark.anyio
async def test_close_stops_a_consumer_waiting_for_the_next_item() -> None:
    aborts = _Aborts()
    outputs = SequenceOutputs(aborts)

    async def read() -> list[EngineOutput]:
        return await _collect(outputs)

    reader = asyncio.get_running_loop().create_task(read())
    await asyncio.sleep(0)  # the reader now waits in __anext__
    outputs.close()
    with anyio.fail_after(1):
        assert await reader == []
    assert aborts.calls == 1


@pytest.mark.anyio
async def test_aclose_drops_queued_items_and_aborts() -> None:
    aborts = _Aborts()
    outputs = SequenceOutputs(aborts)
    outputs.push(_out(1))
    await outputs.aclose()
    assert aborts.calls == 1
    assert await _collect(outputs) == []


@pytest.mark.anyio
@pytest.mark.parametrize("ending", ["finish", "fail", "end"])
async def test_close_after_the_sequence_ended_never_aborts(ending: str) -> None:
    aborts = _Aborts()
    outputs = SequenceOutputs(aborts)
    if ending == "finish":
        outputs.push(_out(1, FinishReason.STOP))
    elif ending == "fail":
        outputs.fail(EngineError("boom"))
    else:
        outputs.end()
    outputs.close()
    await outputs.aclose()
    assert aborts.calls == 0
