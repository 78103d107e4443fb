"""A reused prompt prefix in the first event's usage: an engine that says its
cached tokens on a sequence's first output (``Capabilities.prefix_cache``, as
the llama.cpp engine under ``--prefix-cache``) has them in a streamed
``message_start`` and a continuous-usage stream's first chunk, as in the end."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx
import pytest

from sluicegate.core.errors import EngineError
from sluicegate.core.events import EngineOutput
from sluicegate.core.wire.sse import SSEDecoder
from sluicegate.engines.base import Capabilities, GenerateRequest, OutputItem
from sluicegate.engines.outputs import SequenceOutputs
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig

pytestmark = pytest.mark.anyio

CACHED = 3
"""The prompt tokens each sequence says it read from the cache."""
ASK: dict[str, Any] = {
    "model": "scripted",
    "max_tokens": 4,
    "messages": [{"role": "user", "content": "Hello there, lighthouse keeper."}],
}


class _Reusing(ScriptedEngine):
    """The scripted engine, saying ``CACHED`` on each sequence's first output
    (and declaring so only when ``declared``)."""

    def __init__(self, *, declared: bool) -> None:
        super().__init__(tokens_per_s=2000)
        self._declared = declared

    @property
    def capabilities(self) -> Capabilities:
        own = super().capabilities
        return dataclasses.replace(own, prefix_cache=self._declared)

    def generate(self, request: GenerateRequest) -> SequenceOutputs[EngineOutput]:
        inner = super().generate(request)
        assert isinstance(inner, SequenceOutputs)  # listenable: declared so
        outer = SequenceOutputs[EngineOutput](inner.close)
        first = [True]

        def forward(item: OutputItem) -> None:
            if isinstance(item, EngineOutput):
                cached = CACHED if first[0] else 0
                first[0] = False
                outer.push(dataclasses.replace(item, cached_tokens=cached))
            elif isinstance(item, EngineError):
                outer.fail(item)
            else:
                outer.end()

        inner.listen(forward)
        return outer


def _events(body: bytes) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    events = decoder.feed(body) + decoder.flush()
    return [json.loads(e.data) for e in events if e.data != "[DONE]"]


async def _post(engine: ScriptedEngine, path: str, body: dict[str, Any]) -> Any:
    app = create_app(engine, ServerConfig(obfuscation=False))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.post(path, json=body)
    assert answer.status_code == 200, answer.text
    return answer


@pytest.mark.parametrize("declared", [True, False])
async def test_message_start_says_the_cached_tokens_of_an_engine_that_declares_them(
    declared: bool,
) -> None:
    """Declared, the first event waits for the first output and says its
    cached tokens; undeclared (no wait), ``message_start`` cannot know them
    and only the end says them: what the wait is for."""
    engine = _Reusing(declared=declared)
    whole = (await _post(engine, "/v1/messages", ASK)).json()["usage"]
    streamed = _events(
        (await _post(engine, "/v1/messages", {**ASK, "stream": True})).content
    )
    start = streamed[0]["message"]["usage"]
    end = next(e for e in streamed if e["type"] == "message_delta")["usage"]
    assert whole["cache_read_input_tokens"] == end["cache_read_input_tokens"] == CACHED
    assert end["input_tokens"] == whole["input_tokens"] >= 1
    said = (start["cache_read_input_tokens"], start["input_tokens"])
    if declared:
        assert said == (CACHED, whole["input_tokens"])
    else:
        assert said == (0, whole["input_tokens"] + CACHED)


async def test_a_continuous_usage_streams_first_chunk_says_the_cached_tokens() -> None:
    body = {
        **ASK,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    chunks = _events(
        (await _post(_Reusing(declared=True), "/v1/chat/completions", body)).content
    )
    cached = [c["usage"].get("prompt_tokens_details") for c in chunks]
    assert cached[0] == {"cached_tokens": CACHED}, chunks[0]
    assert cached[-1] == {"cached_tokens": CACHED}
