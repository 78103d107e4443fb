"""The engine protocol: a request in, one sequence's outputs out.

An engine serves ``GenerateRequest``s. ``generate()`` returns an async iterator of
one sequence's outputs, one per decode step; the last carries the
``finish_reason``. A failure is raised from the iterator as ``EngineError``.
``abort()`` is synchronous, idempotent and never blocks: it removes the request from
the queue, from prefill or from the running batch at the next step, and frees its KV
cells. The engine never waits on a consumer: outputs go into per-request buffers.

Two parts of the contract are declared, not guessed:

- What an output is (``Engine.output_kind``): ``TOKENS`` engines yield
  ``EngineOutput`` (token ids, detokenized by the server); ``TEXT`` engines (an
  upstream OpenAI-compatible server) yield ``TextOutput`` (text), and the server
  does no token work for them.
- How outputs are delivered: any async iterator will do, read by a task; one
  that is also ``ListenableOutputs`` hands each item to a listener in the
  engine's own callback instead, with no task in between (``SequenceOutputs`` in
  ``outputs.py`` is one).
- When a sequence is accepted: at ``generate()`` (which raises at once when it
  cannot take it), or, for outputs that are also ``AcceptingOutputs`` (an
  upstream server, which answers with a status first), when ``accepted()``
  returns; the server sends its status line only after that.

A ``TEXT`` engine gets its prompt as ``GenerateRequest.text_prompt`` (messages
or a completions prompt, in the API's terms) and counts the prompt's tokens
itself (``TextOutput.prompt_tokens``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from sluicegate.core.choice_setup import Vocabulary
from sluicegate.core.chunks import Endpoint
from sluicegate.core.decoding import OutputItem
from sluicegate.core.events import EngineOutput, TextOutput, Usage

__all__ = [
    "AcceptingOutputs",
    "CountsPrompts",
    "Engine",
    "EngineStats",
    "GenerateRequest",
    "Grammar",
    "GrammarCompiling",
    "ListenableOutputs",
    "ModelInfo",
    "OutputItem",
    "OutputKind",
    "OutputListener",
    "SamplingParams",
    "TextPrompt",
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


@runtime_checkable
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


@dataclass(frozen=True, slots=True)
class Grammar:
    """A constraint on one sequence's output text, for constrained decoding.

    Attributes:
        text: the grammar in llguidance's Lark dialect: the root rule is
            ``start``, and ``%json {...}`` embeds a JSON schema.
        triggers: for a lazy grammar, the literal texts that begin its
            constrained part (text before the first one is free; the grammar
            text itself says so with a ``[lazy]`` rule); ``()`` when the whole
            output is constrained.
    """

    text: str
    triggers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one sequence.

    Attributes:
        max_tokens: most completion tokens to generate (tokens, >= 1).
        temperature: 0 means greedy.
        top_p: nucleus mass in (0, 1].
        top_k: keep the k most likely tokens; 0 disables.
        min_p: drop tokens below ``min_p`` x the top probability; 0 disables.
        seed: sampling seed; ``None`` picks one at random.
        presence_penalty, frequency_penalty: OpenAI penalties in [-2, 2].
        repetition_penalty: multiplicative penalty; 1 disables.
        stop_token_ids: extra token ids that end the sequence (never in content).
        ignore_eos: keep generating past end-of-sequence tokens.
        logit_bias: token id -> bias added to its logit.
        logprobs: ``None`` for no logprobs; k >= 0 for the sampled token's
            logprob plus its k most likely alternatives.
        grammar: a constraint the sequence's text must match (``None``: free
            text); an engine that cannot enforce one ignores it.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    grammar: Grammar | None = None


@dataclass(frozen=True, slots=True)
class TextPrompt:
    """The prompt of one sequence for an engine that takes text (``OutputKind.TEXT``).

    Such an engine (an upstream OpenAI-compatible server) applies its own chat
    template and tokenizer, so the server hands it the request in the API's own
    terms instead of token ids.

    Attributes:
        endpoint: which API the prompt is for (chat or completions).
        messages: chat: the validated messages, as JSON objects in the OpenAI
            shape; ``()`` for completions.
        prompt: completions: one prompt, text or token ids; ``""`` for chat.
        stop: stop strings; the engine may pass them on (the server still
            matches them itself on the text it receives).
        max_tokens: what the client asked for (or the server's default); ``None``:
            the engine's own limit. ``GenerateRequest.params.max_tokens`` is
            then only the bound quotas reserve.
        extra: other request fields to pass on unchanged (JSON values), such as
            ``tools`` or ``response_format``.
        tool_names: the names of the tools the client offered (chat); a call
            the engine's model makes to any other is an error, never passed on.
    """

    endpoint: Endpoint
    messages: tuple[Mapping[str, Any], ...] = ()
    prompt: str | tuple[int, ...] = ""
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    tool_names: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One sequence to generate: an id unique among running requests, the prompt.

    Attributes:
        request_id: unique among the engine's running requests.
        prompt_token_ids: the prompt, tokenized (tokens); ``()`` for an engine
            of ``OutputKind.TEXT``, which gets ``text_prompt`` instead.
        params: how to sample.
        text_prompt: the prompt in the API's terms, for an engine of
            ``OutputKind.TEXT``; ``None`` for one that takes token ids.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    text_prompt: TextPrompt | None = None


class GrammarCompiling(Protocol):
    """An engine that compiles grammars for its vocabulary, and can do it ahead.

    The server's schema worker calls ``compile_grammar`` off the event loop
    before the request is submitted: an engine that would otherwise compile on
    the request's first step (the llama.cpp worker, for every sequence of the
    batch) finds the grammar compiled.
    """

    def compile_grammar(self, grammar: Grammar) -> None:
        """Compile ``grammar`` now, blocking the calling thread (seconds for a
        large schema); one that does not compile is left for the request to
        fail as it would have. Never raises for a bad grammar."""
        ...


@runtime_checkable
class CountsPrompts(Protocol):
    """An engine that takes text and counts a prompt's tokens with its own
    tokenizer (an upstream's tokenize endpoint)."""

    async def count_prompt(
        self, request: GenerateRequest, messages_body: Mapping[str, Any]
    ) -> int | None:
        """``request``'s prompt tokens, or ``None`` when no counter answers;
        ``messages_body`` is the client's Messages body, where one counter
        takes it as it is."""
        ...


@runtime_checkable
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


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's load and counters.

    Units: requests for ``queued``/``running``/``*_requests``, tokens (KV cells) for
    ``kv_cells_*``, tokens for ``*_tokens``; ``steps`` counts decode steps and
    ``step_time_s`` is their total wall time in seconds; ``last_step_tokens`` is
    the batch size (tokens) of the latest step. ``failure`` is ``None`` while the
    engine serves, and otherwise says why it stopped for good (its worker died):
    a server that sees it should exit. ``submit_limit`` is how many sequences an
    idle engine accepts at once before ``generate`` raises ``EngineUnavailable``
    (its queue, plus the slots a sequence starts in at submission; ``None``: no
    such bound): a request with more choices can never be admitted.
    """

    queued: int
    running: int
    kv_cells_used: int
    kv_cells_total: int
    prompt_tokens: int
    generated_tokens: int
    wasted_tokens: int
    finished_requests: int
    aborted_requests: int
    failed_requests: int
    running_ids: tuple[str, ...] = ()
    aborted_ids: tuple[str, ...] = field(default=())
    steps: int = 0
    step_time_s: float = 0.0
    last_step_tokens: int = 0
    failure: str | None = None
    submit_limit: int | None = None


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the server needs to know about the served model."""

    id: str
    context_length: int
    created: int
    owned_by: str = "sluicegate"


@runtime_checkable
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


class Engine(Protocol):
    """What sluicegate needs from an inference engine."""

    @property
    def output_kind(self) -> OutputKind:
        """What ``generate``'s outputs carry: token ids or text."""
        ...

    @property
    def model(self) -> ModelInfo:
        """The served model."""
        ...

    @property
    def tokenizer(self) -> Tokenizer:
        """The served model's tokenizer."""
        ...

    def generate(
        self, request: GenerateRequest
    ) -> AsyncIterator[EngineOutput] | AsyncIterator[TextOutput]:
        """Queue ``request`` and yield its outputs step by step.

        The outputs are ``EngineOutput`` or ``TextOutput``, as ``output_kind``
        says; they may also be ``ListenableOutputs``.

        Raises:
            EngineError: from the iterator, when the engine fails this request.
            EngineUnavailable: at once, when the queue is full or the engine closed.
        """
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
