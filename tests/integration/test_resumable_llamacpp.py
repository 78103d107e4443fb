"""Resumable streams with the real default model, through a constrained tool call.

The session's llama.cpp server is not resumable by default; each request opts in
with ``stream_options.resumable``. A stream cut in
its middle and just before its end, then resumed with ``Last-Event-ID``, gives
the same answer as the uninterrupted stream the openai SDK read. (Text, logprobs
and usage over every cut point are in ``test_resumable.py``, on the scripted
engine.)
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from sluicegate.client.assemble import StreamAssembler

from .test_resumable import answer, event_cuts, resumed
from .test_tool_call_wire import PARIS, WEATHER, named

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

OPTIONS = {"include_usage": True, "resumable": True}


def sdk_answer(sdk: openai.OpenAI, body: dict[str, Any]) -> tuple[str, str, str]:
    """Text, tool-call arguments and finish reason, as the openai SDK reads them."""
    fields = {k: v for k, v in body.items() if k not in ("stream_options", "stream")}
    stream = sdk.chat.completions.create(
        **fields, stream=True, extra_body={"stream_options": OPTIONS}
    )
    text, arguments, finish = [], [], ""
    for chunk in stream:
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            for call in choice.delta.tool_calls or ():
                arguments.append(call.function.arguments or "")
            finish = choice.finish_reason or finish
    return "".join(text), "".join(arguments), finish


@pytest.mark.slow
def test_a_real_tool_call_stream_cut_and_resumed_gives_the_same_answer(
    http: httpx.Client, sdk: openai.OpenAI, model_id: str
) -> None:
    fields = {
        "messages": PARIS,
        "tools": [WEATHER],
        "tool_choice": named("get_weather"),
    }
    body = {
        "model": model_id,
        "temperature": 0,
        "max_tokens": 16,
        "stream": True,
        "stream_options": OPTIONS,
        **fields,
    }
    text, arguments, finish = sdk_answer(sdk, body)
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        raw = response.read()
    whole = StreamAssembler()
    whole.head(200, {}, 0.0)
    whole.feed(raw, 0.0)
    result = whole.flush(0.0)
    choice = result.choices[0]
    assert choice.text == text
    assert "".join(c.arguments for c in choice.tool_calls) == arguments
    assert choice.finish_reason == finish
    cuts = event_cuts(raw)
    for cut in (cuts[len(cuts) // 2 - 1], cuts[-2]):
        assert answer(resumed(http, body, cut)) == answer(result), cut
