"""A model-free engine that yields text, as an upstream OpenAI-compatible server does.

``ScriptedTextEngine`` is a ``ScriptedEngine`` whose outputs carry text
(``TextOutput``) instead of token ids: each decode step's tokens are detokenized
on the engine side, and the server does no token work for it (no detokenizer, no
logprob alignment; ``logprobs`` are refused). It takes the same arguments,
schedule and faults as ``ScriptedEngine``, and keeps its accounting.

A request with a ``text_prompt`` (what the server sends an engine of this kind)
is tokenized here with the toy vocabulary, as an upstream server tokenizes its
prompts, and the sequence's last output reports those prompt tokens.

Invariants:
    - The concatenated text of a sequence's outputs is the text of its token ids,
      control tokens left out; each output counts the tokens of its step.
    - Closing the outputs early, or ``abort()``, aborts the scripted sequence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from sluicegate.core.decoding.detokenize import IncrementalDetokenizer
from sluicegate.core.decoding.response import OutputItem
from sluicegate.core.events import EngineOutput, TextOutput
from sluicegate.engines.base import (
    Capabilities,
    EngineStats,
    GenerateRequest,
    ModelInfo,
    OutputKind,
    TextPrompt,
)
from sluicegate.engines.outputs import SequenceOutputs
from sluicegate.engines.pool_values import UpstreamCounters
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.engines.scripted.script import Script
from sluicegate.engines.scripted.vocab import ScriptedTokenizer

__all__ = ["ScriptedTextEngine"]


class ScriptedTextEngine:
    """A ``TextEngine`` over a ``ScriptedEngine``.

    Args:
        script: as ``ScriptedEngine``'s.
        **options: ``ScriptedEngine``'s keyword arguments (rate, faults, limits,
            clock).
    """

    def __init__(self, script: Script | None = None, **options: Any) -> None:
        self._tokens = ScriptedEngine(script, **options)

    @property
    def model(self) -> ModelInfo:
        """The scripted model."""
        return self._tokens.model

    @property
    def tokenizer(self) -> ScriptedTokenizer:
        """The toy vocabulary (for prompts; outputs are text)."""
        return self._tokens.tokenizer

    @property
    def output_kind(self) -> Literal[OutputKind.TEXT]:
        """``OutputKind.TEXT``: a ``TextEngine``."""
        return OutputKind.TEXT

    @property
    def capabilities(self) -> Capabilities:
        """Listenable outputs; no logprobs, no upstreams, no counter."""
        return Capabilities(listenable=True)

    def upstream_counters(self) -> list[UpstreamCounters]:
        """``[]``: no upstreams."""
        return []

    async def count_prompt(
        self,
        request: GenerateRequest,
        messages_body: Mapping[str, Any],
        *,
        estimate: bool = False,
    ) -> int | None:
        """``None``: no token counter, and no estimate."""
        return None

    def generate(self, request: GenerateRequest) -> SequenceOutputs[TextOutput]:
        """Queue ``request``; its outputs are ``TextOutput``, one per step.

        Raises:
            EngineUnavailable, EngineError: as ``ScriptedEngine.generate``.
        """
        tokenizer = self._tokens.tokenizer
        prompt_tokens: int | None = None
        if request.text_prompt is not None:
            ids = tuple(_prompt_ids(self._tokens.tokenizer, request.text_prompt))
            request = dataclasses.replace(request, prompt_token_ids=ids)
            prompt_tokens = len(ids)
        tokens = self._tokens.generate(request)
        assert isinstance(tokens, SequenceOutputs), "the scripted engine's own"
        texts = SequenceOutputs[TextOutput](tokens.close)
        detokenizer = IncrementalDetokenizer(tokenizer.pieces, tokenizer.special_ids)

        def relay(item: OutputItem) -> None:
            if isinstance(item, EngineOutput):
                text = detokenizer.feed(item.token_ids)
                if item.finish_reason is not None:
                    text += detokenizer.flush()
                last = item.finish_reason is not None
                texts.push(
                    TextOutput(
                        text,
                        item.finish_reason,
                        len(item.token_ids),
                        prompt_tokens if last else None,
                    )
                )
            elif item is None:
                texts.end()
            elif not isinstance(item, TextOutput):
                texts.fail(item)

        tokens.listen(relay)
        return texts

    def abort(self, request_id: str, *, stopped: bool = False) -> None:
        """As ``ScriptedEngine.abort``."""
        self._tokens.abort(request_id, stopped=stopped)

    def stats(self) -> EngineStats:
        """As ``ScriptedEngine.stats``."""
        return self._tokens.stats()

    async def aclose(self) -> None:
        """As ``ScriptedEngine.aclose``."""
        await self._tokens.aclose()


def _prompt_ids(tokenizer: ScriptedTokenizer, prompt: TextPrompt) -> list[int]:
    """The toy tokenization of a text prompt: messages' contents, one per line."""
    if not isinstance(prompt.prompt, str):
        return list(prompt.prompt)
    text = prompt.prompt + "\n".join(
        f"{m.get('role', '')}: {m.get('content') or ''}" for m in prompt.messages
    )
    return tokenizer.encode(text, add_special=True, parse_special=False)
