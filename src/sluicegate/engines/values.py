"""The values of the engine protocol: what the server hands an engine, and reads back.

``GenerateRequest`` (one sequence: its prompt, as token ids or as a
``TextPrompt``, and its ``SamplingParams``, with an optional ``Grammar``),
``ModelInfo`` (the served model), ``Capabilities`` (what an engine declares it
can do beyond its protocol) and ``EngineStats`` (a snapshot of load and
counters). The protocols themselves are in ``base.py``, which re-exports these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluicegate.core.decoding.reasoning_budget import ReasoningBudget
from sluicegate.core.wire.chunks import Endpoint

__all__ = [
    "RECENT_IDS",
    "Capabilities",
    "EngineStats",
    "GenerateRequest",
    "Grammar",
    "ModelInfo",
    "SamplingParams",
    "TextPrompt",
]


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
        reasoning_budget: the reasoning's token budget and markers, for an
            engine that closes the reasoning at the budget
            (``Capabilities.reasoning_budgets``); others ignore it.
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
    reasoning_budget: ReasoningBudget | None = None


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


RECENT_IDS = 256
"""Aborted request ids an engine remembers for ``EngineStats.aborted_ids`` (the
newest)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What one engine can do beyond its protocol, declared by the engine.

    The server reads these instead of probing the engine's attributes.

    Attributes:
        grammars: it enforces ``SamplingParams.grammar``, and its
            ``compile_grammar`` compiles one ahead (llama.cpp); ``False``: it
            ignores grammars, and ``compile_grammar`` does nothing.
        logprobs: its outputs carry the logprobs ``SamplingParams.logprobs``
            asks for; ``False``: a request for logprobs is refused (400).
        upstreams: it serves from a pool of upstream servers, and
            ``upstream_counters()`` has a row per upstream; ``False``: always
            ``[]``.
        counts_prompts: its ``count_prompt`` counts a prompt's tokens with the
            model's own tokenizer (an upstream's tokenize endpoint); ``False``:
            it always answers ``None``.
        listenable: every ``generate`` returns ``ListenableOutputs``, which the
            server listens to; ``False``: ``ClosableOutputs``, read by a task.
        late_acceptance: every ``generate`` returns ``AcceptingOutputs``: the
            engine may still refuse the sequence, and the server awaits
            ``accepted()`` before its status line; ``False``: ``generate``
            accepts or raises.
        shared_stats: its ``stats()`` already count every worker's requests
            (an engine process that all workers share); ``False``: this
            process's only, summed over the workers of ``serve --workers``.
        reasoning_budgets: it enforces ``SamplingParams.reasoning_budget``: at
            the budget it forces the end marker into the sequence; ``False``:
            the server ends the reasoning channel at the budget itself.
        prefix_cache: it may read a prompt's start from cells an earlier
            sequence left (prefix reuse), said on the sequence's first output
            (``EngineOutput.cached_tokens``), and its outputs are
            ``SequenceOutputs``: the server may wait for that first output
            (``first()``) before an event that says the usage.
    """

    grammars: bool = False
    logprobs: bool = False
    upstreams: bool = False
    counts_prompts: bool = False
    listenable: bool = False
    late_acceptance: bool = False
    shared_stats: bool = False
    reasoning_budgets: bool = False
    prefix_cache: bool = False


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's load and counters.

    Units: requests for ``queued``/``running``/``*_requests``, tokens (KV cells) for
    ``kv_cells_*``, tokens for ``*_tokens``; ``steps`` counts decode steps and
    ``step_time_s`` is their total wall time in seconds; ``last_step_tokens`` is
    the batch size (tokens) of the latest step. ``failure`` is ``None`` while the
    engine serves, and otherwise says why it stopped for good (its worker died):
    a server that sees it should exit. ``unavailable`` is ``None`` while the
    engine takes requests, and otherwise says why it cannot for now but will
    again (its process is being restarted): the server is not ready meanwhile.
    ``submit_limit`` is how many sequences an
    idle engine accepts at once before ``generate`` raises ``EngineUnavailable``
    (its queue, plus the slots a sequence starts in at submission; ``None``: no
    such bound): a request with more choices can never be admitted.
    ``logprobs_unavailable_learnt`` names (``UpstreamConfig.name``) the
    upstreams a gateway learnt at run time to give no logprobs (one answered a
    request for them without any), whose requests for them it now refuses; it
    is held in memory only (a restart forgets it; each worker learns its own).
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
    unavailable: str | None = None
    logprobs_unavailable_learnt: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the server needs to know about the served model."""

    id: str
    context_length: int
    created: int
    owned_by: str = "sluicegate"
