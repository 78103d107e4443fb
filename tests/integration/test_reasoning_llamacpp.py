"""Reasoning on the real default model (S27): a chat template that opens the
reasoning when the request asks for thinking, the parser detected from it, the
official openai SDK reading the stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import openai
import pytest

from .servers import N_CTX, StartServer

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

# Gemma 3's turns, then "<think>\n" after the generation prompt when the request
# asks for thinking (as DeepSeek-R1's template always does: the model starts
# inside the reasoning), or an empty block when it does not (as Qwen3's does).
# Gemma does not think: what it writes is reasoning until it writes "</think>".
THINKING_TEMPLATE = """\
{{- bos_token -}}
{%- for message in messages -%}
{%- set speaker = "model" if message["role"] == "assistant" else message["role"] -%}
{{- "<start_of_turn>" ~ speaker ~ "\\n" -}}
{{- message["content"] | trim ~ "<end_of_turn>\\n" -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- "<start_of_turn>model\\n" -}}
{%- if enable_thinking -%}{{- "<think>\\n" -}}
{%- else -%}{{- "<think>\\n\\n</think>\\n\\n" -}}{%- endif -%}
{%- endif -%}
"""
QUESTION = "Count from one to ten in words."


@pytest.fixture(scope="module")
def template_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    template = Path(tmp_path_factory.mktemp("templates")) / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE, encoding="utf-8")
    return template


def _server(
    start: StartServer, name: str, template: Path, parser: str
) -> openai.OpenAI:
    server = start(
        name,
        "--log-level",
        "warning",
        "--engine",
        "llamacpp",
        "--n-ctx",
        str(N_CTX),
        "--parallel",
        "1",
        "--chat-template",
        str(template),
        "--reasoning-parser",
        parser,
    )
    return openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key="none", max_retries=0
    )


@pytest.fixture(scope="module")
def client(start_server: StartServer, template_file: Path) -> Iterator[openai.OpenAI]:
    """The parser detected from the template (``auto``): ``<think>`` markers."""
    with _server(start_server, "llamacpp-thinking", template_file, "auto") as sdk:
        yield sdk


@pytest.fixture(scope="module")
def raw_client(
    start_server: StartServer, template_file: Path
) -> Iterator[openai.OpenAI]:
    """The same model and template with no parser: the model's own text."""
    with _server(start_server, "llamacpp-thinking-raw", template_file, "none") as sdk:
        yield sdk


_RAW: dict[str, Any] = {}


def _raw(raw_client: openai.OpenAI, request: dict[str, Any]) -> Any:
    """The model's own answer to ``request`` (greedy: asked once per module)."""
    key = json.dumps(request, sort_keys=True)
    if key not in _RAW:
        _RAW[key] = raw_client.chat.completions.create(**request)
    return _RAW[key]


def _expected(raw: str, inside: bool) -> tuple[str, str]:
    """What the splitter makes of the model's raw text (docs/DESIGN.md,
    "Reasoning"): a leading start marker opens the reasoning (or, when the
    prompt opened it already, is dropped); the first end marker ends it;
    without either, the output is all reasoning (inside) or all content."""
    if raw.startswith("<think>"):
        raw, inside = raw.removeprefix("<think>"), True
    if not inside:
        return "", raw
    reasoning, marker, content = raw.partition("</think>")
    return reasoning, content if marker else ""


