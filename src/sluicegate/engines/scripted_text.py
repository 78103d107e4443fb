"""A model-free engine that yields text, as an upstream OpenAI-compatible server does.

``ScriptedTextEngine`` is a ``ScriptedEngine`` whose outputs carry text
(``TextOutput``) instead of token ids: each decode step's tokens are detokenized
on the engine side, and the server does no token work for it (no detokenizer, no
logprob alignment; ``logprobs`` are refused). It takes the same arguments,
schedule and faults as ``ScriptedEngine``, and keeps its accounting.

Invariants:
    - The concatenated text of a sequence's outputs is the text of its token ids,
      control tokens left out; each output counts the tokens of its step.
    - Closing the outputs early, or ``abort()``, aborts the scripted sequence.
"""

from __future__ import annotations

from typing import Any

from sluicegate.core.decoding import OutputItem
from sluicegate.core.detokenize import IncrementalDetokenizer
from sluicegate.core.events import EngineOutput, TextOutput
from sluicegate.engines.base import EngineStats, GenerateRequest, ModelInfo, OutputKind
from sluicegate.engines.outputs import SequenceOutputs
from sluicegate.engines.scripted import Script, ScriptedEngine
from sluicegate.engines.scripted_vocab import ScriptedTokenizer

__all__ = ["ScriptedTextEngine"]


class ScriptedTextEngine:
    """An ``Engine`` of ``OutputKind.TEXT`` over a ``ScriptedEngine``.

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
    def output_kind(self) -> OutputKind:
        """``OutputKind.TEXT``: every output carries text."""
        return OutputKind.TEXT

    def generate(self, request: GenerateRequest) -> SequenceOutputs[TextOutput]:
        """Queue ``request``; its outputs are ``TextOutput``, one per step.

        Raises:
            EngineUnavailable, EngineError: as ``ScriptedEngine.generate``.
        """
        tokens = self._tokens.generate(request)
        assert isinstance(tokens, SequenceOutputs), "the scripted engine's own"
        texts = SequenceOutputs[TextOutput](tokens.close)
        tokenizer = self._tokens.tokenizer
        detokenizer = IncrementalDetokenizer(tokenizer.pieces, tokenizer.special_ids)

        def relay(item: OutputItem) -> None:
            if isinstance(item, EngineOutput):
                text = detokenizer.feed(item.token_ids)
                if item.finish_reason is not None:
                    text += detokenizer.flush()
                texts.push(TextOutput(text, item.finish_reason, len(item.token_ids)))
            elif item is None:
                texts.end()
            elif not isinstance(item, TextOutput):
                texts.fail(item)

        tokens.listen(relay)
        return texts

    def abort(self, request_id: str) -> None:
        """As ``ScriptedEngine.abort``."""
        self._tokens.abort(request_id)

    def stats(self) -> EngineStats:
        """As ``ScriptedEngine.stats``."""
        return self._tokens.stats()

    async def aclose(self) -> None:
        """As ``ScriptedEngine.aclose``."""
        await self._tokens.aclose()
