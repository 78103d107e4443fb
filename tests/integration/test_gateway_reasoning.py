"""An upstream's reasoning through the gateway (S30): ``delta.reasoning_content``
(vLLM, SGLang, llama.cpp's server), ``delta.reasoning`` (newer vLLM) or both,
normalized into chat, Responses and Messages; nothing dropped or moved into
the content. The upstream is a fake that streams as those servers do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from .gateway import FakeUpstream, Reply, api_base, start_gateway
from .servers import ServerProcess, StartServer

pytestmark = pytest.mark.integration

REASONING = ["plan", ": 2+2", "=4"]
CONTENT = ["The answer", " is 4."]
# The field names the reply uses, by the request's seed.
STYLES = {
    1: ("reasoning_content",),
    2: ("reasoning",),
    3: ("reasoning_content", "reasoning"),
}


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    return json.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "fake",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
    )


BODIES: list[dict[str, Any]] = []  # what the upstream was asked, in order


def _reply(body: dict[str, Any]) -> Reply:
    BODIES.append(body)
    if body.get("tools"):
        return _call_reply()
    names = STYLES[body.get("seed", 1)]
    events = [_chunk({"role": "assistant", "content": ""})]
    events += [_chunk(dict.fromkeys(names, text)) for text in REASONING]
    events += [_chunk({"content": text}) for text in CONTENT]
    events.append(_chunk({}, "stop"))
    usage = {
        "prompt_tokens": 5,
        "completion_tokens": 6,
        "total_tokens": 11,
        "completion_tokens_details": {"reasoning_tokens": 3},
    }
    events.append(
        json.dumps(
            {
                "id": "x",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "fake",
                "choices": [],
                "usage": usage,
            }
        )
    )
    events.append("[DONE]")
    return Reply(events=events)


def _call_reply() -> Reply:
    """Reasoning and text between two fragments of one tool call's arguments
    (an upstream that interleaves them), each chunk in a write of its own."""
    start = {"index": 0, "id": "call_up", "type": "function"}
    fragments = [
        {**start, "function": {"name": "get", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"city":'}},
        {"index": 0, "function": {"arguments": ' "Paris"}'}},
    ]
    events = [_chunk({"reasoning_content": "plan"})]
    events += [_chunk({"tool_calls": [fragment]}) for fragment in fragments[:2]]
    events += [_chunk({"reasoning_content": ": look"}), _chunk({"content": "Hm."})]
    events += [_chunk({"tool_calls": [fragments[2]]}), _chunk({}, "tool_calls")]
    # Apart in time, so that no lagging writer merges the deltas.
    return Reply(events=[*events, "[DONE]"], gap_s=0.05)


TOOL = {"name": "get", "parameters": {"type": "object"}}


@pytest.fixture(scope="module")
def gateway(start_server: StartServer) -> Iterator[ServerProcess]:
    with FakeUpstream(_reply) as fake:
        yield start_gateway(start_server, "gateway-reasoning", [fake.url], "fake")


@pytest.fixture(scope="module")
def client(gateway: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=api_base(gateway), api_key="none", max_retries=0
    ) as sdk:
        yield sdk


@pytest.mark.parametrize("seed", sorted(STYLES))
def test_chat_streams_the_upstreams_reasoning_as_reasoning_content(
    client: openai.OpenAI, seed: int
) -> None:
    stream = client.chat.completions.create(
        model="fake",
        messages=[{"role": "user", "content": "2+2?"}],
        seed=seed,
        stream=True,
        stream_options={"include_usage": True},
    )
    order: list[tuple[str, str]] = []
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            assert "reasoning" not in delta or delta["reasoning"] is None
            if delta.get("reasoning_content"):
                order.append(("reasoning", delta["reasoning_content"]))
            if delta.get("content"):
                order.append(("content", delta["content"]))
    # Deltas may be merged on the way (a writer that lags coalesces them); the
    # text of each channel and their order may not change.
    kinds = [kind for kind, _ in order]
    assert "reasoning" not in kinds[kinds.index("content") :]
    assert "".join(t for k, t in order if k == "reasoning") == "".join(REASONING)
    assert "".join(t for k, t in order if k == "content") == "".join(CONTENT)
    assert usage is not None
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 3
    whole = client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "2+2?"}], seed=seed
    )
    message = whole.choices[0].message.model_dump()
    assert message["reasoning_content"] == "".join(REASONING)
    assert message["content"] == "".join(CONTENT)


def test_responses_has_a_reasoning_item_before_the_message(
    client: openai.OpenAI,
) -> None:
    stream = client.responses.create(model="fake", input="2+2?", stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == "".join(REASONING)
    last_reasoning = max(
        i for i, k in enumerate(kinds) if k == "response.reasoning_text.delta"
    )
    assert last_reasoning < kinds.index("response.output_text.delta")
    response = events[-1].response  # type: ignore[union-attr]
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output_text == "".join(CONTENT)
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens == 3


def _thinking_message(base_url: str, content: str) -> anthropic.types.Message:
    """The Messages stream's final message for ``content``, thinking on."""
    with (
        anthropic.Anthropic(base_url=base_url, api_key="none", max_retries=0) as claude,
        claude.messages.stream(
            model="fake",
            max_tokens=2048,
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=[{"role": "user", "content": content}],
        ) as stream,
    ):
        return stream.get_final_message()