@pytest.mark.parametrize(
    ("thinking", "max_tokens"), [(True, 40), (True, 12), (False, 40)]
)
def test_every_generated_character_is_reasoning_until_the_end_marker(
    client: openai.OpenAI, raw_client: openai.OpenAI, thinking: bool, max_tokens: int
) -> None:
    model = client.models.list().data[0].id
    request: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "extra_body": {"chat_template_kwargs": {"enable_thinking": thinking}},
    }
    # The model's own text for the same prompt, unsplit.
    raw = _raw(raw_client, request)
    reasoning, content = _expected(raw.choices[0].message.content or "", thinking)
    assert raw.usage is not None

    stream = client.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}
    )
    pieces: dict[str, list[str]] = {"reasoning": [], "content": []}
    finishes, usage = [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            if delta.get("reasoning_content"):
                assert not pieces["content"], "reasoning after content"
                pieces["reasoning"].append(delta["reasoning_content"])
            if delta.get("content"):
                pieces["content"].append(delta["content"])
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    streamed = ("".join(pieces["reasoning"]), "".join(pieces["content"]))
    assert streamed == (reasoning, content)
    if thinking:
        assert reasoning  # the model wrote something, and it went to reasoning
    # The first end marker is in neither channel (later ones, which the model
    # may write after imitating an empty block, are text of the answer).
    assert "</think>" not in reasoning
    assert finishes == [raw.choices[0].finish_reason]
    assert usage is not None
    assert usage.completion_tokens == raw.usage.completion_tokens
    details = usage.completion_tokens_details
    assert details is not None
    if not reasoning:
        assert details.reasoning_tokens == 0
    elif not content:  # ended inside the reasoning: every token was reasoning
        assert details.reasoning_tokens == usage.completion_tokens
    else:
        assert 0 < (details.reasoning_tokens or 0) < usage.completion_tokens
    if finishes == ["length"]:
        assert usage.completion_tokens == max_tokens

    whole = client.chat.completions.create(**request)
    message = whole.choices[0].message.model_dump()
    assert (message["reasoning_content"] or "", message["content"] or "") == streamed
    assert whole.choices[0].finish_reason == finishes[0]
    assert whole.usage is not None
    assert whole.usage.model_dump() == usage.model_dump()


@pytest.mark.parametrize("thinking", [True, False])
def test_a_response_format_applies_once_the_reasoning_ended(
    client: openai.OpenAI, thinking: bool
) -> None:
    schema = {
        "type": "object",
        "properties": {"count": {"type": "integer"}},
        "required": ["count"],
        "additionalProperties": False,
    }
    whole = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "How many words are in 'one two'?"}],
        temperature=0,
        max_tokens=24,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "count", "schema": schema, "strict": True},
        },
        extra_body={"chat_template_kwargs": {"enable_thinking": thinking}},
    )
    message = whole.choices[0].message.model_dump()
    if thinking:
        # The prompt opened the reasoning: free text until the end marker, and
        # only then the JSON (Gemma does not write one in 24 tokens).
        assert message["reasoning_content"]
        assert whole.choices[0].finish_reason == "length"
        content = message["content"] or ""
        assert content == "" or json.loads(content)["count"] >= 0
    else:
        # The template closed it: the model may open a block of its own (Gemma
        # imitates the empty one), and the answer is under the schema (cut by
        # max_tokens inside a long number, it is a prefix of such JSON).
        content = message["content"].strip()
        assert content.startswith('{"count": ')
        if whole.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(content)["count"], int)


def test_the_engine_closes_the_reasoning_at_its_budget(
    client: openai.OpenAI, raw_client: openai.OpenAI
) -> None:
    budget = 4
    from sluicegate.engines.llamacpp.vocab import load_vocab
    from sluicegate.model import default_model_path

    end_tokens = load_vocab(default_model_path()).encode(
        "</think>", add_special=False, parse_special=True
    )
    thinking = {"chat_template_kwargs": {"enable_thinking": True}}
    request: dict[str, Any] = {
        "model": client.models.list().data[0].id,
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0,
        "max_tokens": 40,
        "extra_body": thinking,
    }
    # The same request as a test above makes, without a budget (asked once).
    own, _ = _expected(_raw(raw_client, request).choices[0].message.content, True)
    # Gemma does not close a reasoning block in 40 tokens: without a budget
    # all of it is reasoning.
    assert "</think>" not in own
    request["extra_body"] = {**thinking, "thinking_token_budget": budget}
    whole = client.chat.completions.create(**{**request, "max_tokens": 12})
    message = whole.choices[0].message.model_dump()
    assert whole.usage is not None
    details = whole.usage.completion_tokens_details
    assert details is not None
    # The budget's tokens, then the end marker the engine forced (Gemma spells
    # it in several tokens): the splitter found the marker in the model's own
    # sequence, so the reasoning ended there and the model answered after it.
    assert details.reasoning_tokens == budget + len(end_tokens)
    assert own.startswith(message["reasoning_content"])
    assert "</think>" not in (message["content"] or "")
    assert whole.usage.completion_tokens > details.reasoning_tokens


def test_reasoning_and_content_written_together_stay_in_chunks_of_their_own(
    client: openai.OpenAI,
) -> None:
    """A budget ends the reasoning and the model answers; with
    ``stream_interval`` past the whole answer, every delta piles up before one
    write: the reasoning still comes in chunks of its own, before the
    content's (S28), as it does when each token is written at once."""
    request: dict[str, Any] = {
        "model": client.models.list().data[0].id,
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0,
        "max_tokens": 24,
        "stream": True,
    }
    seen: dict[int, list[tuple[str, str]]] = {}
    for interval in (1, 64):
        stream = client.chat.completions.create(
            **request,
            stream_options=cast(Any, {"stream_interval": interval}),
            extra_body={
                "chat_template_kwargs": {"enable_thinking": True},
                "thinking_token_budget": 10,
            },
        )
        pieces: list[tuple[str, str]] = []
        for chunk in stream:
            for choice in chunk.choices:
                delta = choice.delta.model_dump()
                present = [k for k in ("reasoning_content", "content") if delta.get(k)]
                assert len(present) <= 1, delta
                pieces += [(k, delta[k]) for k in present]
        seen[interval] = pieces
    kinds = [kind for kind, _ in seen[64]]
    assert kinds == sorted(kinds, reverse=True)  # all the reasoning first
    for kind in ("reasoning_content", "content"):
        joined = ["".join(t for k, t in seen[i] if k == kind) for i in (1, 64)]
        assert joined[0] == joined[1] != ""
