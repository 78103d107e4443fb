"""Logprobs line up with each delta's text; usage on every chunk when asked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from typing_extensions import override

from sluicegate.core.events import EngineOutput
from sluicegate.engines.base import Capabilities, GenerateRequest
from sluicegate.engines.scripted.engine import ScriptedEngine, ScriptedTokenizer
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig

from .asgi import CHAT, COMPLETIONS, HELLO, exchange

pytestmark = pytest.mark.anyio

TOKENIZER = ScriptedTokenizer()
# " 日本語" arrives in three pieces that split its characters; "Hello" is whole.
TEXT = "Hello 日本語 ABCDEF<end_of_turn>"


def _app(text: str = TEXT) -> Starlette:
    return create_app(ScriptedEngine(text, tokens_per_s=5000), ServerConfig())


async def _post(app: Starlette, path: str, body: dict[str, Any]) -> dict[str, Any]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    payload: dict[str, Any] = response.json()
    return payload


def _chat_deltas(payloads: list[dict[str, Any]]) -> list[tuple[str, list[Any]]]:
    deltas = []
    for payload in payloads:
        for choice in payload["choices"]:
            content = choice["delta"].get("content")
            if content:
                deltas.append((content, choice["logprobs"]["content"]))
            else:
                assert choice["logprobs"] is None
    return deltas


@pytest.mark.parametrize(("stop", "cut"), [([], ""), (["ABX"], ""), (["CDE"], "C")])
async def test_chat_logprob_tokens_join_to_each_deltas_content(
    stop: list[str], cut: str
) -> None:
    app = _app()
    body = {"messages": HELLO, "logprobs": True, "top_logprobs": 3, "stop": stop}
    ex = await exchange(app, CHAT, {**body, "stream": True})
    deltas = _chat_deltas(ex.payloads())
    assert deltas
    for content, tokens in deltas:
        joined = b"".join(bytes(t["bytes"]) for t in tokens)
        if content.endswith("AB") and cut:
            # The stop string cuts the token "ABC": it is reported whole.
            assert joined == (content + cut).encode()
        else:
            assert joined == content.encode()
        for token in tokens:
            assert [a["logprob"] for a in token["top_logprobs"]] == [
                token["logprob"] - 0.5 * i for i in range(3)
            ]
            assert token["top_logprobs"][0]["token"] == token["token"]
    whole = await _post(app, CHAT, body)
    choice = whole["choices"][0]
    assert choice["message"]["content"] == "".join(c for c, _ in deltas)
    assert choice["logprobs"] == {
        "content": [t for _, tokens in deltas for t in tokens],
        "refusal": None,
    }


async def test_a_split_character_goes_out_with_all_its_tokens() -> None:
    ex = await exchange(
        _app("Hi 日本語<end_of_turn>"),
        CHAT,
        {"messages": HELLO, "logprobs": True, "stream": True},
    )
    deltas = _chat_deltas(ex.payloads())
    assert [(c, [t["token"] for t in tokens]) for c, tokens in deltas] == [
        ("Hi", ["Hi"]),
        (" 日本語", [" \\xe6\\x97", "\\xa5\\xe6\\x9c", "\\xac語"]),
    ]
    assert all(t["top_logprobs"] == [] for _, tokens in deltas for t in tokens)


async def test_completion_logprobs_have_tokens_offsets_and_top() -> None:
    app = _app("Hello world<end_of_turn>")
    body = {"prompt": "x", "logprobs": 1}
    ex = await exchange(app, COMPLETIONS, {**body, "stream": True})
    streamed = [c["logprobs"] for p in ex.payloads() for c in p["choices"] if c["text"]]
    assert [lp["tokens"] for lp in streamed] == [["Hello"], [" world"]]
    assert [lp["text_offset"] for lp in streamed] == [[0], [5]]
    whole = (await _post(app, COMPLETIONS, body))["choices"][0]["logprobs"]
    assert whole["tokens"] == ["Hello", " world"]
    assert whole["text_offset"] == [0, 5]
    assert whole["token_logprobs"] == [lp["token_logprobs"][0] for lp in streamed]
    assert [set(top) for top in whole["top_logprobs"]] == [{"Hello"}, {" world"}]


async def test_without_logprobs_every_choice_has_logprobs_null() -> None:
    app = _app()
    whole = await _post(app, CHAT, {"messages": HELLO})
    assert whole["choices"][0]["logprobs"] is None
    ex = await exchange(app, COMPLETIONS, {"prompt": "x", "stream": True})
    assert all(c["logprobs"] is None for p in ex.payloads() for c in p["choices"])


@pytest.mark.parametrize(
    "options",
    [
        {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        {"continuous_usage_stats": True},
    ],
)
async def test_continuous_usage_stats_put_usage_on_every_chunk(
    options: dict[str, Any],
) -> None:
    app = _app("Hello world<end_of_turn>")
    body = {"messages": HELLO, "stream": True, **options}
    payloads = (await exchange(app, CHAT, body)).payloads()
    usages = [p["usage"] for p in payloads]
    assert all(u is not None for u in usages)
    prompt = usages[0]["prompt_tokens"]
    assert [u["completion_tokens"] for u in usages] == [0, 1, 2, 2, 2]
    assert all(u["prompt_tokens"] == prompt for u in usages)
    assert all(u["total_tokens"] == prompt + u["completion_tokens"] for u in usages)
    assert payloads[-1]["choices"] == []


async def test_every_chunk_shares_id_created_model_and_fingerprint() -> None:
    body = {"prompt": "x", "n": 2, "stream": True}
    body["stream_options"] = {"include_usage": True}
    payloads = (await exchange(_app(), COMPLETIONS, body)).payloads()
    keys = {
        (p["id"], p["created"], p["model"], p["system_fingerprint"]) for p in payloads
    }
    assert len(keys) == 1
    assert next(iter(keys))[3].startswith("fp_")
    assert all(p["usage"] is None for p in payloads[:-1])
    assert all("finish_reason" in c for p in payloads for c in p["choices"])


class _NoLogprobs(ScriptedEngine):
    """A scripted engine that forgets the logprobs it was asked for."""

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(logprobs=True)  # plain iterators: not listenable

    @override
    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineOutput]:
        inner = super().generate(request)

        async def strip() -> AsyncIterator[EngineOutput]:
            try:
                async for output in inner:
                    yield EngineOutput(output.token_ids, output.finish_reason)
            finally:
                await inner.aclose()  # type: ignore[attr-defined]

        return strip()


async def test_an_engine_that_returns_no_logprobs_is_an_in_band_error() -> None:
    app = create_app(_NoLogprobs(tokens_per_s=5000), ServerConfig())
    body = {"messages": HELLO, "logprobs": True, "stream": True}
    ex = await exchange(app, CHAT, body)
    assert ex.done_count() == 0
    error = ex.payloads()[-1]["error"]
    assert "expected one logprob per token id" in error["message"]
