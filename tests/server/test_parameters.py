"""Each request parameter reaches the engine, or changes the text, as it should.

The scripted engine does not sample, so sampling parameters are checked where they
land (the ``SamplingParams`` of each engine request); the parameters the server
itself applies (stop strings, special tokens, echo, batches, logprobs, usage) are
checked on the streamed and the whole answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from sluicegate.engines.base import GenerateRequest, SamplingParams
from sluicegate.engines.scripted.engine import ScriptedEngine, ScriptedTokenizer
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig

from .asgi import CHAT, COMPLETIONS, HELLO, Exchange, exchange

pytestmark = pytest.mark.anyio

TOKENIZER = ScriptedTokenizer()


class Recorder:
    """A script that says ``text`` and records every request it was asked for."""

    def __init__(self, text: str = "Hello world<end_of_turn>") -> None:
        self.text = text
        self.requests: list[GenerateRequest] = []

    def __call__(self, request: GenerateRequest) -> Iterable[int]:
        self.requests.append(request)
        return TOKENIZER.encode(self.text, add_special=False, parse_special=True)

    @property
    def params(self) -> list[SamplingParams]:
        return [r.params for r in self.requests]


def _app(script: Any, **config: Any) -> Starlette:
    return create_app(ScriptedEngine(script, tokens_per_s=5000), ServerConfig(**config))


async def _post(app: Starlette, path: str, body: dict[str, Any]) -> dict[str, Any]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    payload: dict[str, Any] = response.json()
    return payload


def _texts(ex: Exchange) -> dict[int, str]:
    texts: dict[int, str] = {}
    for payload in ex.payloads():
        for choice in payload["choices"]:
            text = (
                choice["delta"].get("content") if "delta" in choice else choice["text"]
            )
            texts[choice["index"]] = texts.get(choice["index"], "") + (text or "")
    return texts


async def test_sampling_parameters_reach_the_engine() -> None:
    script = Recorder()
    body = {
        "messages": HELLO,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.1,
        "logit_bias": {"7": -100, "5": 2.5},
        "stop_token_ids": [9],
        "ignore_eos": True,
        "max_completion_tokens": 7,
        "seed": 3,
        "user": "someone",
    }
    await _post(_app(script), CHAT, body)
    assert script.params == [
        SamplingParams(
            max_tokens=7,
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            min_p=0.05,
            seed=3,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            repetition_penalty=1.1,
            stop_token_ids=frozenset({9}),
            ignore_eos=True,
            logit_bias=((5, 2.5), (7, -100.0)),
        )
    ]


async def test_defaults_are_openai_defaults_and_top_k_minus_one_disables() -> None:
    script = Recorder()
    await _post(_app(script), COMPLETIONS, {"prompt": "Hi", "top_k": -1})
    (params,) = script.params
    assert (params.temperature, params.top_p, params.top_k) == (1.0, 1.0, 0)
    assert (params.seed, params.logprobs, params.logit_bias) == (None, None, ())


async def test_n_choices_get_seed_plus_index_so_they_differ() -> None:
    script = Recorder()
    body = {"messages": HELLO, "n": 3, "seed": 10}
    payload = await _post(_app(script), CHAT, body)
    assert [c["index"] for c in payload["choices"]] == [0, 1, 2]
    assert [p.seed for p in script.params] == [10, 11, 12]


async def test_n_choices_without_seed_have_no_seed() -> None:
    script = Recorder()
    await _post(_app(script), CHAT, {"messages": HELLO, "n": 2})
    assert [p.seed for p in script.params] == [None, None]


async def test_max_completion_tokens_wins_over_max_tokens() -> None:
    body = {"messages": HELLO, "max_tokens": 9, "max_completion_tokens": 1}
    payload = await _post(_app(Recorder()), CHAT, body)
    assert payload["choices"][0]["finish_reason"] == "length"
    assert payload["choices"][0]["message"]["content"] == "Hello"
    assert payload["usage"]["completion_tokens"] == 1


async def test_stop_token_ids_end_the_choice_and_stay_out_of_the_text() -> None:
    comma = TOKENIZER.encode(",", add_special=False, parse_special=False)
    ex = await exchange(
        _app(Recorder("Hello, world")),
        COMPLETIONS,
        {"prompt": "Hi", "stop_token_ids": comma, "stream": True},
    )
    assert _texts(ex) == {0: "Hello"}
    assert ex.payloads()[-1]["choices"][0]["finish_reason"] == "stop"


async def test_ignore_eos_generates_past_the_end_of_turn() -> None:
    script = Recorder("Hi<end_of_turn> world")
    app = _app(script)
    plain = await _post(app, COMPLETIONS, {"prompt": "x"})
    assert plain["choices"][0]["text"] == "Hi"
    body = {"prompt": "x", "ignore_eos": True, "max_tokens": 3}
    past = await _post(app, COMPLETIONS, body)
    assert past["choices"][0]["text"] == "Hi world"
    assert past["choices"][0]["finish_reason"] == "length"


async def test_skip_special_tokens_false_keeps_control_tokens_in_the_text() -> None:
    app = _app(Recorder("A<start_of_turn>B<end_of_turn>"))
    skipped = await _post(app, COMPLETIONS, {"prompt": "x"})
    assert skipped["choices"][0]["text"] == "AB"
    body = {"prompt": "x", "skip_special_tokens": False}
    kept = await _post(app, COMPLETIONS, body)
    # The token that ended the choice stays out either way.
    assert kept["choices"][0]["text"] == "A<start_of_turn>B"


@pytest.mark.parametrize("stream", [True, False])
async def test_include_stop_str_in_output_ends_with_the_stop(stream: bool) -> None:
    app = _app(Recorder("Here: ABCDEFGHIJKLMNOP"))
    body: dict[str, Any] = {"prompt": "x", "stop": ["DEF", "Z"]}
    body["include_stop_str_in_output"] = True
    if stream:
        text = _texts(await exchange(app, COMPLETIONS, {**body, "stream": True}))[0]
    else:
        text = (await _post(app, COMPLETIONS, body))["choices"][0]["text"]
    assert text == "Here: ABCDEF"


async def test_stop_as_a_string_or_a_list() -> None:
    app = _app(Recorder("Here: ABCDEF"))
    one = await _post(app, COMPLETIONS, {"prompt": "x", "stop": "C"})
    two = await _post(app, COMPLETIONS, {"prompt": "x", "stop": ["E", ": "]})
    assert one["choices"][0]["text"] == "Here: AB"
    assert two["choices"][0]["text"] == "Here"


async def test_a_batch_of_prompts_gives_prompt_major_choices() -> None:
    def script(request: GenerateRequest) -> list[int]:
        prompt = TOKENIZER.decode(request.prompt_token_ids)
        return TOKENIZER.encode(f"<{prompt}>", add_special=False, parse_special=False)

    app = _app(script)
    body = {"prompt": ["ab", "c"], "n": 2, "stream": True}
    body["stream_options"] = {"include_usage": True}
    ex = await exchange(app, COMPLETIONS, body)
    assert _texts(ex) == {0: "<ab>", 1: "<ab>", 2: "<c>", 3: "<c>"}
    usage = ex.payloads()[-1]["usage"]
    # Each prompt once (BOS + its bytes), each choice's tokens.
    assert usage["prompt_tokens"] == 3 + 2
    assert usage["completion_tokens"] == 4 + 4 + 3 + 3
    ids = await _post(app, COMPLETIONS, {"prompt": [[20, 21], [22]]})
    assert [c["index"] for c in ids["choices"]] == [0, 1]
    assert ids["usage"]["prompt_tokens"] == 3


@pytest.mark.parametrize("n", [1, 2])
async def test_echo_streams_the_prompt_first_once_per_choice(n: int) -> None:
    app = _app(Recorder("Hello<end_of_turn>"))
    body = {"prompt": "Say: ", "echo": True, "n": n, "stream": True}
    ex = await exchange(app, COMPLETIONS, body)
    firsts: dict[int, str] = {}
    for payload in ex.payloads():
        for choice in payload["choices"]:
            firsts.setdefault(choice["index"], choice["text"])
    # The first chunk of a choice holds the prompt (tokens the engine made
    # before the writer ran may be coalesced into it); the text has it once.
    assert all(text.startswith("Say: ") for text in firsts.values())
    assert sorted(firsts) == list(range(n))
    assert _texts(ex) == dict.fromkeys(range(n), "Say: Hello")
    whole = await _post(app, COMPLETIONS, {**body, "stream": False})
    assert [c["text"] for c in whole["choices"]] == ["Say: Hello"] * n


async def test_echo_of_token_ids_is_their_text_without_control_tokens() -> None:
    app = _app(Recorder("!<end_of_turn>"))
    prompt = TOKENIZER.encode("Hi", add_special=True, parse_special=False)
    whole = await _post(app, COMPLETIONS, {"prompt": prompt, "echo": True})
    assert whole["choices"][0]["text"] == "Hi!"


async def test_add_generation_prompt_false_leaves_the_model_turn_out() -> None:
    script = Recorder()
    app = _app(script)
    await _post(app, CHAT, {"messages": HELLO})
    body = {"messages": HELLO, "add_generation_prompt": False}
    await _post(app, CHAT, body)
    with_turn, without = (TOKENIZER.decode(r.prompt_token_ids) for r in script.requests)
    assert with_turn == without + "model\n"


async def test_a_configured_chat_template_replaces_the_models() -> None:
    script = Recorder()
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    app = _app(script, chat_template=template)
    await _post(
        app, CHAT, {"messages": [*HELLO, {"role": "assistant", "content": "Yo"}]}
    )
    prompt = TOKENIZER.decode(script.requests[0].prompt_token_ids)
    assert prompt == "[user] Hi\n[assistant] Yo\n"


async def test_null_parameters_mean_not_given() -> None:
    script = Recorder()
    nulls = dict.fromkeys(
        ["n", "presence_penalty", "logprobs", "top_logprobs", "stop", "seed", "user"]
    )
    payload = await _post(_app(script), CHAT, {"messages": HELLO, **nulls})
    assert payload["choices"][0]["logprobs"] is None
    assert script.params == [SamplingParams(max_tokens=script.params[0].max_tokens)]
