"""The walking skeleton, end to end: the official openai SDK on the real model."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from .wire import (
    assert_whole_characters,
    collect,
    complete,
    response_text,
    stream_chunks,
)

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

CONTROL_TOKENS = ("<end_of_turn>", "<start_of_turn>", "<eos>", "<bos>", "</s>")


def test_models_lists_the_served_model(sdk: openai.OpenAI, http: httpx.Client) -> None:
    body = http.get("/v1/models").json()
    assert body["object"] == "list"
    assert len(body["data"]) == 1
    model = body["data"][0]
    assert model["object"] == "model"
    assert isinstance(model["id"], str)
    assert model["id"]
    assert [m.id for m in sdk.models.list()] == [model["id"]]


def test_sdk_chat_stream_gives_real_text_and_one_finish(
    sdk: openai.OpenAI, model_id: str
) -> None:
    stream = sdk.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Name three colors."}],
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    text = "".join(deltas)
    assert text.strip(), chunks
    assert_whole_characters(deltas)
    assert [f for f in finishes if f is not None] in (["stop"], ["length"])
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens <= 24
    assert all(c.usage is None for c in chunks[:-1])
    assert {c.id for c in chunks} == {chunks[0].id}


def test_sdk_completions_stream_gives_real_text_and_one_finish(
    sdk: openai.OpenAI, model_id: str
) -> None:
    stream = sdk.completions.create(
        model=model_id,
        prompt="The capital of France is",
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [c.choices[0].text for c in chunks if c.choices]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert "".join(deltas).strip(), chunks
    assert_whole_characters(deltas)
    assert [f for f in finishes if f is not None] in (["stop"], ["length"])
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == (
        chunks[-1].usage.prompt_tokens + chunks[-1].usage.completion_tokens
    )


def test_default_alias_addresses_the_served_model(
    sdk: openai.OpenAI, model_id: str
) -> None:
    response = sdk.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
    )
    assert response.model in (model_id, "default")
    assert response.choices[0].finish_reason in ("stop", "length")


def test_sdk_stream_and_non_stream_give_the_same_text_at_temperature_0(
    sdk: openai.OpenAI, model_id: str
) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Describe the sea in one sentence."}
    ]
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in sdk.chat.completions.create(
            model=model_id, messages=messages, max_tokens=32, temperature=0, stream=True
        )
        if c.choices
    )
    whole = sdk.chat.completions.create(
        model=model_id, messages=messages, max_tokens=32, temperature=0
    )
    assert streamed == whole.choices[0].message.content


# Gemma 3's vocabulary: <eos>, <end_of_turn> and </s>, its end-of-generation tokens.
END_TOKEN_IDS = (1, 106, 212)


@pytest.mark.parametrize("end_id", END_TOKEN_IDS)
def test_end_token_ends_the_turn_and_never_reaches_content(
    http: httpx.Client, end_id: int
) -> None:
    """The model samples an end token: finish_reason stop, no control token text.

    ``logit_bias`` forces the token at once on any machine; what the pretrained
    model would sample by itself at some seed depends on the CPU's arithmetic.
    """
    payload = {
        "model": "default",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 8,
        "temperature": 1,
        "logit_bias": {str(end_id): 100},
        "stream_options": {"include_usage": True},
    }
    recorded, choices = collect(http, "/v1/chat/completions", payload)
    assert choices[0].finish_reason == "stop"
    assert choices[0].text == ""
    assert_no_control_text(recorded.body.decode("utf-8"))
    assert stream_chunks(recorded)[-1]["usage"]["completion_tokens"] == 1
    body = complete(http, "/v1/chat/completions", payload)
    assert body["choices"][0]["finish_reason"] == "stop"
    assert response_text(body) == ""
    assert body["usage"]["completion_tokens"] == 1


def assert_no_control_text(*texts: str) -> None:
    for text in texts:
        for token in CONTROL_TOKENS:
            assert token not in text, (token, text)


def test_raw_stream_ends_with_done_after_usage(http: httpx.Client) -> None:
    """[DONE] is the last event, once; the usage chunk comes right before it."""
    payload = {
        "prompt": "One, two, three,",
        "max_tokens": 8,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    recorded, choices = collect(http, "/v1/completions", payload)
    assert recorded.events[-1] == "[DONE]"
    assert recorded.events.count("[DONE]") == 1
    assert recorded.body.endswith(b"data: [DONE]\n\n")
    assert '"usage":{' in recorded.events[-2].replace(" ", "")
    assert choices[0].text == response_text(complete(http, "/v1/completions", payload))