@pytest.mark.parametrize("seed", [2])
def test_messages_has_a_thinking_block_before_the_text(
    gateway: ServerProcess, seed: int
) -> None:
    thinking, text = _thinking_message(gateway.base_url, "2+2?").content
    assert thinking.type == "thinking"
    assert thinking.thinking == "".join(REASONING)
    assert thinking.signature
    assert text.type == "text"
    assert text.text == "".join(CONTENT)


def test_a_budget_is_asked_of_the_upstream_and_its_reasoning_cut_there(
    client: openai.OpenAI,
) -> None:
    # The fake ignores the budget, as an upstream without one does: it reasons
    # three tokens (one per chunk); the gateway sends the first two.
    request: dict[str, Any] = {
        "model": "fake",
        "messages": [{"role": "user", "content": "2+2?"}],
        "extra_body": {"thinking_token_budget": 2},
    }
    cut = ("".join(REASONING[:2]), "".join(CONTENT))
    BODIES.clear()
    whole = client.chat.completions.create(**request)
    stream = client.chat.completions.create(**request, stream=True)
    deltas = [c.choices[0].delta.model_dump() for c in stream if c.choices]
    for body in BODIES:
        assert body["thinking_token_budget"] == 2  # vLLM's name
        assert body["thinking_budget_tokens"] == 2  # llama.cpp's server's
    assert len(BODIES) == 2
    message = whole.choices[0].message.model_dump()
    assert (message["reasoning_content"], message["content"]) == cut
    # What the upstream reasoned is counted, the cut part included.
    assert whole.usage is not None
    details = whole.usage.completion_tokens_details
    assert details is not None
    assert details.reasoning_tokens == 3
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == cut


def _plain_reply(body: dict[str, Any]) -> Reply:
    """An upstream without a reasoning parser: its markers are in the content,
    split across chunks; asked "split?", one with a parser (``_reply``)."""
    if "split?" in json.dumps(body["messages"][-1]):
        return _reply(body)
    pieces = ["<th", "ink>pl", "an</thi", "nk>The answer"]
    events = [_chunk({"content": piece}) for piece in pieces]
    return Reply(events=[*events, _chunk({}, "stop"), "[DONE]"])


def test_a_named_parser_splits_an_upstreams_plain_markers(
    start_server: StartServer,
) -> None:
    with FakeUpstream(_plain_reply) as fake:
        gateway = start_gateway(
            start_server,
            "gateway-reasoning-plain",
            [fake.url],
            "fake",
            "--reasoning-parser",
            "qwen3",
        )
        with openai.OpenAI(base_url=api_base(gateway), api_key="none") as client:
            whole = client.chat.completions.create(
                model="fake", messages=[{"role": "user", "content": "2+2?"}]
            )
            # With a budget of one token, the reasoning split here is cut after
            # the first chunk that carried some.
            cut = client.chat.completions.create(
                model="fake",
                messages=[{"role": "user", "content": "2+2?"}],
                extra_body={"thinking_token_budget": 1},
            )
            # Thinking on: the output begins inside the reasoning, and an
            # upstream that split its reasoning itself ends it.
            thinking = {"chat_template_kwargs": {"enable_thinking": True}}
            split = client.chat.completions.create(
                model="fake",
                messages=[{"role": "user", "content": "split?"}],
                extra_body=thinking,
            )
        final = _thinking_message(gateway.base_url, "split?")
    blocks = [block.model_dump() for block in final.content]
    assert [(b["type"], b.get("thinking") or b.get("text")) for b in blocks] == [
        ("thinking", "".join(REASONING)),
        ("text", "".join(CONTENT)),
    ]
    message = split.choices[0].message.model_dump()
    assert (message["reasoning_content"], message["content"]) == (
        "".join(REASONING),
        "".join(CONTENT),
    )
    assert split.usage is not None
    assert split.usage.completion_tokens_details is not None
    assert split.usage.completion_tokens_details.reasoning_tokens == 3  # its own
    message = whole.choices[0].message.model_dump()
    assert (message["reasoning_content"], message["content"]) == ("plan", "The answer")
    message = cut.choices[0].message.model_dump()
    assert (message["reasoning_content"], message["content"]) == ("pl", "The answer")
    assert whole.usage is not None
    assert whole.usage.completion_tokens_details is not None
    assert whole.usage.completion_tokens_details.reasoning_tokens == 4


def test_reasoning_inside_a_call_never_cuts_the_call_in_two(
    client: openai.OpenAI, gateway: ServerProcess
) -> None:
    stream = client.responses.create(
        model="fake",
        input="weather?",
        tools=[{"type": "function", "strict": False, **TOOL}],  # type: ignore[list-item]
        stream=True,
    )
    events: list[Any] = list(stream)
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [item.type for item in added] == [
        "reasoning",
        "function_call",
        "reasoning",
        "message",
    ]
    output: list[Any] = events[-1].response.output
    calls = [item for item in output if item.type == "function_call"]
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [
        ("call_up", "get", '{"city": "Paris"}')
    ]
    thought = [c.text for i in output if i.type == "reasoning" for c in i.content or ()]
    assert "".join(thought) == "plan: look"
    assert events[-1].response.output_text == "Hm."
    with (
        anthropic.Anthropic(
            base_url=gateway.base_url, api_key="none", max_retries=0
        ) as claude,
        claude.messages.stream(
            model="fake",
            max_tokens=64,
            tools=[{"name": "get", "input_schema": {"type": "object"}}],
            messages=[{"role": "user", "content": "weather?"}],
        ) as messages,
    ):
        final = messages.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert [(u.id, u.name, u.input) for u in uses] == [
        ("call_up", "get", {"city": "Paris"})
    ]
