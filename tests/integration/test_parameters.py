"""Each sampling and output parameter changes what the real model writes as it should.

Gemma 3 270M is a base model, so the tests force outcomes where they can
(``logit_bias`` of +-100) instead of trusting what it likes to write, and keep
``max_tokens`` small. Token ids are found through ``echo`` of a token-id prompt.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from .servers import N_CTX
from .wire import NO_END_TOKENS, collect, complete, response_text, stream_chunks

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
PROMPT = "The quick brown fox"
# Gemma 3's end-of-sequence token, and two plain tokens to force and ban.
EOS_ID = 1
X_ID, Y_ID = 1000, 2000


def _text_of(http: httpx.Client, token_id: int) -> str:
    """The text of one token id, via ``echo`` of a token-id prompt."""
    payload = {"prompt": [token_id], "max_tokens": 1, "temperature": 0}
    whole = response_text(complete(http, COMPLETIONS, {**payload, "echo": True}))
    return whole.removesuffix(response_text(complete(http, COMPLETIONS, payload)))


def _stream_text(http: httpx.Client, path: str, payload: dict[str, Any]) -> str:
    _, choices = collect(http, path, payload)
    return choices[0].text


def test_seed_makes_sampling_repeatable(http: httpx.Client) -> None:
    # top_k keeps llama.cpp from sorting the whole vocabulary at every step.
    payload = {"prompt": PROMPT, "temperature": 1.5, "top_k": 40, "max_tokens": 8}
    first = response_text(complete(http, COMPLETIONS, {**payload, "seed": 7}))
    again = _stream_text(http, COMPLETIONS, {**payload, "seed": 7})
    assert first == again
    others = {
        response_text(complete(http, COMPLETIONS, {**payload, "seed": seed}))
        for seed in (1, 2, 3)
    }
    assert len(others | {first}) > 1


def test_temperature_zero_is_deterministic_streamed_or_not(http: httpx.Client) -> None:
    payload = {"prompt": PROMPT, "temperature": 0, "max_tokens": 12}
    texts = {
        response_text(complete(http, COMPLETIONS, payload)),
        response_text(complete(http, COMPLETIONS, {**payload, "seed": 99})),
        _stream_text(http, COMPLETIONS, payload),
    }
    assert len(texts) == 1


def test_n_choices_with_a_seed_repeat_and_differ(http: httpx.Client) -> None:
    """The same ``n`` request with a seed gives the same choices, which differ.

    Not promised: that choice 0 equals the same request with ``n: 1``. Its
    sequence runs in a batch of ``n``, and llama.cpp's arithmetic depends on the
    batch's size, so sampled text may part ways after a few tokens.
    """
    payload = {
        "prompt": PROMPT,
        "temperature": 1.5,
        "top_k": 40,
        "max_tokens": 8,
        "seed": 5,
        "n": 3,
    }
    _, choices = collect(http, COMPLETIONS, payload)
    assert sorted(choices) == [0, 1, 2]
    streamed = [choices[i].text for i in range(3)]
    whole = complete(http, COMPLETIONS, payload)
    assert [response_text(whole, i) for i in range(3)] == streamed
    assert len(set(streamed)) > 1


def test_logit_bias_forces_a_token_and_minus_100_keeps_it_out(
    http: httpx.Client,
) -> None:
    x, y = _text_of(http, X_ID), _text_of(http, Y_ID)
    payload = {"prompt": PROMPT, "temperature": 0, "max_tokens": 3}
    forced = complete(http, COMPLETIONS, {**payload, "logit_bias": {str(X_ID): 100}})
    assert response_text(forced) == x * 3
    both = {str(X_ID): 100, str(Y_ID): 100}
    # Which of the two wins is the model's (and the machine's) choice, and may
    # change from one position to the next: one token shows the winner.
    one = {**payload, "max_tokens": 1, "logit_bias": both}
    winner = response_text(complete(http, COMPLETIONS, one))
    assert winner in (x, y)
    banned_id, kept = (X_ID, y) if winner == x else (Y_ID, x)
    ban = {**both, str(banned_id): -100}
    assert _stream_text(http, COMPLETIONS, {**payload, "logit_bias": ban}) == kept * 3


def test_stop_token_ids_end_the_choice_without_the_token(http: httpx.Client) -> None:
    payload = {
        "prompt": PROMPT,
        "temperature": 0,
        "max_tokens": 5,
        "logit_bias": {str(X_ID): 100},
        "stop_token_ids": [X_ID],
        "stream_options": {"include_usage": True},
    }
    recorded, choices = collect(http, COMPLETIONS, payload)
    assert (choices[0].text, choices[0].finish_reason) == ("", "stop")
    assert stream_chunks(recorded)[-1]["usage"]["completion_tokens"] == 1


def test_ignore_eos_generates_past_the_end_of_sequence(http: httpx.Client) -> None:
    payload = {
        "prompt": PROMPT,
        "temperature": 0,
        "max_tokens": 4,
        "logit_bias": {str(EOS_ID): 100},
    }
    ended = complete(http, COMPLETIONS, payload)
    assert ended["choices"][0]["finish_reason"] == "stop"
    assert ended["usage"]["completion_tokens"] == 1
    assert response_text(ended) == ""
    past = complete(http, COMPLETIONS, {**payload, "ignore_eos": True})
    assert past["choices"][0]["finish_reason"] == "length"
    assert past["usage"]["completion_tokens"] == 4
    assert "<eos>" not in response_text(past)


def test_include_stop_str_in_output_keeps_the_stop_string(http: httpx.Client) -> None:
    # The stop string is cut from what this machine's model wrote (end tokens
    # banned, so all 16 tokens come), never assumed: the same request alone is
    # repeatable.
    payload = {
        "prompt": PROMPT,
        "temperature": 0,
        "max_tokens": 16,
        "logit_bias": NO_END_TOKENS,
    }
    unstopped = response_text(complete(http, COMPLETIONS, payload))
    assert len(unstopped) >= 4, unstopped
    third = len(unstopped) // 3
    stop = unstopped[third : third + 3]
    cut = unstopped.index(stop)
    stopped = {**payload, "stop": [stop]}
    assert _stream_text(http, COMPLETIONS, stopped) == unstopped[:cut]
    included = {**stopped, "include_stop_str_in_output": True}
    assert _stream_text(http, COMPLETIONS, included) == unstopped[: cut + len(stop)]
    assert (
        response_text(complete(http, COMPLETIONS, included))
        == (unstopped[: cut + len(stop)])
    )


def test_max_completion_tokens_limits_a_chat_answer(http: httpx.Client) -> None:
    payload = {
        "messages": [{"role": "user", "content": "Count from 1 to 50."}],
        "max_completion_tokens": 3,
        "max_tokens": 50,
        "temperature": 0,
        "logit_bias": {str(X_ID): 100},
    }
    body = complete(http, CHAT, payload)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3


def test_max_completion_tokens_limits_a_completion_through_the_sdk(
    sdk: openai.OpenAI, model_id: str, http: httpx.Client
) -> None:
    kw: Any = {
        "model": model_id,
        "prompt": PROMPT,
        "max_tokens": 50,
        "temperature": 0,
        "extra_body": {"max_completion_tokens": 3, "logit_bias": {str(X_ID): 100}},
    }
    whole = sdk.completions.create(**kw)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None
    assert whole.usage.completion_tokens == 3
    chunks = list(
        sdk.completions.create(
            **kw, stream=True, stream_options={"include_usage": True}
        )
    )
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == 3
    refused = http.post(
        COMPLETIONS, json={"prompt": [2, 651], "max_completion_tokens": 5000}
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "max_completion_tokens"


def test_chat_logprobs_align_with_each_delta(http: httpx.Client) -> None:
    payload = {
        "messages": [{"role": "user", "content": "Say: café, 日本語!"}],
        "temperature": 0,
        "max_tokens": 12,
        "logprobs": True,
        "top_logprobs": 2,
    }
    recorded, choices = collect(http, CHAT, payload)
    streamed: list[dict[str, Any]] = []
    for chunk in stream_chunks(recorded):
        for choice in chunk["choices"]:
            content = choice["delta"].get("content")
            if not content:
                assert choice["logprobs"] is None, chunk
                continue
            tokens = choice["logprobs"]["content"]
            assert b"".join(bytes(t["bytes"]) for t in tokens) == content.encode()
            for token in tokens:
                assert len(token["top_logprobs"]) == 2
                assert token["logprob"] <= 0
            streamed += tokens
    body = complete(http, CHAT, payload)
    whole = body["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in whole] == [t["token"] for t in streamed]
    assert [t["bytes"] for t in whole] == [t["bytes"] for t in streamed]
    assert [t["logprob"] for t in whole] == pytest.approx(
        [t["logprob"] for t in streamed], abs=1e-3
    )
    assert response_text(body) == choices[0].text


def test_chat_logprobs_through_the_openai_sdk(
    sdk: openai.OpenAI, model_id: str
) -> None:
    stream = sdk.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Hello"}],
        temperature=0,
        max_tokens=6,
        logprobs=True,
        top_logprobs=1,
        stream=True,
    )
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                assert choice.logprobs is not None
                assert choice.logprobs.content is not None
                joined = "".join(t.token for t in choice.logprobs.content)
                assert joined == choice.delta.content


def test_completion_logprobs_tokens_and_offsets(http: httpx.Client) -> None:
    payload = {"prompt": PROMPT, "temperature": 0, "max_tokens": 8, "logprobs": 3}
    body = complete(http, COMPLETIONS, payload)
    logprobs = body["choices"][0]["logprobs"]
    text = response_text(body)
    assert "".join(logprobs["tokens"]) == text
    offsets = [0]
    for token in logprobs["tokens"][:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs["text_offset"] == offsets
    assert all(1 <= len(top) <= 4 for top in logprobs["top_logprobs"])
    assert len(logprobs["token_logprobs"]) == len(logprobs["tokens"])
    recorded, _ = collect(http, COMPLETIONS, payload)
    streamed = [
        token
        for chunk in stream_chunks(recorded)
        for choice in chunk["choices"]
        if choice["logprobs"]
        for token in choice["logprobs"]["tokens"]
    ]
    assert streamed == logprobs["tokens"]


def test_continuous_usage_stats_put_usage_on_every_chunk(http: httpx.Client) -> None:
    payload = {
        "prompt": PROMPT,
        "temperature": 0,
        "max_tokens": 5,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    recorded, _ = collect(http, COMPLETIONS, payload)
    chunks = stream_chunks(recorded)
    assert all(chunk["usage"] is not None for chunk in chunks)
    completions = [chunk["usage"]["completion_tokens"] for chunk in chunks]
    assert completions == sorted(completions)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == complete(http, COMPLETIONS, payload)["usage"]


def test_echo_streams_the_prompt_first_once(http: httpx.Client) -> None:
    payload = {"prompt": PROMPT, "temperature": 0, "max_tokens": 4, "echo": True}
    _, choices = collect(http, COMPLETIONS, payload)
    assert choices[0].deltas[0] == PROMPT
    assert choices[0].text.count(PROMPT) == 1
    assert choices[0].text == response_text(complete(http, COMPLETIONS, payload))


def test_a_batch_of_prompts_gives_one_choice_each_in_order(http: httpx.Client) -> None:
    # The prompts decode in one batch, and llama.cpp's arithmetic depends on the
    # batch, so a choice's text need not equal the same prompt sent alone: echo
    # shows which prompt each choice continues.
    prompts = ["One, two,", "Red, green,"]
    payload = {"prompt": prompts, "temperature": 0, "max_tokens": 3, "echo": True}
    body = complete(http, COMPLETIONS, payload)
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for index, prompt in enumerate(prompts):
        text = response_text(body, index)
        assert text.startswith(prompt), (index, text)
        assert body["choices"][index]["finish_reason"] in ("stop", "length")


def test_models_lists_the_context_length_and_answers_to_default(
    http: httpx.Client, model_id: str
) -> None:
    card = http.get("/v1/models").json()["data"][0]
    assert card["context_length"] == N_CTX
    body = complete(
        http, COMPLETIONS, {"prompt": "Hi", "max_tokens": 1, "model": "default"}
    )
    assert body["model"] == model_id


def test_a_max_tokens_that_does_not_fit_names_the_numbers(http: httpx.Client) -> None:
    response = http.post(COMPLETIONS, json={"prompt": [2, 651], "max_tokens": 5000})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        f"max_tokens is 5000 but the context window is {N_CTX} tokens and the prompt "
        f"has 2 tokens: at most {N_CTX - 2} fit"
    )


def test_parameters_through_the_openai_sdk(sdk: openai.OpenAI, model_id: str) -> None:
    stream = sdk.completions.create(
        model=model_id,
        prompt=PROMPT,
        n=2,
        seed=3,
        temperature=1.0,
        top_p=0.9,
        max_tokens=6,
        stop=["\n\n", "zzz"],
        presence_penalty=0.5,
        frequency_penalty=0.5,
        user="tester",
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1},
    )
    chunks = list(stream)
    finishes = {
        c.index: c.finish_reason for k in chunks for c in k.choices if c.finish_reason
    }
    assert sorted(finishes) == [0, 1]
    usage = chunks[-1].usage
    assert usage is not None
    assert chunks[-1].choices == []
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert len({(k.id, k.created, k.model, k.system_fingerprint) for k in chunks}) == 1
