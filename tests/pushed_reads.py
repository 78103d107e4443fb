"""One scenario for stores that push (``PushRead``): appends, a reader that
takes some pushed batches and refuses others, and what it got either way."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from sluicegate.server.stores.event_store import EventStore, Frames, PushRead


def frame(i: int) -> bytes:
    return f"data: {i}\n\n".encode()


@dataclass
class PushedRead:
    """What one reader of a pushed read got: pushed, and yielded by its iterator."""

    pushed: list[tuple[int, bytes]] = field(default_factory=list)
    yielded: list[tuple[int, bytes]] = field(default_factory=list)
    pushes: int = 0  # calls of push, taken or not

    def check(self, count: int) -> None:
        """Every frame ``0 .. count - 1`` once, each source in sequence order."""
        assert self.pushed == sorted(self.pushed)
        assert self.yielded == sorted(self.yielded)
        assert sorted(self.pushed + self.yielded) == [
            (i, frame(i)) for i in range(count)
        ]


async def pushed_read(
    producer: EventStore,
    reader: PushRead,
    sizes: list[int],
    takes: list[bool],
    settle_s: float | None,
    response_id: str = "r",
) -> tuple[PushedRead, int]:
    """Append ``sizes`` frames per call to a new log of ``producer`` (letting
    the reader wait again after each when ``settle_s`` is given), read by
    ``reader.read_pushed`` whose push answers ``takes`` in turn (then takes
    all); returns what it got and the frame count."""
    await producer.create(response_id, "k")
    got = PushedRead()
    answers = iter(takes)

    def push(batch: Frames) -> bool:
        got.pushes += 1
        take = next(answers, True)
        if take:
            got.pushed += batch
        return take

    batches = reader.read_pushed(response_id, "k", -1, push)
    got.yielded += await anext(batches)

    async def consume() -> None:
        async for batch in batches:
            assert batch, "a later batch is never empty"
            got.yielded += batch

    task = asyncio.get_running_loop().create_task(consume())
    count = 0
    for size in sizes:
        if settle_s is not None:
            await asyncio.sleep(settle_s)
        await producer.append(
            response_id, [frame(i) for i in range(count, count + size)]
        )
        count += size
    await producer.finish(response_id)
    await asyncio.wait_for(task, 10)
    return got, count
