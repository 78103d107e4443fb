"""The engine protocols, by what an engine yields: token ids or text deltas.

An engine serves ``GenerateRequest``s. ``generate()`` returns an async iterator of
one sequence's outputs, one per decode step; the last carries the
``finish_reason``. A failure is raised from the iterator as ``EngineError``.
``abort()`` is synchronous, idempotent and never blocks: it removes the request from
the queue, from prefill or from the running batch at the next step, and frees its KV
cells. The engine never waits on a consumer: outputs go into per-request buffers.

An engine follows one of two protocols, by what its outputs carry:
``TokenEngine`` yields ``EngineOutput`` (token ids, which the server
detokenizes: llama.cpp, the scripted engine) and ``TextEngine`` yields
``TextOutput`` (text deltas: an upstream OpenAI-compatible server, for which
the server does no token work). ``Engine`` is either; its ``output_kind`` is the
tag that tells them apart and narrows the type. What an engine can do beyond
its protocol (grammars, logprobs, a pool of upstreams, how its outputs are
delivered and accepted) it declares in ``capabilities``: the server never
probes an engine's attributes, nor those of its outputs.

- How outputs are delivered: any async iterator with ``aclose()``
  (``ClosableOutputs``: an async generator will do) is read by a task; with
  ``Capabilities.listenable`` they are ``ListenableOutputs`` instead, which hand
  each item to a listener in the engine's own callback, with no task in between
  (``SequenceOutputs`` in ``outputs.py`` is one).
- When a sequence is accepted: at ``generate()`` (which raises at once when it
  cannot take it), or, with ``Capabilities.late_acceptance``, when the outputs'
  ``accepted()`` returns (they are ``AcceptingOutputs``: an upstream server
  answers with a status first); the server sends its status line only after
  that.

A ``TextEngine`` gets its prompt as ``GenerateRequest.text_prompt`` (messages
or a completions prompt, in the API's terms) and counts the prompt's tokens
itself (``TextOutput.prompt_tokens``).
``TokenEngineBase`` is what the token engines here share, written once.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Mapping
from enum import StrEnum
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

from sluicegate.core.decoding.choice_setup import Vocabulary
from sluicegate.core.decoding.response import OutputItem
from sluicegate.core.events import EngineOutput, TextOutput, Usage
from sluicegate.engines.pool_values import UpstreamCounters
from sluicegate.engines.values import (
    Capabilities,
    EngineStats,
    GenerateRequest,
    Grammar,
    ModelInfo,
    SamplingParams,
    TextPrompt,
)

__all__ = [
    "AcceptingOutputs",
    "Capabilities",
    "ClosableOutputs",
    "Engine",
    "EngineStats",
    "GenerateRequest",
    "Grammar",
    "ListenableOutputs",
    "ModelInfo",
    "OutputItem",
    "OutputKind",
    "OutputListener",
    "SamplingParams",
    "StartingEngine",
    "TextEngine",
    "TextPrompt",
    "TokenEngine",
    "TokenEngineBase",
    "Tokenizer",
]


class OutputKind(StrEnum):
    """What an engine's outputs carry."""

    TOKENS = "tokens"
    """``EngineOutput``: token ids, which the server detokenizes."""
    TEXT = "text"
    """``TextOutput``: text, already detokenized (an upstream server)."""


OutputListener = Callable[[OutputItem], None]
"""Called synchronously, on the event loop, once per item: an output, the
sequence's ``EngineError``, or ``None`` when it ended without a finish reason
(it was aborted)."""


class ClosableOutputs(Protocol):
    """Outputs read by a task (not ``Capabilities.listenable``): the server
    calls ``aclose()`` once it stops reading them, whether or not they ended."""

    async def aclose(self) -> None:
        """Stop the sequence if it runs; later iteration ends."""
        ...


class ListenableOutputs(Protocol):
    """Outputs that can be listened to, besides being iterated.

    The delivery contract of a listener: every item is handed to it
    synchronously, in order, on the event loop, and it is never re-entered (what
    the engine produces while it runs is handed over after it returns). Nothing
    follows the output with a ``finish_reason``, an ``EngineError`` or ``None``.
    """

    def listen(self, listener: OutputListener) -> None:
        """Hand every item to ``listener`` from now on, queued ones first.

        Raises:
            RuntimeError: already listened to, or closed.
        """
        ...

    def close(self) -> None:
        """Stop consuming: drop later items; abort the sequence if it runs."""
        ...


