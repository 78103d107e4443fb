"""Each engine says which protocol it follows and what it can do, as declared."""

from __future__ import annotations

import pytest

from sluicegate.engines.base import (
    Capabilities,
    GenerateRequest,
    Grammar,
    ModelInfo,
    OutputKind,
    SamplingParams,
    TextEngine,
    TokenEngine,
)
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.engines.scripted.text import ScriptedTextEngine
from sluicegate.engines.upstream.config import UpstreamConfig
from sluicegate.engines.upstream.engine import UpstreamEngine

pytestmark = pytest.mark.anyio


def test_the_scripted_engine_is_a_token_engine_without_grammars() -> None:
    engine: TokenEngine = ScriptedEngine()
    assert engine.output_kind is OutputKind.TOKENS
    assert engine.capabilities == Capabilities(logprobs=True, listenable=True)
    engine.compile_grammar(Grammar("start: this is not a grammar"))  # ignored


async def test_the_scripted_text_engine_declares_no_counter_and_no_upstreams() -> None:
    engine: TextEngine = ScriptedTextEngine()
    assert engine.output_kind is OutputKind.TEXT
    assert engine.capabilities == Capabilities(listenable=True)
    assert engine.upstream_counters() == []
    request = GenerateRequest("r", (1,), SamplingParams(max_tokens=1))
    assert await engine.count_prompt(request, {}) is None


async def test_the_upstream_engine_declares_a_pool_that_counts_and_accepts_late() -> (
    None
):
    model = ModelInfo("toy", context_length=256, created=0)
    engine = UpstreamEngine(
        model, [UpstreamConfig("http://upstream.invalid")], health_interval_s=0
    )
    text: TextEngine = engine
    assert text.output_kind is OutputKind.TEXT
    assert text.capabilities == Capabilities(
        logprobs=True,
        upstreams=True,
        counts_prompts=True,
        listenable=True,
        late_acceptance=True,
    )
    assert text.upstream_counters() == []  # no pool before the first request
    await engine.aclose()
