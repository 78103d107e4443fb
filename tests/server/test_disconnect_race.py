"""DisconnectRace.stop from the response's own task: never a cancellation left
behind after the ``with``."""

from __future__ import annotations

import asyncio

import pytest

from sluicegate.server.streaming.disconnect import DisconnectRace

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _never_disconnects() -> dict[str, str]:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


async def test_a_stop_from_the_task_itself_with_no_pause_after_it_never_happened() -> (
    None
):
    """The ``with`` ends before the task pauses: the task's next await (the
    body's last chunk, in a response) is not cancelled, and no reason is set."""
    with DisconnectRace(_never_disconnects) as race:
        race.stop("over 10 buffered bytes")
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # would raise CancelledError had the stop leaked
    assert race.reason is None
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


async def test_a_stop_from_the_task_itself_cancels_it_at_its_next_pause() -> None:
    with DisconnectRace(_never_disconnects) as race:
        race.stop("over 10 buffered bytes")
        await asyncio.sleep(1)  # cancelled here, and the with ends normally
        pytest.fail("the task was not cancelled")
    assert race.reason == "over 10 buffered bytes"


async def test_a_stop_from_another_task_cancels_at_once() -> None:
    async def stopper(race: DisconnectRace) -> None:
        race.stop("stuck")
        race.stop("again")  # once only

    with DisconnectRace(_never_disconnects) as race:
        asyncio.get_running_loop().create_task(stopper(race))
        await asyncio.sleep(1)
        pytest.fail("the task was not cancelled")
    assert race.reason == "stuck"
