"""A finished response leaves no reference cycle behind: its objects are freed
by reference counting when it ends, not by a later garbage collection.

Cyclic garbage is what makes a server's full collections frequent and long (a
stop of every stream for tens of milliseconds); every object of a response is
made per request, so one cycle per request is a collection's worth of work per
few thousand requests. Each case runs one request with the collector off and
``DEBUG_SAVEALL`` on, then looks for this package's objects in what a
collection found unreachable.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.streaming.sse_response import BODY_SEND

from ..polling import wait_until
from .asgi import CHAT, COMPLETIONS, HELLO, Exchange, exchange

pytestmark = pytest.mark.anyio

CASES: dict[str, tuple[str, dict[str, Any], bool]] = {
    "chat stream": (CHAT, {"messages": HELLO, "stream": True}, False),
    "chat stream, client left": (CHAT, {"messages": HELLO, "stream": True}, True),
    "chat whole": (CHAT, {"messages": HELLO}, False),
    "completions stream": (COMPLETIONS, {"prompt": "Hi", "stream": True}, False),
    "resumable stream": (
        CHAT,
        {"messages": HELLO, "stream": True, "stream_options": {"resumable": True}},
        False,
    ),
    "resumable stream, grace ran out": (
        CHAT,
        {"messages": HELLO, "stream": True, "stream_options": {"resumable": True}},
        True,
    ),
    "responses stream": ("/v1/responses", {"input": "Hi", "stream": True}, False),
    "messages stream": (
        "/v1/messages",
        {"model": "scripted", "messages": HELLO, "stream": True, "max_tokens": 50},
        False,
    ),
    "a 400": (CHAT, {"messages": HELLO, "max_tokens": -1}, False),
}


async def run(app: Any, path: str, body: dict[str, Any], leave: bool) -> None:
    if not leave:
        await exchange(app, path, body)
        return
    ex = Exchange(app, path, {**body, "max_tokens": 1000})
    task = asyncio.ensure_future(ex.run())
    await ex.wait_for(lambda: b"data: " in ex.body)
    ex.leave()
    await task


@pytest.mark.parametrize("case", list(CASES))
async def test_a_finished_response_leaves_no_reference_cycle(case: str) -> None:
    path, body, leave = CASES[case]
    app = create_app(
        ScriptedEngine(tokens_per_s=2000), ServerConfig(resume_grace_s=0.01)
    )
    ledger = app.state.ledger
    await run(app, path, body, leave)  # first use: caches filled, not garbage
    await wait_until(lambda: len(ledger.rows) == 1, 5)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await run(app, path, body, leave)
        await wait_until(lambda: len(ledger.rows) == 2, 5)  # its producer ended
        await asyncio.sleep(0.01)  # and the task that ran it
        gc.collect()
        ours = sorted({type(o).__qualname__ for o in gc.garbage if _ours(o)})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert ours == []


async def test_the_server_send_leaves_the_scope_with_its_request() -> None:
    # uvicorn's request cycle holds the scope, and the server's send the cycle.
    app = create_app(ScriptedEngine(tokens_per_s=2000), ServerConfig())
    ex = await exchange(app, CHAT, {"messages": HELLO, "stream": True})
    assert ex.status == 200
    assert BODY_SEND not in ex.scope


def _ours(obj: object) -> bool:
    return type(obj).__module__.startswith("sluicegate")
