"""What an upstream says reaches the client through the gateway, in every API.

The upstream is a fake in one dialect (``gateway.py``'s ``FakeUpstream``):
vLLM's, with usage on every chunk (``continuous_usage_stats``) and cached
prompt tokens in ``prompt_tokens_details``. The clients are the official
``openai`` and ``anthropic`` SDKs, streamed and not.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from sluicegate.core.endstate import EndState
from sluicegate.server.ledger.ledger import LedgerRow, read_rows

from .gateway import (
    FakeUpstream,
    Reply,
    api_base,
    chat_chunk,
    start_gateway,
    usage_chunk,
)
from .servers import ServerProcess, StartServer

pytestmark = pytest.mark.integration

PROMPT_TOKENS = 42
CACHED_TOKENS = 16
PREFILL = "prefill"
"""A request whose last message is this gets a 200 at once, then its first
content 3 s later (a long prefill)."""
BROKEN_PREFILL = "broken prefill"
"""A 200 at once, then after 1.5 s the stream ends with no content at all."""
TEXT_ONLY = "answer in words"
"""A request with tools whose last message is this gets text, no call, whatever
its ``tool_choice`` said."""
HELD = "held"
"""A request whose last message is this gets a stream that stops after its
first content and stays open (a client that leaves mid-stream)."""

UPSTREAMS = """\
[[models]]
id = "vllm"
[[models.upstreams]]
url = "{url}"
model = "fake"
continuous_usage = true

[[models]]
id = "llama-server"
[[models.upstreams]]
url = "{llama_url}"
model = "fake"

[[models]]
id = "sglang"
context_length = 8192
[[models.upstreams]]
url = "{sglang_url}"
model = "fake"

[[models]]
id = "logprobs"
context_length = 8192
[[models.upstreams]]
url = "{logprobs_url}"
model = "fake"

[[models]]
id = "slow-count"
context_length = 8192
[[models.upstreams]]
url = "{slow_count_url}"
model = "fake"

[[models]]
id = "ollama"
context_length = 8192
[[models.upstreams]]
url = "{ollama_url}"
model = "fake"

[[models]]
id = "no-logprobs"
context_length = 8192
[[models.upstreams]]
url = "{sglang_url}"
model = "fake"
logprobs = false

