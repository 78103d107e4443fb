"""Request -> ``Plan`` for an engine that takes text: prompts and settings as sent.

An upstream server has its own template, tokenizer and context window, so it
gets no token work at all: each prompt goes to it in the API's terms
(``TextPrompt``), ``max_tokens`` is the client's (or the configured default),
the sampling fields the client set are forwarded as set, and ``tools``,
``tool_choice``, ``parallel_tool_calls``, ``response_format``,
``chat_template_kwargs`` and ``reasoning_effort`` go as the client set them (it
constrains and parses the calls itself, and splits its own reasoning), and a
reasoning budget goes under vLLM's and llama.cpp's names, and is enforced here
too (the reasoning cut at the budget). With
``serve --reasoning-parser NAME`` (not ``auto``) the upstream's plain content is
split here at that family's markers, for an upstream without a parser.
``logprobs`` are asked of the upstream in the API's own fields. What needs the
model's vocabulary (``stop_token_ids``, the echo of a token-id prompt) is
refused with a 400.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sluicegate.core.decoding.deltas import ANY_CALLS, CallTerms
from sluicegate.core.decoding.reasoning_choice import request_reasoning
from sluicegate.core.decoding.reasoning_parsers import reasoning_parser
from sluicegate.core.errors import RequestError
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.engines.base import Engine, TextPrompt
from sluicegate.server.config import ServerConfig
from sluicegate.server.prepare.plan import Plan, plan_of, sampling_params
from sluicegate.server.schemas.chat import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
)

__all__ = ["text_chat_plan", "text_completion_plan"]


def text_chat_plan(
    request: ChatCompletionRequest,
    response_id: str,
    engine: Engine,
    config: ServerConfig,
    model: str,
) -> Plan:
    """The plan of a chat request for an engine that takes text: its messages.

    Raises:
        RequestError: 400: ``stop_token_ids`` asked for.
    """
    messages = tuple(_message_json(m) for m in request.messages)
    text = TextPrompt(
        Endpoint.CHAT,
        messages,
        stop=tuple(request.stop),
        extra=_constraint_fields(request),
        tool_names=frozenset(t.function.name for t in request.tools or ()),
    )
    plan = _text_plan(request, response_id, engine, config, model, [text], [""])
    # Held here too, whatever the upstream does with the calls and the budget.
    plan = dataclasses.replace(
        plan,
        calls=_call_terms(request),
        reasoning_budget=request.thinking_token_budget,
    )
    if config.reasoning_parser == "auto":
        return plan  # the upstream splits its own reasoning, if it does
    # Named on the command line: the upstream writes its markers into plain
    # content (no parser of its own), and they are split here. Its prompt is
    # not seen, so the request's thinking option or the parser decides.
    parser = reasoning_parser(config.reasoning_parser)
    reasoning = request_reasoning(parser, "", thinking=request.thinking)
    return dataclasses.replace(plan, reasoning=reasoning)


def _call_terms(request: ChatCompletionRequest) -> CallTerms:
    """The calls ``tool_choice`` and ``parallel_tool_calls`` let each choice
    make (a mode, or one named function: ``NamedToolChoice``, the only object
    ``tool_choice`` takes); without ``tools``, none are checked."""
    choice = request.tool_choice
    if not request.tools:
        return ANY_CALLS
    if choice == "none":
        return CallTerms(most=0)
    name = None if choice is None or isinstance(choice, str) else choice.function.name
    most = 1 if name is not None or not request.parallel_tool_calls else None
    return CallTerms(most, required=name is not None or choice == "required", name=name)


def _message_json(message: ChatMessage) -> dict[str, Any]:
    """A validated message as the OpenAI API writes it: unset fields left out."""
    fields = message.model_dump(mode="json", exclude_none=True)
    return {name: value for name, value in fields.items() if value != []}


def _constraint_fields(request: ChatCompletionRequest) -> dict[str, Any]:
    """Tools and the response format as the client set them (validated), for an
    engine that constrains and parses its output itself."""
    fields: dict[str, Any] = {}
    if request.tools:
        fields["tools"] = [
            tool.model_dump(mode="json", exclude_none=True) for tool in request.tools
        ]
    choice = request.tool_choice
    if choice is not None:
        fields["tool_choice"] = (
            choice if isinstance(choice, str) else choice.model_dump(mode="json")
        )
    if "parallel_tool_calls" in request.model_fields_set:
        fields["parallel_tool_calls"] = request.parallel_tool_calls
    # The thinking switches, so that an upstream with a reasoning parser reasons
    # (or not) as asked; its reasoning comes back as delta.reasoning_content.
    if request.chat_template_kwargs:
        fields["chat_template_kwargs"] = dict(request.chat_template_kwargs)
    if request.reasoning_effort is not None:
        fields["reasoning_effort"] = request.reasoning_effort
    if request.thinking_token_budget is not None:
        # The budget under the name each server that enforces one reads: vLLM
        # (and sluicegate) ``thinking_token_budget``, llama.cpp's server
        # ``thinking_budget_tokens``; each ignores the other's.
        fields["thinking_token_budget"] = request.thinking_token_budget
        fields["thinking_budget_tokens"] = request.thinking_token_budget
    if request.response_format is not None:
        fields["response_format"] = request.response_format.model_dump(
            mode="json", by_alias=True, exclude_none=True
        )
    return fields


def text_completion_plan(
    request: CompletionRequest,
    response_id: str,
    engine: Engine,
    config: ServerConfig,
    model: str,
) -> Plan:
    """The plan of a completions request for an engine that takes text.

    Raises:
        RequestError: 400: the echo of a token-id prompt or ``stop_token_ids``
            asked for.
    """
    texts: list[TextPrompt] = []
    echoes: list[str] = []
    for i, prompt in enumerate(request.prompts):
        if request.echo and not isinstance(prompt, str):
            param = "prompt" if len(request.prompts) == 1 else f"prompt[{i}]"
            raise RequestError(
                "echo of a token-id prompt needs the model's tokenizer, which this "
                "model's engine (an upstream server) does not share",
                param=param,
            )
        one = prompt if isinstance(prompt, str) else tuple(prompt)
        texts.append(
            TextPrompt(Endpoint.COMPLETION, prompt=one, stop=tuple(request.stop))
        )
        echoes.append(prompt if request.echo and isinstance(prompt, str) else "")
    return _text_plan(request, response_id, engine, config, model, texts, echoes)


def _text_plan(
    request: ChatCompletionRequest | CompletionRequest,
    response_id: str,
    engine: Engine,
    config: ServerConfig,
    model: str,
    texts: list[TextPrompt],
    echoes: list[str],
) -> Plan:
    if request.stop_token_ids:
        raise RequestError(
            "stop_token_ids need the model's vocabulary, which this model's engine "
            "(an upstream server) does not share",
            param="stop_token_ids",
        )
    requested = request.requested_max_tokens
    max_tokens = requested if requested is not None else config.default_max_tokens
    # What the client set, as it set it: an upstream's own defaults (a model's
    # generation config) stand for the rest.
    sampling = {
        name: getattr(request, name)
        for name in _FORWARDED_SAMPLING
        if name in request.model_fields_set
    }
    sampling |= _logprob_fields(request)
    texts = [
        dataclasses.replace(t, max_tokens=max_tokens, extra={**t.extra, **sampling})
        for t in texts
    ]
    # Without a tokenizer the window is the upstream's to enforce; the bound
    # here is for quotas only.
    params = sampling_params(
        request, max_tokens or engine.model.context_length, vocab_size=None
    )
    plan = plan_of(request, response_id, model, [[] for _ in texts], echoes, params)
    return dataclasses.replace(plan, text_prompts=tuple(texts))


def _logprob_fields(
    request: ChatCompletionRequest | CompletionRequest,
) -> dict[str, Any]:
    """The logprobs the client asked for, in the API's own fields, for the
    upstream to report (an engine that cannot is refused by ``Generation``)."""
    k = request.top_logprobs_k
    if k is None:
        return {}
    if isinstance(request, ChatCompletionRequest):
        return {"logprobs": True, "top_logprobs": k}
    return {"logprobs": k}


_FORWARDED_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "logit_bias",
)
"""Sampling fields an engine that takes text gets as the client set them (the
``seed``, offset per choice, goes in ``SamplingParams``)."""
