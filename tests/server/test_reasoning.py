"""Reasoning through the chat endpoint, read by the official ``openai`` SDK: a
scripted engine whose markers are split across tokens every way (S28)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette

from sluicegate.engines.scripted.engine import ScriptedEngine, ScriptedTokenizer
from sluicegate.engines.scripted.text import ScriptedTextEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.ledger.ledger import Ledger
from sluicegate.server.prepare.templates import ChatTemplate
from sluicegate.server.prepare.tokens import plan_chat
from sluicegate.server.schemas.messages import ChatMessage
from sluicegate.server.schemas.parse import parse_chat_request
from tests.reasoning_splits import S28, S28_WIDE, marker_splits

pytestmark = pytest.mark.anyio

MESSAGES: list[Any] = [{"role": "user", "content": "2+2?"}]
END_OF_TURN = ScriptedTokenizer.end_of_turn_id


def scripted_app(
    tokens: Sequence[bytes],
    *,
    reasoning_parser: str = "qwen3",
    chat_template: str | None = None,
) -> Starlette:
    """An app whose engine says ``tokens`` (one id each), then ends its turn."""
    tokenizer = ScriptedTokenizer(chat_template, extra_pieces=tokens)
    first = len(tokenizer.pieces) - len(tokens)
    ids = [*range(first, first + len(tokens)), END_OF_TURN]
    engine = ScriptedEngine(ids, tokenizer=tokenizer, tokens_per_s=5000)
    return create_app(engine, ServerConfig(reasoning_parser=reasoning_parser))


@asynccontextmanager
async def openai_client(app: Starlette) -> AsyncIterator[openai.AsyncOpenAI]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport) as http:
        # The SDK is typed against its own httpx fork; an httpx client (which
        # can reach an ASGI app in process) speaks the same interface.
        yield openai.AsyncOpenAI(
            base_url="http://t/v1",
            api_key="none",
            http_client=http,  # type: ignore[arg-type]
            max_retries=0,
        )


async def streamed(client: openai.AsyncOpenAI, **extra: Any) -> dict[str, Any]:
    """The stream's reasoning and content deltas in order, its finish reason and
    usage, as the SDK parsed them."""
    stream = await client.chat.completions.create(
        model="scripted",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        **extra,
    )
    order: list[tuple[str, str]] = []
    finish = usage = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            if delta.get("reasoning_content"):
                order.append(("reasoning", delta["reasoning_content"]))
            if delta.get("content"):
                order.append(("content", delta["content"]))
            finish = choice.finish_reason or finish
    assert usage is not None
    return {"order": order, "finish": finish, "usage": usage}


def _joined(order: list[tuple[str, str]], channel: str) -> str:
    return "".join(text for kind, text in order if kind == channel)


def _reasoning_tokens(text: str, tokens: Sequence[bytes]) -> int:
    """Tokens up to and including the one that completes the end marker."""
    spent = len(text[: text.index("</think>") + len("</think>")].encode())
    total = 0
    for i, token in enumerate(tokens):
        total += len(token)
        if total >= spent:
            return i + 1
    raise AssertionError("no end marker")


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        (S28, "plan: 2+2=4", "The answer is 4."),
        (S28_WIDE, "plan: 2+2≈4€", "€The answer is 4 ≈."),
    ],
)
async def test_markers_split_every_way_stream_reasoning_then_content(
    text: str, reasoning: str, content: str
) -> None:
    for tokens in marker_splits(text):
        async with openai_client(scripted_app(tokens)) as client:
            got = await streamed(client)
            whole = await client.chat.completions.create(
                model="scripted", messages=MESSAGES
            )
        order = got["order"]
        assert _joined(order, "reasoning") == reasoning, tokens
        assert _joined(order, "content") == content, tokens
        kinds = [kind for kind, _ in order]
        assert "reasoning" not in kinds[kinds.index("content") :], tokens
        assert got["finish"] == "stop"
        usage = got["usage"]
        assert usage.completion_tokens == len(tokens)
        details = usage.completion_tokens_details
        assert details is not None
        assert details.reasoning_tokens == _reasoning_tokens(text, tokens), tokens
        # stream: false says the same.
        message = whole.choices[0].message.model_dump()
        assert message["reasoning_content"] == reasoning
        assert message["content"] == content
        assert whole.usage is not None
        assert whole.usage.model_dump() == usage.model_dump()


async def test_a_cut_inside_the_reasoning_is_length_with_the_reasoning_delivered() -> (
    None
):
    tokens = [b"<th", b"ink>", b"plan", b": 2+2", b"=4</th", b"ink>", b"The"]
    app = scripted_app(tokens)
    async with openai_client(app) as client:
        got = await streamed(client, max_tokens=5)
        whole = await client.chat.completions.create(
            model="scripted", messages=MESSAGES, max_tokens=5
        )
    assert got["order"] == [
        ("reasoning", "plan"),
        ("reasoning", ": 2+2"),
        ("reasoning", "=4"),
        ("reasoning", "</th"),  # held as a possible end marker, then flushed
    ]
    assert got["finish"] == "length"
    assert got["usage"].completion_tokens_details.reasoning_tokens == 5
    message = whole.choices[0].message.model_dump()
    assert (message["reasoning_content"], message["content"]) == ("plan: 2+2=4</th", "")
    assert whole.choices[0].finish_reason == "length"
    # The ledger's rows count the reasoning tokens too.
    ledger: Ledger = app.state.ledger
    assert [(row.completion_tokens, row.reasoning_tokens) for row in ledger.rows] == [
        (5, 5),
        (5, 5),
    ]


async def test_stop_strings_are_matched_in_the_content_only() -> None:
    tokens = [b"<think>", b"Answer:", b" 4", b"</think>", b"4.", b" Answer:", b" 4"]
    async with openai_client(scripted_app(tokens)) as client:
        got = await streamed(client, stop=["Answer:"])
    assert _joined(got["order"], "reasoning") == "Answer: 4"
    assert _joined(got["order"], "content") == "4. "
    assert got["finish"] == "stop"


@pytest.mark.parametrize(
    ("extra", "reasoning", "content"),
    [
        ({}, "", "plan</think>The answer"),
        ({"reasoning_effort": "low"}, "plan", "The answer"),
        (
            {"extra_body": {"chat_template_kwargs": {"enable_thinking": True}}},
            "plan",
            "The answer",
        ),
        (
            {
                "reasoning_effort": "high",
                "extra_body": {"chat_template_kwargs": {"enable_thinking": False}},
            },
            "",
            "plan</think>The answer",
        ),
    ],
)
async def test_request_options_open_the_reasoning(
    extra: dict[str, Any], reasoning: str, content: str
) -> None:
    # Qwen3's parser: reasoning only when the output opens it, or the request
    # says the output begins inside it.
    tokens = [b"plan", b"</think>", b"The answer"]
    async with openai_client(scripted_app(tokens)) as client:
        got = await streamed(client, **extra)
    assert _joined(got["order"], "reasoning") == reasoning
    assert _joined(got["order"], "content") == content


THINKING_TEMPLATE = (
    "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
    "<end_of_turn>\n{% endfor %}<start_of_turn>model\n"
    "{% if enable_thinking %}<think>\n{% else %}<think></think>{% endif %}"
)


@pytest.mark.parametrize(("thinking", "reasoning"), [(True, "plan"), (False, "")])
async def test_a_template_that_opens_the_reasoning_decides(
    thinking: bool, reasoning: str
) -> None:
    # deepseek_r1 is detected from a template naming both markers as qwen3;
    # the rendered prompt's tail decides where the output begins.
    tokens = [b"plan", b"</think>", b"The answer"]
    app = scripted_app(tokens, reasoning_parser="auto", chat_template=THINKING_TEMPLATE)
    async with openai_client(app) as client:
        got = await streamed(
            client, extra_body={"chat_template_kwargs": {"enable_thinking": thinking}}
        )
    assert _joined(got["order"], "reasoning") == reasoning
    assert got["usage"].completion_tokens_details.reasoning_tokens == (
        2 if thinking else 0
    )


async def test_without_a_parser_markers_are_content_and_usage_has_no_details() -> None:
    app = scripted_app([b"<think>", b"x</think>y"], reasoning_parser="none")
    async with openai_client(app) as client:
        got = await streamed(client)
    assert got["order"] == [("content", "<think>"), ("content", "x</think>y")]
    assert got["usage"].completion_tokens_details is None


async def test_logprobs_are_given_for_the_content_tokens_only() -> None:
    tokens = [b"<think>", b"plan", b"</think>", b"The", b" answer"]
    async with openai_client(scripted_app(tokens)) as client:
        stream = await client.chat.completions.create(
            model="scripted", messages=MESSAGES, stream=True, logprobs=True
        )
        pieces: list[str] = []
        async for chunk in stream:
            for choice in chunk.choices:
                delta = choice.delta.model_dump()
                if delta.get("reasoning_content"):
                    assert choice.logprobs is None
                if choice.logprobs is not None and choice.logprobs.content:
                    pieces += [entry.token for entry in choice.logprobs.content]
        whole = await client.chat.completions.create(
            model="scripted", messages=MESSAGES, logprobs=True
        )
    assert pieces == ["The", " answer"]
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None
    assert [entry.token for entry in logprobs.content or ()] == pieces
    assert whole.choices[0].message.model_dump()["reasoning_content"] == "plan"


@pytest.mark.parametrize(
    "kwargs",
    [{"x-y": True}, {"a": "x" * 1001}, {f"k{i}": 1 for i in range(17)}, {"a": [1]}],
)
async def test_template_kwargs_are_bounded(kwargs: dict[str, Any]) -> None:
    async with openai_client(scripted_app([b"x"])) as client:
        with pytest.raises(openai.BadRequestError) as raised:
            await client.chat.completions.create(
                model="scripted",
                messages=MESSAGES,
                extra_body={"chat_template_kwargs": kwargs},
            )
    assert str(raised.value.body["param"]).startswith("chat_template_kwargs")  # type: ignore[index]


async def test_a_resumable_streams_replay_carries_the_reasoning() -> None:
    tokens = [b"<th", b"ink>plan", b"</think>", b"The answer"]
    app = scripted_app(tokens)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        body = {
            "messages": MESSAGES,
            "stream": True,
            "stream_options": {"include_usage": True, "resumable": True},
        }
        live = await http.post("/v1/chat/completions", json=body)
        first = json.loads(live.text.split("data: ", 2)[1].split("\n")[0])
        replay = await http.get(f"/v1/chat/completions/{first['id']}/events")

    def channels(text: str) -> tuple[str, str, int]:
        reasoning = content = ""
        tokens_spent = -1
        for line in text.splitlines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            for choice in chunk["choices"]:
                reasoning += choice["delta"].get("reasoning_content", "")
                content += choice["delta"].get("content") or ""
            if chunk.get("usage"):
                details = chunk["usage"]["completion_tokens_details"]
                tokens_spent = details["reasoning_tokens"]
        return reasoning, content, tokens_spent

    assert channels(live.text) == ("plan", "The answer", 3)
    assert channels(replay.text) == channels(live.text)


@pytest.mark.parametrize(("parser", "reasoning"), [("qwen3", "plan"), ("auto", "")])
async def test_a_text_engines_plain_markers_are_split_when_a_family_is_named(
    parser: str, reasoning: str
) -> None:
    # An upstream without a parser of its own writes its markers into content.
    engine = ScriptedTextEngine("<think>plan</think>The answer", tokens_per_s=5000)
    app = create_app(engine, ServerConfig(reasoning_parser=parser))
    async with openai_client(app) as client:
        got = await streamed(client)
    assert _joined(got["order"], "reasoning") == reasoning
    content = "The answer" if reasoning else "<think>plan</think>The answer"
    assert _joined(got["order"], "content") == content


def test_earlier_reasoning_reaches_the_template_as_text_only() -> None:
    source = (
        "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
        "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>"
        "{% endif %}{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    )
    tokenizer = ScriptedTokenizer()
    template = ChatTemplate(tokenizer, source)
    messages = [
        ChatMessage(role="user", content="1+1?"),
        ChatMessage(
            role="assistant", content="2", reasoning_content="one <end_of_turn> one"
        ),
    ]
    prompt = template.prompt(messages)
    text = "".join(prompt.parts)
    assert "<think>one <end_of_turn> one</think>2" in text
    # The control token typed into the reasoning is text, not a turn's end.
    ids = prompt.encode()
    assert ids.count(ScriptedTokenizer.end_of_turn_id) == 2


@pytest.mark.parametrize(("thinking", "inside"), [(True, True), (False, False)])
async def test_a_response_formats_grammar_applies_after_the_reasoning(
    thinking: bool, inside: bool
) -> None:
    engine = ScriptedEngine(tokenizer=ScriptedTokenizer(THINKING_TEMPLATE))
    template = ChatTemplate(engine.tokenizer, reasoning="auto")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = parse_chat_request(
        {
            "messages": MESSAGES,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": schema},
            },
            "chat_template_kwargs": {"enable_thinking": thinking},
        }
    )
    plan = await plan_chat(request, "chatcmpl-1", engine, template, ServerConfig())
    assert plan.reasoning is not None
    assert plan.reasoning.starts_inside is inside
    grammar = plan.choices[0].params.grammar
    assert grammar is not None
    start = grammar.text.splitlines()[1]
    if inside:  # the prompt opened the reasoning: the answer after its end
        assert start == "start: reasoning_block REASONING_GAP? reasoned_answer"
    else:  # the model may open it, or answer at once
        assert start.startswith("start: reasoned_answer | ")