[[models]]
id = "lost-logprobs"
context_length = 8192
[[models.upstreams]]
url = "{sglang_url}"
model = "fake"
"""
VLLM_COUNT, TEMPLATE_TOKENS = 17, [2, 106, 1645, 108, 9259]
NOT_FOUND: Any = lambda _: (404, {"detail": "Not Found"})  # noqa: E731
VLLM_WINDOW, SLOT_WINDOW = 4096, 2048
VLLM_MODELS = {"object": "list", "data": [{"id": "fake", "max_model_len": 4096}]}
LLAMA_PROPS = {"default_generation_settings": {"n_ctx": 2048}, "total_slots": 4}


def _usage(completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion,
        "total_tokens": PROMPT_TOKENS + completion,
        "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
    }


def _call_chunk(entry: dict[str, Any], finish: str | None = None) -> str:
    delta = {} if not entry else {"tool_calls": [entry]}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return json.dumps({"object": "chat.completion.chunk", "choices": [choice]})


def _two_calls() -> list[str]:
    """Two calls of ``get_weather``, whatever ``parallel_tool_calls`` said (an
    upstream that ignores it)."""
    chunks = []
    for i, city in enumerate(["Paris", "Oslo"]):
        start = {"index": i, "id": f"call_{i}", "type": "function"}
        function = {"name": "get_weather", "arguments": ""}
        chunks.append(_call_chunk({**start, "function": function}))
        arguments = json.dumps({"city": city})
        chunks.append(_call_chunk({"index": i, "function": {"arguments": arguments}}))
    return [*chunks, _call_chunk({}, "tool_calls")]


def _vllm(body: dict[str, Any], stop_field: str = "stop_reason") -> Reply:
    """vLLM with continuous usage: usage on every chunk, the role chunk's too;
    a request with ``stop`` is stopped on its first stop string, named in
    ``stop_field`` (vLLM's ``stop_reason``, SGLang's ``matched_stop``), or on
    another string when the first is ``"UNASKED"``."""
    role = chat_chunk(0, "", usage=_usage(0))
    texts = [chat_chunk(0, t, usage=_usage(i + 1)) for i, t in enumerate(["Hel", "lo"])]
    last = body["messages"][-1]["content"]
    if body.get("tools") and last != TEXT_ONLY:
        return Reply(events=[role, *_two_calls(), "[DONE]"])
    if last == BROKEN_PREFILL:
        return Reply(events=[], delay_s=1.5)
    if last == HELD:
        return Reply(events=[role, texts[0]], hold_s=20.0)
    stops = body.get("stop") or [None]
    matched = "never sent" if stops[0] == "UNASKED" else stops[0]
    finish = chat_chunk(0, None, "stop", usage=_usage(2), **{stop_field: matched})
    final = json.dumps(
        {**json.loads(usage_chunk(PROMPT_TOKENS, 2)), "usage": _usage(2)}
    )
    events = [role, *texts, finish, final, "[DONE]"]
    return Reply(events=events, delay_s=3.0 if last == PREFILL else 0.0)


def _final_usage_only(body: dict[str, Any]) -> Reply:
    """llama-server: usage on the last chunk only (no continuous usage)."""
    events = [chat_chunk(0, t) for t in ["Hel", "lo"]]
    final = json.loads(usage_chunk(PROMPT_TOKENS, 2)) | {"usage": _usage(2)}
    last = [chat_chunk(0, None, "stop"), json.dumps(final), "[DONE]"]
    return Reply(events=[*events, *last], gap_s=0.2)


@pytest.fixture(scope="module")
def vllm() -> Iterator[FakeUpstream]:
    routes = {
        "GET /v1/models": lambda _: (200, VLLM_MODELS),
        "POST /v1/messages/count_tokens": NOT_FOUND,
        "POST /tokenize": lambda body: (200, {"count": VLLM_COUNT, "tokens": []}),
    }
    with FakeUpstream(_vllm, routes) as fake:
        yield fake


LOGPROB_TOKENS = ["Hel", "lo", " world"]


SPLIT = "split"
"""A chat request whose last message is this gets tokens that split a
character: the first in a chunk with empty content, as vLLM sends it."""
CUMULATIVE = "cumulative"
"""... gets its text and tokens repeated cumulatively in every chunk."""
CAT = "\u732b".encode()


def _logprob_chunk(text: str, tokens: list[bytes]) -> str:
    entries = [
        {"token": t.decode(errors="replace"), "logprob": -1.0, "bytes": list(t),
         "top_logprobs": []}
        for t in tokens
    ]  # fmt: skip
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None,
              "logprobs": {"content": entries}}  # fmt: skip
    return json.dumps({"object": "chat.completion.chunk", "choices": [choice]})


def _odd_logprobs(last: str) -> Reply:
    if last == SPLIT:
        chunks = [("", [CAT[:2]]), ("\u732b!", [CAT[2:] + b"!"])]
    else:
        chunks = [
            ("He", [b"He"]),
            ("Hel", [b"He", b"l"]),
            ("Hello", [b"He", b"l", b"lo"]),
        ]
    events = [_logprob_chunk(text, tokens) for text, tokens in chunks]
    end = {"index": 0, "finish_reason": "stop", "delta": {}}
    return Reply(events=[*events, json.dumps({"choices": [end]}), "[DONE]"])


def _with_logprobs(body: dict[str, Any]) -> Reply:
    """vLLM answering ``logprobs``: each chunk's tokens in the API's shape
    (it ignores the stop strings: the gateway matches them)."""
    chat = "messages" in body
    if chat and body["messages"][-1]["content"] in (SPLIT, CUMULATIVE):
        return _odd_logprobs(body["messages"][-1]["content"])
    k = body.get("top_logprobs", 0) if chat else body.get("logprobs") or 0
    events = []
    for i, token in enumerate(LOGPROB_TOKENS):
        logprob = -0.5 - i
        top = [(token, logprob), ("x", logprob - 1), ("y", logprob - 2)][:k]
        choice: dict[str, Any] = {"index": 0, "finish_reason": None}
        if chat:
            choice["delta"] = {"content": token}
            entry = {"token": token, "logprob": logprob, "bytes": list(token.encode())}
            tops = [{"token": t, "logprob": v, "bytes": None} for t, v in top]
            choice["logprobs"] = {"content": [{**entry, "top_logprobs": tops}]}
        else:
            choice["text"] = token
            choice["logprobs"] = {
                "tokens": [token],
                "token_logprobs": [logprob],
                "top_logprobs": [dict(top)],
                "text_offset": [0],
            }
        events.append(json.dumps({"object": "chunk", "choices": [choice]}))
    last = {"index": 0, "finish_reason": "stop", "delta": {}, "text": ""}
    events.append(json.dumps({"object": "chunk", "choices": [last]}))
    return Reply(events=[*events, "[DONE]"])


@pytest.fixture(scope="module")
def with_logprobs() -> Iterator[FakeUpstream]:
    with FakeUpstream(_with_logprobs) as fake:
        yield fake


def _slow_tokenize(body: dict[str, Any]) -> tuple[int, Any]:
    time.sleep(5)  # far past COUNT_WAIT_S
    return 200, {"count": 9}


@pytest.fixture(scope="module")
def slow_count() -> Iterator[FakeUpstream]:
    """An upstream without continuous usage whose tokenizer answers late."""
    routes = {"POST /tokenize": _slow_tokenize}
    with FakeUpstream(_final_usage_only, routes) as fake:
        yield fake


@pytest.fixture(scope="module")
def sglang() -> Iterator[FakeUpstream]:
    """SGLang: the matched stop string in ``matched_stop``."""
    with FakeUpstream(lambda body: _vllm(body, "matched_stop")) as fake:
        yield fake


@pytest.fixture(scope="module")
def slots_upstream() -> Iterator[FakeUpstream]:
    """llama-server: its window at ``/props``, its model list without one."""
    routes = {
        "GET /props": lambda _: (200, LLAMA_PROPS),
        "POST /v1/messages/count_tokens": NOT_FOUND,
        "POST /apply-template": lambda body: (200, {"prompt": "<t>Hi</t>"}),
        "POST /tokenize": lambda body: (
            200,
            {"tokens": TEMPLATE_TOKENS if "content" in body else []},
        ),
    }
    with FakeUpstream(_final_usage_only, routes) as fake:
        yield fake


def _ollama(body: dict[str, Any]) -> Reply:
    """Ollama: usage on the last chunk only; a ``HELD`` request stops after its
    first content and stays open."""
    if body["messages"][-1]["content"] == HELD:
        return Reply(events=[chat_chunk(0, "Hel")], hold_s=20.0)
    return _final_usage_only(body)


@pytest.fixture(scope="module")
def ollama() -> Iterator[FakeUpstream]:
    """Ollama's OpenAI routes: no token counter anywhere."""
    routes = {
        "POST /v1/messages/count_tokens": NOT_FOUND,
        "POST /tokenize": NOT_FOUND,
        "POST /apply-template": NOT_FOUND,
        "POST /chat_tokenize": NOT_FOUND,
    }
    with FakeUpstream(_ollama, routes) as fake:
        yield fake