class AcceptingOutputs(Protocol):
    """Outputs whose engine may still refuse the sequence after ``generate``.

    An upstream server answers with a status before its stream: the server
    awaits ``accepted()`` of every choice before it sends its own status line,
    so that a refusal is that status, not a 200 followed by an error.
    """

    async def accepted(self) -> Usage | None:
        """Return once the engine has accepted the sequence (its stream began):
        its usage so far when the engine knows it by then (an upstream's
        continuous usage: the prompt's tokens and their cached part), else
        ``None``.

        Raises:
            EngineRefused: refused with a status of its own (e.g. an upstream's
                429 with ``Retry-After``, or its 400 for a prompt too long).
            EngineUnavailable: no engine could take it (503).
            EngineError: any other failure before the stream began.
        """
        ...

    async def responded(self) -> None:
        """Return once the engine began to answer (an upstream's 200 status
        line), which may be long before ``accepted()`` (its prefill); never
        returns for a sequence refused before that."""
        ...

    @property
    def usage(self) -> Usage | None:
        """The sequence's usage as the engine said it so far (an upstream's
        continuous usage may come before its first content), else ``None``."""
        ...


class Tokenizer(Vocabulary, Protocol):
    """Text <-> token ids for one vocabulary; pieces are byte strings.

    The pieces, special ids and stop ids are the core's ``Vocabulary``.
    """

    @property
    def chat_template(self) -> str | None:
        """The model's own Jinja chat template, if it ships one."""
        ...

    @property
    def bos_token(self) -> str:
        """Text of the beginning-of-sequence token ("" if none)."""
        ...

    @property
    def eos_token(self) -> str:
        """Text of the end-of-sequence token ("" if none)."""
        ...

    def encode(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids of ``text``; ``add_special`` prepends BOS where the model does."""
        ...


@runtime_checkable
class StartingEngine(Protocol):
    """An engine with work to start on the server's event loop before the
    first request (the engine process's link: ``engines/remote/engine.py``);
    the app awaits ``start`` as it starts serving."""

    async def start(self) -> None:
        """Start; failures are the engine's to report (``stats().unavailable``)."""
        ...


class _EngineBase(Protocol):
    """What every engine has, whatever its outputs carry."""

    @property
    def model(self) -> ModelInfo:
        """The served model."""
        ...

    @property
    def capabilities(self) -> Capabilities:
        """What it can do beyond the protocol; constant over its life."""
        ...

    def abort(self, request_id: str, *, stopped: bool = False) -> None:
        """Stop ``request_id`` at the next step and free its KV cells; idempotent.

        Args:
            stopped: the server ended the request itself (a stop string
                matched): counted as finished in ``stats()``, not aborted, and
                not among ``aborted_ids``.
        """
        ...

    def stats(self) -> EngineStats:
        """A snapshot of load and counters."""
        ...

    async def aclose(self) -> None:
        """Abort everything, free the model; later ``generate`` calls fail."""
        ...


class TokenEngine(_EngineBase, Protocol):
    """An engine of token ids (llama.cpp, the scripted engine).

    It takes the prompt as token ids (``GenerateRequest.prompt_token_ids``) and
    yields ``EngineOutput``: the server renders chat templates with its
    ``tokenizer``, counts the prompt, detokenizes, aligns logprobs and matches
    stop strings.
    """

    @property
    def output_kind(self) -> Literal[OutputKind.TOKENS]:
        """``OutputKind.TOKENS``: the tag that tells the two protocols apart."""
        ...

    @property
    def tokenizer(self) -> Tokenizer:
        """The served model's tokenizer."""
        ...

    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineOutput]:
        """Queue ``request`` and yield its outputs step by step.

        The outputs may also be ``ListenableOutputs``.

        Raises:
            EngineError: from the iterator, when the engine fails this request.
            EngineUnavailable: at once, when the queue is full or the engine closed.
        """
        ...

    def compile_grammar(self, grammar: Grammar) -> None:
        """Compile ``grammar`` for this engine's vocabulary now, blocking the
        calling thread (seconds for a large schema), so that the request's first
        step finds it compiled; the server calls it off the event loop, and only
        when ``capabilities.grammars``. One that does not compile is left for
        the request to fail as it would have. Never raises for a bad grammar."""
        ...


class TextEngine(_EngineBase, Protocol):
    """An engine of text deltas (an upstream OpenAI-compatible server).

    It takes the prompt in the API's terms (``GenerateRequest.text_prompt``),
    applies its own chat template and tokenizer, and yields ``TextOutput``: the
    server does no token work for it, and the last output of a sequence counts
    the prompt's tokens (``TextOutput.prompt_tokens``). Its outputs may also be
    ``AcceptingOutputs`` (a refusal with a status of its own before the stream)
    and ``ListenableOutputs``.
    """

    @property
    def output_kind(self) -> Literal[OutputKind.TEXT]:
        """``OutputKind.TEXT``: the tag that tells the two protocols apart."""
        ...

    def generate(self, request: GenerateRequest) -> AsyncIterator[TextOutput]:
        """Start ``request`` and yield its outputs as text arrives.

        Raises:
            EngineError: from the iterator (or ``accepted()``), when the engine
                fails this request.
            EngineUnavailable: at once, when the engine is closed.
        """
        ...

    def upstream_counters(self) -> list[UpstreamCounters]:
        """Each upstream's state and counters (``[]`` without
        ``capabilities.upstreams``, or before the first request)."""
        ...

    async def count_prompt(
        self,
        request: GenerateRequest,
        messages_body: Mapping[str, Any],
        *,
        estimate: bool = False,
    ) -> int | None:
        """``request``'s prompt tokens, or ``None`` when no counter answers
        (always, without ``capabilities.counts_prompts``); ``messages_body`` is
        the client's Messages body, where one counter takes it as it is. With
        ``estimate``, an engine that can estimate the count gives its estimate
        instead of ``None``."""
        ...


Engine = TokenEngine | TextEngine
"""Any engine; ``output_kind`` tells which protocol it follows (and narrows the
type), so the server chooses its decoding stage from it."""


_T = TypeVar("_T", bound=Tokenizer)
_O = TypeVar("_O")


class TokenEngineBase(abc.ABC, Generic[_T, _O]):
    """What the ``TokenEngine``s here share (llama.cpp, scripted, remote): the
    protocol's properties, outputs that abort their sequence when closed early
    (``_open``), and the ids a request's sampling stops on (``_stop_ids``). Each
    subclass keeps its own queue, admission and ``abort``.

    Args:
        model: the served model.
        tokenizer: its vocabulary.
        capabilities: what the engine declares beyond the protocol.
        outputs: makes one sequence's outputs from the callback that aborts
            it (``SequenceOutputs``, ``outputs.py``, or a subclass).
    """

    def __init__(
        self,
        model: ModelInfo,
        tokenizer: _T,
        capabilities: Capabilities,
        outputs: Callable[[Callable[[], None]], _O],
    ) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._capabilities = capabilities
        self._outputs = outputs

    @property
    def model(self) -> ModelInfo:
        """The served model: id, context length (tokens), created (Unix seconds)."""
        return self._model

    @property
    def tokenizer(self) -> _T:
        """The model's vocabulary."""
        return self._tokenizer

    @property
    def output_kind(self) -> Literal[OutputKind.TOKENS]:
        """``OutputKind.TOKENS``: a ``TokenEngine``."""
        return OutputKind.TOKENS

    @property
    def capabilities(self) -> Capabilities:
        """What this engine declares beyond the protocol (its module says why)."""
        return self._capabilities

    @abc.abstractmethod
    def abort(self, request_id: str, *, stopped: bool = False) -> None:
        """Stop ``request_id`` at the next step (``TokenEngine.abort``)."""

    def _open(self, request_id: str) -> _O:
        """New outputs for ``request_id``: closing them before the sequence
        ended aborts it (``abort(request_id)``)."""
        return self._outputs(lambda: self.abort(request_id))

    def _stop_ids(self, params: SamplingParams) -> frozenset[int]:
        """The token ids that end a sequence of ``params``: its
        ``stop_token_ids``, and the vocabulary's stop ids unless ``ignore_eos``."""
        if params.ignore_eos:
            return params.stop_token_ids
        return params.stop_token_ids | self._tokenizer.stop_ids
