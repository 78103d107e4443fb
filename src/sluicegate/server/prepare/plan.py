"""``Plan``: what the engines are asked for, and how a checked request fills it in.

``Plan`` and ``ChoicePlan`` are the frozen result of ``server/prepare/tokens.py``;
``plan_of`` builds one from a request whose prompts and ``max_tokens`` are
settled, ``sampling_params`` the sampling every choice shares (choice ``i`` of a
prompt gets ``seed + i``), checking token ids against the vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from dataclasses import dataclass

from sluicegate import __version__
from sluicegate.core.decoding.deltas import ANY_CALLS, CallTerms
from sluicegate.core.decoding.reasoning_budget import ReasoningBudget
from sluicegate.core.decoding.reasoning_parsers import ReasoningParser
from sluicegate.core.decoding.tooldecoder import ToolCallOptions
from sluicegate.core.errors import RequestError
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.engines.base import GenerateRequest, SamplingParams, TextPrompt
from sluicegate.server.schemas.chat import ChatCompletionRequest, CompletionRequest

__all__ = [
    "ChoicePlan",
    "Plan",
    "checked_ids",
    "plan_of",
    "sampling_params",
    "system_fingerprint",
    "with_reasoning",
]


@dataclass(frozen=True, slots=True)
class ChoicePlan:
    """One choice of a response: its prompt, its sampling, and what it echoes.

    Attributes:
        prompt_index: which of ``Plan.prompts`` this choice continues.
        params: sampling for this choice (``seed`` already offset per choice).
        echo: text sent before the completion (completions ``echo``), else ``""``.
    """

    prompt_index: int
    params: SamplingParams
    echo: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    """What to ask the engine for, and what every chunk of the answer shares.

    Choices are indexed prompt-major, as the OpenAI API does for a batch of
    prompts: the ``n`` choices of ``prompts[0]`` first, then those of
    ``prompts[1]``, and so on; ``header.n`` counts them all.

    Attributes:
        header: id, created, model name, endpoint, ``n`` and usage options.
        prompts: each prompt, tokenized (tokens, never empty); one for chat.
            For an engine that takes text, ``()`` per prompt.
        text_prompts: for an engine that takes text, each prompt in the API's
            terms, in the order of ``prompts``; ``()`` otherwise.
        choices: one ``ChoicePlan`` per choice, in index order.
        stops: stop strings (matched on text by the server, not the engine).
        stream: whether to answer with an event stream.
        include_stop_str_in_output: end the text with the matched stop string.
        skip_special_tokens: keep control tokens out of the text (the token that
            ended a choice stays out either way).
        logprobs: alternatives per token to report (k), or ``None`` for none.
        continuous_usage: put the usage so far on every chunk.
        tools: the functions each choice's text may call (parsed into
            ``tool_calls``), or ``None`` for plain text.
        resumable: ``stream_options.resumable`` (``None``: the server's default).
        obfuscation: pad the stream's events (``include_obfuscation``);
            ``None``: the server's default.
        cadence_s: send the stream's events on a clock of this period
            (seconds, 0: off); ``None``: the server's default.
        stream_interval: write the stream's content every this many tokens
            (``stream_options.stream_interval``); ``None``: the server's
            default.
        background: a resumable stream that keeps generating with no reader for
            as long as it runs (the Responses API's ``background``), instead of
            for the grace period.
        whole: a resumable stream whose client is answered one JSON object once
            the log ends (a stored, non-streamed Responses request): its ledger
            row has the status of that answer (500 for an errored stream, 499
            when its client left before it).
        reasoning: the markers each choice's text is split at into reasoning
            and content, ``starts_inside`` decided for this request
            (``core.reasoning_choice.request_reasoning``); ``None``: no
            reasoning channel.
        reasoning_budget: the most tokens each choice's reasoning may take
            before the server ends its reasoning channel
            (``thinking_token_budget``); ``None``: no budget, or one the
            engine enforces itself (``with_reasoning``).
        calls: for an engine that takes text, the calls each choice may and
            must bring back (``tool_choice``, ``parallel_tool_calls``), held by
            the server whatever the engine did (``CallRule``): cut after the
            most (before the first: a plain answer); one that had to call, or
            to call the named function, and did not is an in-band error. The
            default: no limit (the local engine's grammar holds its own).
    """

    header: ResponseHeader
    prompts: tuple[tuple[int, ...], ...]
    choices: tuple[ChoicePlan, ...]
    stops: tuple[str, ...] = ()
    stream: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    continuous_usage: bool = False
    text_prompts: tuple[TextPrompt, ...] = ()
    tools: ToolCallOptions | None = None
    resumable: bool | None = None
    obfuscation: bool | None = None
    cadence_s: float | None = None
    stream_interval: int | None = None
    background: bool = False
    whole: bool = False
    reasoning: ReasoningParser | None = None
    reasoning_budget: int | None = None
    calls: CallTerms = ANY_CALLS

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of the response: every prompt counted once (tokens);
        0 for an engine that takes text (it counts them itself)."""
        return sum(len(p) for p in self.prompts)

    @property
    def reserve_tokens(self) -> int:
        """Tokens the response may use at most, for quotas: the prompts (for an
        engine that takes text, a bound from their length: one token per UTF-8
        byte) plus every choice's ``max_tokens``."""
        prompt = self.prompt_tokens + sum(_prompt_bytes(t) for t in self.text_prompts)
        return prompt + sum(c.params.max_tokens for c in self.choices)

    @property
    def sequence_ids(self) -> list[str]:
        """Engine request ids, one per choice: ``"<response id>-<index>"``."""
        return [f"{self.header.id}-{i}" for i in range(len(self.choices))]

    def requests(self) -> list[GenerateRequest]:
        """One ``GenerateRequest`` per choice, in index order."""
        texts = self.text_prompts
        return [
            GenerateRequest(
                sid,
                self.prompts[c.prompt_index],
                c.params,
                texts[c.prompt_index] if texts else None,
            )
            for sid, c in zip(self.sequence_ids, self.choices, strict=True)
        ]


def _prompt_bytes(prompt: TextPrompt) -> int:
    if not isinstance(prompt.prompt, str):
        return len(prompt.prompt)
    text = sum(len(str(m.get("content") or "").encode()) for m in prompt.messages)
    return max(1, text + len(prompt.prompt.encode()))


@functools.lru_cache(maxsize=16)  # one served model: hashed once, not per request
def system_fingerprint(model: str) -> str:
    """``fp_`` and 12 hex digits naming this server version and ``model``.

    The same on every chunk and response of one server build serving one model,
    so clients can tell when the backend changed (what the field is for).

    Spec: OpenAI API reference, "The chat completion object",
    ``system_fingerprint``.
    """
    digest = hashlib.sha256(f"sluicegate {__version__} {model}".encode())
    return f"fp_{digest.hexdigest()[:12]}"


def checked_ids(ids: list[int], vocab_size: int, param: str, what: str) -> list[int]:
    if not ids or (min(ids) >= 0 and max(ids) < vocab_size):  # in C, most requests
        return ids
    bad = next(i for i in ids if not 0 <= i < vocab_size)
    raise RequestError(
        f"Invalid value for '{param}': {what} must be in [0, {vocab_size}); got {bad}",
        param=param,
        code="invalid_value",
    )


def plan_of(
    request: ChatCompletionRequest | CompletionRequest,
    response_id: str,
    model: str,
    prompts: list[list[int]],
    echoes: list[str],
    params: SamplingParams,
) -> Plan:
    """The plan of ``request``: ``n`` choices per prompt, prompt-major."""
    chat = isinstance(request, ChatCompletionRequest)
    choices = tuple(
        ChoicePlan(p, _seeded(params, i), echoes[p])
        for p in range(len(prompts))
        for i in range(request.n)
    )
    header = ResponseHeader(
        id=response_id,
        created=int(time.time()),
        model=model,
        endpoint=Endpoint.CHAT if chat else Endpoint.COMPLETION,
        n=len(choices),
        include_usage=request.include_usage,
        system_fingerprint=system_fingerprint(model),
        continuous_usage=request.continuous_usage,
        prompt_tokens=sum(len(p) for p in prompts),
    )
    return Plan(
        header,
        tuple(tuple(p) for p in prompts),
        choices,
        stops=tuple(request.stop),
        stream=request.stream,
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=request.skip_special_tokens,
        logprobs=request.top_logprobs_k,
        continuous_usage=request.continuous_usage,
        resumable=request.resumable,
        obfuscation=request.include_obfuscation,
        cadence_s=request.cadence_s,
        stream_interval=request.stream_interval,
    )


def with_reasoning(
    plan: Plan,
    reasoning: ReasoningParser | None,
    budget_tokens: int | None,
    *,
    engine_enforces: bool,
) -> Plan:
    """``plan`` with a reasoning channel (``reasoning``; ``None``: unchanged)
    and its budget: given to each choice's ``SamplingParams.reasoning_budget``
    when the engine closes the reasoning itself (``engine_enforces``:
    ``Capabilities.reasoning_budgets``), else to ``Plan.reasoning_budget``, where
    the server ends the reasoning channel at that many tokens."""
    if reasoning is None:
        return plan
    if budget_tokens is None or not engine_enforces:
        return dataclasses.replace(
            plan, reasoning=reasoning, reasoning_budget=budget_tokens
        )
    budget = ReasoningBudget(reasoning, budget_tokens)
    choices = tuple(
        dataclasses.replace(
            c, params=dataclasses.replace(c.params, reasoning_budget=budget)
        )
        for c in plan.choices
    )
    return dataclasses.replace(plan, reasoning=reasoning, choices=choices)


def sampling_params(
    request: ChatCompletionRequest | CompletionRequest,
    max_tokens: int,
    vocab_size: int | None,
) -> SamplingParams:
    """``vocab_size``: token ids are checked against it; ``None`` (an engine
    that takes text, whose vocabulary is its own): passed on unchecked."""
    bias = request.logit_bias or {}
    stop_ids = request.stop_token_ids
    if vocab_size is not None:
        checked_ids([int(k) for k in bias], vocab_size, "logit_bias", "token ids")
        checked_ids(stop_ids, vocab_size, "stop_token_ids", "token ids")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=max(request.top_k, 0),
        min_p=request.min_p,
        seed=request.seed,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        repetition_penalty=request.repetition_penalty,
        stop_token_ids=frozenset(stop_ids),
        ignore_eos=request.ignore_eos,
        logit_bias=tuple(sorted((int(k), v) for k, v in bias.items())),
        logprobs=request.top_logprobs_k,
    )


def _seeded(params: SamplingParams, i: int) -> SamplingParams:
    # Choice i of a prompt samples with seed + i: the choices differ, and choice
    # 0 matches the same request with n=1.
    if params.seed is None or i == 0:
        return params
    return dataclasses.replace(params, seed=params.seed + i)