@pytest.fixture(scope="module")
def ledger_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fidelity") / "ledger.sqlite3"


@pytest.fixture(scope="module")
def gateway(
    start_server: StartServer,
    vllm: FakeUpstream,
    slots_upstream: FakeUpstream,
    ollama: FakeUpstream,
    sglang: FakeUpstream,
    with_logprobs: FakeUpstream,
    slow_count: FakeUpstream,
    ledger_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> ServerProcess:
    config = tmp_path_factory.mktemp("fidelity") / "upstreams.toml"
    config.write_text(
        UPSTREAMS.format(
            url=vllm.url,
            llama_url=slots_upstream.url,
            ollama_url=ollama.url,
            sglang_url=sglang.url,
            logprobs_url=with_logprobs.url,
            slow_count_url=slow_count.url,
        )
    )
    return start_server(
        "gateway-fidelity",
        *("--upstreams", str(config), "--ledger", str(ledger_path)),
        *("--log-level", "warning", "--heartbeat-s", "0.2"),
    )


@pytest.fixture(scope="module")
def sdk(gateway: ServerProcess) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(
        base_url=f"{gateway.base_url}/v1", api_key="x", max_retries=0
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def claude(gateway: ServerProcess) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=gateway.base_url, api_key="x", max_retries=0)
    yield client
    client.close()


def _ask(text: str = "Hi") -> list[Any]:
    return [{"role": "user", "content": text}]


def test_continuous_usage_has_the_prompt_tokens_from_the_first_chunk(
    sdk: openai.OpenAI,
) -> None:
    chunks = list(
        sdk.chat.completions.create(
            model="vllm",
            messages=_ask(),
            max_tokens=8,
            stream=True,
            extra_body={
                "stream_options": {
                    "include_usage": True,
                    "continuous_usage_stats": True,
                }
            },
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "Hello"
    )
    usages = [c.usage for c in chunks]
    assert all(u is not None for u in usages), usages
    assert {u.prompt_tokens for u in usages if u is not None} == {PROMPT_TOKENS}
    last = usages[-1]
    assert last is not None
    assert last.completion_tokens == 2
    assert last.prompt_tokens_details is not None
    assert last.prompt_tokens_details.cached_tokens == CACHED_TOKENS


def test_cached_tokens_reach_chat_and_responses_usage(sdk: openai.OpenAI) -> None:
    whole = sdk.chat.completions.create(model="vllm", messages=_ask(), max_tokens=8)
    assert whole.usage is not None
    assert whole.usage.prompt_tokens == PROMPT_TOKENS
    assert whole.usage.prompt_tokens_details is not None
    assert whole.usage.prompt_tokens_details.cached_tokens == CACHED_TOKENS
    response = sdk.responses.create(model="vllm", input="Hi", max_output_tokens=8)
    assert response.usage is not None
    assert response.usage.input_tokens == PROMPT_TOKENS
    assert response.usage.input_tokens_details.cached_tokens == CACHED_TOKENS
    kw: Any = {"model": "vllm", "input": "Hi", "max_output_tokens": 8}
    events = list(sdk.responses.create(**kw, stream=True))
    final = events[-1].response
    assert final.usage is not None
    assert final.usage.input_tokens_details.cached_tokens == CACHED_TOKENS


def test_message_start_has_the_input_tokens_and_cache_reads(
    claude: anthropic.Anthropic,
) -> None:
    events = list(
        claude.messages.create(model="vllm", max_tokens=8, messages=_ask(), stream=True)
    )
    start = events[0]
    assert start.type == "message_start"
    uncached = PROMPT_TOKENS - CACHED_TOKENS
    assert start.message.usage.input_tokens == uncached
    assert start.message.usage.cache_read_input_tokens == CACHED_TOKENS
    whole = claude.messages.create(model="vllm", max_tokens=8, messages=_ask())
    assert whole.usage.input_tokens == uncached
    assert whole.usage.cache_read_input_tokens == CACHED_TOKENS
    assert whole.usage.cache_creation_input_tokens == 0


def test_headers_and_heartbeats_come_during_an_upstream_prefill(
    gateway: ServerProcess,
) -> None:
    """The upstream answered 200 and prefills for 3 s: the client gets its
    headers and heartbeats (every 0.2 s) long before the first content."""
    body = {"model": "vllm", "messages": _ask(PREFILL), "stream": True}
    url = f"{gateway.base_url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=30) as response:
        assert response.status_code == 200
        lines = []
        for line in response.iter_lines():
            lines.append(line)
            if '"content":"Hel"' in line:
                break
    before = lines[: lines.index(next(x for x in lines if '"content":"Hel"' in x))]
    assert sum(line.startswith(":") for line in before) >= 2, before


def test_a_message_start_sent_during_an_upstream_prefill_has_the_prompts_tokens(
    claude: anthropic.Anthropic, sdk: openai.OpenAI, vllm: FakeUpstream
) -> None:
    """The headers went out before the upstream's first event (a 3 s prefill):
    ``message_start`` and the first continuous-usage chunk say the prompt's
    tokens as the upstream's tokenizer counts them (``/tokenize``), not 0."""
    kw: Any = {"model": "vllm", "max_tokens": 8, "messages": _ask(PREFILL)}
    events = list(claude.messages.create(**kw, stream=True))
    assert events[0].message.usage.input_tokens == VLLM_COUNT
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = sdk.chat.completions.create(
        **kw, stream=True, extra_body={"stream_options": options}
    )
    first = next(iter(chunks)).usage
    chunks.close()
    assert first is not None
    assert first.prompt_tokens == VLLM_COUNT
    assert "POST /tokenize" in vllm.calls


def test_a_refusal_after_the_headers_went_out_is_one_in_band_error(
    gateway: ServerProcess,
) -> None:
    """The upstream answered 200, then failed before any content, after the
    client's headers went out: what would have been a 502 is an error event."""
    body = {"model": "vllm", "messages": _ask(BROKEN_PREFILL), "stream": True}
    url = f"{gateway.base_url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=30) as response:
        assert response.status_code == 200
        data = [x for x in response.iter_lines() if x.startswith("data: ")]
    assert len(data) == 2, data  # the role chunk, then the error
    error = json.loads(data[-1].removeprefix("data: "))["error"]
    assert "before any content" in error["message"]


def _row(path: Path, response_id: str) -> LedgerRow:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for row in read_rows(path):
            if row.request_id == response_id and row.end_state != "open":
                return row
        time.sleep(0.05)
    raise AssertionError(f"no ended ledger row for {response_id}")


def test_an_aborted_requests_ledger_row_has_its_prompt_tokens(
    sdk: openai.OpenAI, ledger_path: Path
) -> None:
    stream = sdk.chat.completions.create(
        model="vllm", messages=_ask(HELD), max_tokens=8, stream=True
    )
    response_id = ""
    for chunk in stream:
        response_id = chunk.id
        if chunk.choices and chunk.choices[0].delta.content:
            break
    stream.close()  # the client leaves mid-stream
    row = _row(ledger_path, response_id)
    assert row.end_state is EndState.ABORTED
    assert row.prompt_tokens == PROMPT_TOKENS
    assert row.completion_tokens == 1


def test_models_show_the_context_length_each_upstream_tells(
    sdk: openai.OpenAI, slots_upstream: FakeUpstream
) -> None:
    models = {m.id: m.model_dump() for m in sdk.models.list()}
    assert models["vllm"]["context_length"] == VLLM_WINDOW  # its max_model_len
    assert models["llama-server"]["context_length"] == SLOT_WINDOW  # /props n_ctx
    assert "GET /props" in slots_upstream.calls


def test_count_tokens_uses_the_upstreams_tokenizer_or_refuses(
    claude: anthropic.Anthropic, slots_upstream: FakeUpstream
) -> None:
    vllm = claude.messages.count_tokens(model="vllm", messages=_ask())
    assert vllm.input_tokens == VLLM_COUNT  # vLLM's /tokenize with messages
    llama = claude.messages.count_tokens(model="llama-server", messages=_ask())
    assert llama.input_tokens == len(TEMPLATE_TOKENS)  # its template, then tokens
    assert "POST /apply-template" in slots_upstream.calls
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.count_tokens(model="ollama", messages=_ask())
    message = refused.value.message
    assert "'ollama'" in message
    assert "no token counter" in message


@pytest.mark.parametrize("model", ["vllm", "sglang"])
def test_a_stop_string_the_upstream_matched_is_the_messages_stop_sequence(
    claude: anthropic.Anthropic, model: str
) -> None:
    kw: Any = {"model": model, "max_tokens": 8, "messages": _ask()}
    whole = claude.messages.create(**kw, stop_sequences=["\n\n", "END"])
    assert (whole.stop_reason, whole.stop_sequence) == ("stop_sequence", "\n\n")
    events = list(claude.messages.create(**kw, stop_sequences=["END"], stream=True))
    delta = events[-2]
    assert delta.type == "message_delta"
    assert (delta.delta.stop_reason, delta.delta.stop_sequence) == (
        "stop_sequence",
        "END",
    )
    unasked = claude.messages.create(**kw, stop_sequences=["UNASKED"])
    assert (unasked.stop_reason, unasked.stop_sequence) == ("end_turn", None)


WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_parallel_tool_calls_false_keeps_the_first_call_of_an_upstream_that_sends_two(
    sdk: openai.OpenAI,
) -> None:
    kw: Any = {
        "model": "vllm",
        "messages": _ask(),
        "tools": [WEATHER],
        "max_tokens": 64,
    }
    both = sdk.chat.completions.create(**kw)
    assert [c.function.arguments for c in both.choices[0].message.tool_calls or []] == [
        '{"city": "Paris"}',
        '{"city": "Oslo"}',
    ]
    one = sdk.chat.completions.create(**kw, parallel_tool_calls=False)
    (call,) = one.choices[0].message.tool_calls or []
    assert (call.function.name, call.function.arguments) == (
        "get_weather",
        '{"city": "Paris"}',
    )
    assert one.choices[0].finish_reason == "tool_calls"
    chunks = list(
        sdk.chat.completions.create(**kw, parallel_tool_calls=False, stream=True)
    )
    indexes = {
        t.index
        for c in chunks
        if c.choices
        for t in c.choices[0].delta.tool_calls or []
    }
    assert indexes == {0}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls"


def test_tool_choice_none_drops_the_calls_of_an_upstream_that_sends_them_anyway(
    sdk: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    kw: Any = {"model": "vllm", "messages": _ask(), "tools": [WEATHER]}
    whole = sdk.chat.completions.create(**kw, tool_choice="none", max_tokens=64)
    assert whole.choices[0].message.tool_calls is None
    assert whole.choices[0].finish_reason == "stop"
    chunks = list(sdk.chat.completions.create(**kw, tool_choice="none", stream=True))
    assert not [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    function = WEATHER["function"]
    tool: Any = {"type": "function", **function}
    answer = sdk.responses.create(
        model="vllm", input="Hi", tools=[tool], tool_choice="none"
    )
    assert [item.type for item in answer.output if item.type == "function_call"] == []
    message = claude.messages.create(
        model="vllm",
        max_tokens=64,
        messages=[{"role": "user", "content": "Hi"}],
        tools=[{"name": function["name"], "input_schema": function["parameters"]}],
        tool_choice={"type": "none"},
    )
    assert [b.type for b in message.content if b.type == "tool_use"] == []
    assert message.stop_reason == "end_turn"


def test_tool_choice_required_answered_in_words_is_an_in_band_error(
    sdk: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    kw: Any = {
        "model": "vllm",
        "messages": _ask(TEXT_ONLY),
        "tools": [WEATHER],
        "tool_choice": "required",
    }
    with pytest.raises(openai.APIError, match="tool_choice") as raised:
        sdk.chat.completions.create(**kw)
    assert raised.value.code == "tool_call_missing"
    with pytest.raises(openai.APIError, match="tool_choice"):
        list(sdk.chat.completions.create(**kw, stream=True))
    auto = sdk.chat.completions.create(**{**kw, "tool_choice": "auto"})
    assert auto.choices[0].message.content == "Hello"
    function = WEATHER["function"]
    with pytest.raises(anthropic.APIError, match="tool_choice"):
        claude.messages.create(
            model="vllm",
            max_tokens=64,
            messages=[{"role": "user", "content": TEXT_ONLY}],
            tools=[{"name": function["name"], "input_schema": function["parameters"]}],
            tool_choice={"type": "any"},
        )


TIME: Any = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object"}},
}
WRONG_CALL = "The engine called 'get_weather', though tool_choice named 'get_time'"


def _read(stream: Iterable[Any], into: list[Any]) -> None:
    """Every item of ``stream`` into ``into``, up to what it raises."""
    into.extend(stream)


def test_a_named_tool_choice_answered_with_another_function_is_an_in_band_error(
    sdk: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    # The upstream calls get_weather whatever tool_choice named (it ignores it).
    kw: Any = {"model": "vllm", "messages": _ask(), "tools": [WEATHER, TIME]}
    named: Any = {"type": "function", "function": {"name": "get_time"}}
    with pytest.raises(openai.APIError, match=WRONG_CALL) as raised:
        sdk.chat.completions.create(**kw, tool_choice=named)
    assert raised.value.code == "tool_call_missing"
    chunks: list[Any] = []
    with pytest.raises(openai.APIError, match=WRONG_CALL):
        _read(sdk.chat.completions.create(**kw, tool_choice=named, stream=True), chunks)
    assert chunks, "the error comes in band, after the headers"
    assert not [c for chunk in chunks for c in chunk.choices if c.delta.tool_calls]
    right: Any = {"type": "function", "function": {"name": "get_weather"}}
    answer = sdk.chat.completions.create(**kw, tool_choice=right)
    (call,) = answer.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    tools: Any = [{"type": "function", **t["function"]} for t in (WEATHER, TIME)]
    ask: Any = {"model": "vllm", "input": "Hi", "tools": tools}
    choice: Any = {"type": "function", "name": "get_time"}
    with pytest.raises(openai.APIError, match=WRONG_CALL):
        sdk.responses.create(**ask, tool_choice=choice)
    events = list(sdk.responses.create(**ask, tool_choice=choice, stream=True))
    assert events[-1].type == "response.failed"
    error = events[-1].response.error
    assert error is not None
    assert (error.code, error.message) == ("tool_call_missing", WRONG_CALL)
    assert not [e for e in events if e.type.startswith("response.function_call")]
    functions: Any = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
        for t in (WEATHER, TIME)
    ]
    message: Any = {
        "model": "vllm",
        "max_tokens": 64,
        "messages": _ask(),
        "tools": functions,
        "tool_choice": {"type": "tool", "name": "get_time"},
    }
    with pytest.raises(anthropic.APIError, match=WRONG_CALL):
        claude.messages.create(**message)
    streamed: list[Any] = []
    with pytest.raises(anthropic.APIError, match=WRONG_CALL):
        _read(claude.messages.create(**message, stream=True), streamed)
    assert streamed[0].type == "message_start"
    assert not [e for e in streamed if e.type == "content_block_start"]


def test_logprobs_of_an_upstream_configured_without_them_are_a_400_naming_it(
    sdk: openai.OpenAI, sglang: FakeUpstream
) -> None:
    kw: Any = {"model": "no-logprobs", "messages": _ask(), "logprobs": True}
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError, match=sglang.url) as raised:
            sdk.chat.completions.create(**kw, stream=stream)
        assert raised.value.code == "logprobs_unavailable"
        assert raised.value.body["param"] == "logprobs"  # type: ignore[index]
    answer = sdk.chat.completions.create(model="no-logprobs", messages=_ask())
    assert answer.choices[0].message.content == "Hello"


def test_an_answer_that_came_without_the_logprobs_asked_is_an_error_then_a_400(
    sdk: openai.OpenAI, sglang: FakeUpstream, gateway: ServerProcess
) -> None:
    def learnt(model: str) -> Any:
        url = f"{gateway.base_url}/engine/stats"
        stats = httpx.get(url, params={"model": model}, timeout=10).json()
        return stats["logprobs_unavailable_learnt"]

    assert learnt("lost-logprobs") == []
    kw: Any = {"model": "lost-logprobs", "messages": _ask(), "logprobs": True}
    with pytest.raises(openai.APIError, match="sent no logprobs") as raised:
        list(sdk.chat.completions.create(**kw, stream=True))
    assert raised.value.code == "logprobs_unavailable"
    with pytest.raises(openai.BadRequestError, match=sglang.url):
        sdk.chat.completions.create(**kw)
    # Learnt by that model's pool only; one configured without them is not listed.
    assert learnt("lost-logprobs") == [sglang.url]
    assert learnt("no-logprobs") == learnt("sglang") == []
    answer = sdk.chat.completions.create(model="lost-logprobs", messages=_ask())
    assert answer.choices[0].message.content == "Hello"


def test_logprobs_cross_the_hop_aligned_to_the_gateways_own_text(
    sdk: openai.OpenAI, with_logprobs: FakeUpstream
) -> None:
    chat: Any = {"model": "logprobs", "messages": _ask(), "max_tokens": 8}
    whole = sdk.chat.completions.create(**chat, logprobs=True, top_logprobs=2)
    choice = whole.choices[0]
    assert choice.message.content == "Hello world"
    assert choice.logprobs is not None
    content = choice.logprobs.content or []
    assert [t.token for t in content] == LOGPROB_TOKENS
    assert [len(t.top_logprobs) for t in content] == [2, 2, 2]
    asked = with_logprobs.requests[-1]
    assert (asked["logprobs"], asked["top_logprobs"]) == (True, 2)
    chunks = list(
        sdk.chat.completions.create(**chat, logprobs=True, top_logprobs=1, stream=True)
    )
    streamed = [
        t.token
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content or []
    ]
    assert streamed == LOGPROB_TOKENS
    stopped = sdk.chat.completions.create(**chat, logprobs=True, stop=[" wor"])
    assert stopped.choices[0].message.content == "Hello"
    assert stopped.choices[0].logprobs is not None
    kept = [t.token for t in stopped.choices[0].logprobs.content or []]
    assert kept == ["Hel", "lo"]  # " world" starts where the stop string cut
    text = sdk.completions.create(
        model="logprobs", prompt="Say", max_tokens=8, logprobs=2
    )
    logprobs = text.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens == LOGPROB_TOKENS
    assert logprobs.text_offset == [0, 3, 5]
    assert with_logprobs.requests[-1]["logprobs"] == 2


@pytest.fixture(scope="module")
def over_sluicegate(start_server: StartServer) -> ServerProcess:
    """A gateway (``--upstream`` alone, nothing configured) in front of a real
    scripted sluicegate."""
    upstream = start_server("fidelity-scripted", "--engine", "scripted", "--no-ledger")
    return start_gateway(
        start_server, "gateway-over-sluicegate", [api_base(upstream)], "scripted"
    )


def test_over_sluicegate_the_prompt_tokens_are_known_from_the_first_event(
    over_sluicegate: ServerProcess,
) -> None:
    """The upstream lists itself as sluicegate's: continuous usage is asked for
    without any configuration, so message_start and every continuous-usage
    chunk carry the prompt's tokens."""
    base = over_sluicegate.base_url
    with anthropic.Anthropic(base_url=base, api_key="x", max_retries=0) as claude:
        kw: Any = {"model": "scripted", "max_tokens": 8, "messages": _ask()}
        events = list(claude.messages.create(**kw, stream=True))
        whole = claude.messages.create(**kw)
    assert events[0].message.usage.input_tokens == whole.usage.input_tokens > 0
    with openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as sdk:
        options = {"include_usage": True, "continuous_usage_stats": True}
        chunks = list(
            sdk.chat.completions.create(
                model="scripted",
                messages=_ask(),
                max_tokens=8,
                stream=True,
                extra_body={"stream_options": options},
            )
        )
    prompts = {c.usage.prompt_tokens for c in chunks if c.usage is not None}
    assert prompts == {whole.usage.input_tokens}


def test_without_continuous_usage_message_start_has_the_upstreams_token_count(
    claude: anthropic.Anthropic, slots_upstream: FakeUpstream
) -> None:
    """llama-server sends usage only at the end: the prompt is counted by its
    tokenizer (``/apply-template``, ``/tokenize``) for ``message_start``, and
    the end's usage is the upstream's own."""
    kw: Any = {"model": "llama-server", "max_tokens": 8, "messages": _ask()}
    events = list(claude.messages.create(**kw, stream=True))
    assert events[0].message.usage.input_tokens == len(TEMPLATE_TOKENS)
    assert "POST /apply-template" in slots_upstream.calls
    assert events[-2].usage.input_tokens == PROMPT_TOKENS - CACHED_TOKENS


def test_a_slow_token_counter_does_not_hold_the_first_event(
    claude: anthropic.Anthropic, slow_count: FakeUpstream
) -> None:
    """The count is a nicety: one that has not come by
    ``COUNT_BEFORE_ESTIMATE_S`` is skipped (message_start says the estimate,
    not the counter's 9), and the answer ends with the upstream's own usage."""
    kw: Any = {"model": "slow-count", "max_tokens": 8, "messages": _ask()}
    events = list(claude.messages.create(**kw, stream=True))
    assert "POST /tokenize" in slow_count.calls
    assert events[0].message.usage.input_tokens not in (0, 9)
    assert events[-2].usage.input_tokens == PROMPT_TOKENS - CACHED_TOKENS


@pytest.mark.parametrize(
    ("ask", "text", "tokens"),
    [
        (SPLIT, "\u732b!", [CAT[:2], CAT[2:] + b"!"]),
        (CUMULATIVE, "Hello", [b"He", b"l", b"lo"]),
    ],
)
def test_logprobs_of_split_characters_and_cumulative_chunks_stay_with_their_text(
    sdk: openai.OpenAI, ask: str, text: str, tokens: list[bytes]
) -> None:
    """A token that ends inside a character comes with that character's
    delta; a cumulative upstream's repeated tokens are taken once."""
    chat: Any = {"model": "logprobs", "messages": _ask(ask), "max_tokens": 8}
    whole = sdk.chat.completions.create(**chat, logprobs=True)
    assert whole.choices[0].message.content == text
    assert whole.choices[0].logprobs is not None
    got = [bytes(t.bytes or []) for t in whole.choices[0].logprobs.content or []]
    assert got == tokens
    chunks = list(sdk.chat.completions.create(**chat, logprobs=True, stream=True))
    deltas = [
        (c.choices[0].delta.content, [bytes(t.bytes or []) for t in lp.content or []])
        for c in chunks
        if c.choices and (lp := c.choices[0].logprobs) is not None
    ]
    assert "".join(d for d, _ in deltas) == text
    assert [t for _, ts in deltas for t in ts] == tokens
    for content, carried in deltas:  # each delta's tokens make its text
        assert b"".join(carried).decode() == content


def test_without_any_counter_the_first_event_has_an_estimate_the_end_the_count(
    claude: anthropic.Anthropic, ollama: FakeUpstream
) -> None:
    """Ollama says its prompt's tokens only at the end: ``message_start`` has
    an estimate (characters over characters per token, 4 until the upstream's
    own counts teach one), the end the upstream's count; the next request's
    estimate of the same prompt is learned from that count, and the counters
    it does not serve are not asked again."""
    kw: Any = {"model": "ollama", "max_tokens": 8, "messages": _ask("Estimate me")}
    first = list(claude.messages.create(**kw, stream=True))
    assert "POST /chat_tokenize" in ollama.calls  # every counter was asked
    guessed = first[0].message.usage.input_tokens
    assert 0 < guessed != PROMPT_TOKENS
    assert first[-2].usage.input_tokens == PROMPT_TOKENS - CACHED_TOKENS
    asked = len(ollama.calls)
    again = list(claude.messages.create(**kw, stream=True))
    assert again[0].message.usage.input_tokens == PROMPT_TOKENS
    # its counters answered 404: learnt absent, not asked again
    since = ollama.calls[asked:]
    assert "POST /v1/chat/completions" in since
    assert not {c for c in since if c.startswith("POST") and "chat/" not in c}


def test_an_aborted_requests_row_without_any_counter_has_an_estimate(
    sdk: openai.OpenAI, ledger_path: Path
) -> None:
    stream = sdk.chat.completions.create(
        model="ollama", messages=_ask(HELD), max_tokens=8, stream=True
    )
    response_id = ""
    for chunk in stream:
        response_id = chunk.id
        if chunk.choices and chunk.choices[0].delta.content:
            break
    stream.close()
    row = _row(ledger_path, response_id)
    assert row.end_state is EndState.ABORTED
    assert row.prompt_tokens > 0
    assert row.usage_estimated


def test_over_sluicegate_the_stop_string_the_upstream_matched_is_named(
    over_sluicegate: ServerProcess,
) -> None:
    """The upstream sluicegate cuts the stop string and names it in its finish
    chunk's ``stop_reason`` (vLLM's field), so the gateway's Messages answer
    says which stop sequence ended it, streamed and not."""
    base = over_sluicegate.base_url
    kw: Any = {"model": "scripted", "max_tokens": 16, "messages": _ask()}
    with anthropic.Anthropic(base_url=base, api_key="x", max_retries=0) as claude:
        text = claude.messages.create(**kw).content[0]
        assert isinstance(text, anthropic.types.TextBlock)
        stop = text.text[len(text.text) // 2 :][:3]  # met in the middle
        whole = claude.messages.create(**kw, stop_sequences=["\u00a7", stop])
        events = list(claude.messages.create(**kw, stop_sequences=[stop], stream=True))
    assert (whole.stop_reason, whole.stop_sequence) == ("stop_sequence", stop)
    delta = events[-2]
    assert delta.type == "message_delta"
    assert (delta.delta.stop_reason, delta.delta.stop_sequence) == (
        "stop_sequence",
        stop,
    )
