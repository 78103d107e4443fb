"""Validated request -> ``Plan``: model, prompt ids, sampling, limits, all checked.

Everything that can be refused is refused here, before any byte of the response:
an unknown model (404), too many choices, an empty prompt, token ids outside the
vocabulary (in a prompt, ``logit_bias`` or ``stop_token_ids``), and a prompt plus
``max_tokens`` that does not fit the context window (400, naming the limit and the
values seen). A text prompt too long to fit at all is refused before it is
tokenized (``prompt_text.check_prompt_size``), so no request tokenizes megabytes
only to be refused, and a long one is tokenized in a worker thread
(``prompt_text.tokenize``), so the event loop keeps serving the other streams.

With a ``seed``, choice ``i`` of each prompt samples with ``seed + i``, so that the
``n`` choices differ while the whole response stays reproducible.

A ``TextEngine`` (text deltas: an upstream server) gets no
token work at all (``server/prepare/text.py``); it answers what does not fit
with its own status before the first byte, and its tool calls come back as
tool-call fragments (no ``Plan.tools``: no parser of the server's reads its
text). The plan types are in ``server/prepare/plan.py``.

Spec: docs/DESIGN.md, "Status first, errors in band"; OpenAI API reference,
"Create chat completion" (``max_completion_tokens``, ``n``).
"""

from __future__ import annotations

import dataclasses
import functools
import secrets

import anyio.to_thread

from sluicegate.core.decoding.reasoning_choice import request_reasoning
from sluicegate.core.errors import ModelNotFound, RequestError
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.engines.base import (
    Engine,
    Grammar,
    OutputKind,
    TokenEngine,
    Tokenizer,
)
from sluicegate.server.config import ServerConfig
from sluicegate.server.prepare.constraints import NO_TOOL_MARKUP, reasoning_grammar
from sluicegate.server.prepare.grammars import (
    TOOL_MARKUP_STOPS,
    checked_grammar,
    compile_ahead,
    shows_tool_markup,
)
from sluicegate.server.prepare.plan import (
    ChoicePlan,
    Plan,
    checked_ids,
    plan_of,
    sampling_params,
    system_fingerprint,
    with_reasoning,
)
from sluicegate.server.prepare.prompt_text import OFF_LOOP_CHARS, tokenize
from sluicegate.server.prepare.templates import ChatTemplate, text_prompt
from sluicegate.server.prepare.text import text_chat_plan, text_completion_plan
from sluicegate.server.prepare.tools import resolve_tools
from sluicegate.server.schemas.chat import ChatCompletionRequest, CompletionRequest

__all__ = [
    "ChoicePlan",
    "Plan",
    "admission_floor",
    "fit_max_tokens",
    "new_response_id",
    "plan_chat",
    "plan_completion",
    "resolve_model",
    "system_fingerprint",
]


def new_response_id(endpoint: Endpoint) -> str:
    """A fresh response id: ``chatcmpl-<32 hex>``, ``cmpl-<32 hex>``, ``resp_<32
    hex>`` (Responses) or ``msg_<32 hex>`` (Messages): 128 random bits, so that an
    id (which names a resumable stream) cannot be guessed."""
    return _ID_PREFIXES[endpoint] + secrets.token_hex(16)


_ID_PREFIXES = {
    Endpoint.CHAT: "chatcmpl-",
    Endpoint.COMPLETION: "cmpl-",
    Endpoint.RESPONSES: "resp_",
    Endpoint.MESSAGES: "msg_",
}


def resolve_model(requested: str | None, engine: Engine, config: ServerConfig) -> str:
    """The model id that responses carry: always the served id, aliases resolved.

    As the OpenAI API answers a request for an alias with the model it resolved
    to, a request for ``"default"`` gets chunks whose ``model`` is the served id.

    Raises:
        ModelNotFound: 404 when ``requested`` is neither the engine's model id nor
            one of ``config.model_aliases``.
    """
    served = engine.model.id
    if requested is None:
        return served
    if requested != served and requested not in config.model_aliases:
        raise ModelNotFound(requested, [served, *config.model_aliases])
    return served


def fit_max_tokens(
    prompt_tokens: int,
    requested: int | None,
    context_length: int,
    default: int | None,
    *,
    prompt_param: str = "messages",
    max_tokens_param: str = "max_tokens",
) -> int:
    """The ``max_tokens`` to generate with, or a 400 when it cannot fit.

    Args:
        prompt_tokens: length of the tokenized prompt (tokens; for a batch, the
            longest prompt).
        requested: the request's ``max_tokens``/``max_completion_tokens``, or
            ``None``.
        context_length: the model's context window (tokens).
        default: ``ServerConfig.default_max_tokens``: used when ``requested`` is
            ``None``, capped by the room left; ``None`` means all the room left.
        prompt_param: the ``param`` named when the prompt alone is too long.
        max_tokens_param: the ``param`` named when ``requested`` does not fit.

    Returns:
        A token count >= 1 with ``prompt_tokens + result <= context_length``.

    Raises:
        RequestError: 400 when the prompt leaves no room, or when ``requested``
            does not fit; the message gives the window and the values seen, e.g.
            "max_tokens is 5000 but the context window is 2048 tokens and the
            prompt has 12 tokens: at most 2036 fit".
    """
    room = context_length - prompt_tokens
    if room < 1:
        raise RequestError(
            f"This model's context window is {context_length} tokens; the prompt "
            f"has {prompt_tokens} tokens, which leaves no room for a completion",
            param=prompt_param,
            code="context_length_exceeded",
        )
    if requested is None:
        return room if default is None else min(default, room)
    if requested > room:
        raise RequestError(
            f"{max_tokens_param} is {requested} but the context window is "
            f"{context_length} tokens and the prompt has {prompt_tokens} tokens: "
            f"at most {room} fit",
            param=max_tokens_param,
            code="context_length_exceeded",
        )
    return requested


def admission_floor(
    request: ChatCompletionRequest | CompletionRequest,
) -> tuple[int, int]:
    """The least a request's plan reserves, known before any template or tokenizer
    work: ``(tokens, sequences)``.

    ``tokens`` is one per prompt (no prompt is empty) plus, per choice, the
    requested ``max_tokens`` or 1; ``sequences`` is its choices. Admitting this
    much first refuses a key over its quota before the prompt is rendered and
    tokenized: the plan reserves at least as much.
    """
    prompts = len(request.prompts) if isinstance(request, CompletionRequest) else 1
    choices = prompts * request.n
    return prompts + choices * (request.requested_max_tokens or 1), choices


async def plan_chat(
    request: ChatCompletionRequest,
    response_id: str,
    engine: Engine,
    template: ChatTemplate | None,
    config: ServerConfig,
) -> Plan:
    """Check and tokenize a chat request (a long prompt in a worker thread).

    ``template`` renders the messages for an engine that takes token ids;
    ``None`` for one that takes text, which gets the messages themselves.

    Raises:
        ModelNotFound: 404, unknown model.
        RequestError: 400: too many choices, a template error, token ids in
            ``logit_bias`` or ``stop_token_ids`` outside the vocabulary, or a
            prompt that does not fit (see ``fit_max_tokens``; one that cannot
            fit at all is refused before it is tokenized).
    """
    model = resolve_model(request.model, engine, config)
    _check_n(request.n, 1, config)
    # Before anything reads a schema (an upstream's compiler too): 400 past a
    # limit, or one the grammar cannot express.
    if engine.output_kind is OutputKind.TEXT:
        await checked_grammar(request, config, None)
        return text_chat_plan(request, response_id, engine, config, model)
    assert template is not None, "an engine of token ids has a chat template"
    # With a reasoning parser the grammar is compiled once it is wrapped to
    # start after the reasoning, which needs the rendered prompt.
    ahead = template.reasoning is None
    grammar = await checked_grammar(request, config, engine, compile_ahead=ahead)
    tools = resolve_tools(request)
    render = functools.partial(
        template.prompt,
        request.messages,
        add_generation_prompt=request.add_generation_prompt,
        context_length=engine.model.context_length,
        tools=tools,
        variables=request.template_variables,
    )
    # A long conversation renders in a worker thread, as a long prompt tokenizes:
    # the loop keeps its share of the interpreter meanwhile.
    if sum(len(message.content) for message in request.messages) < OFF_LOOP_CHARS:
        prompt = render()
    else:
        prompt = await anyio.to_thread.run_sync(render)
    ids = await tokenize(prompt)
    reasoning = request_reasoning(
        template.reasoning, "".join(prompt.parts), thinking=request.thinking
    )
    if grammar is not None and not ahead:
        if reasoning is not None:  # the grammar applies once the reasoning ended
            grammar = reasoning_grammar(grammar, reasoning)
        await compile_ahead(grammar, engine, config, request)
    # A response format's grammar keeps markup out already (and a stop string
    # would cut a JSON string that holds a tag): the guard is for free text.
    guarded = grammar is None and tools is None and shows_tool_markup(request)
    if guarded:
        grammar = NO_TOOL_MARKUP
    plan = _plan(request, response_id, engine, config, model, [ids], [""], grammar)
    enforces = engine.capabilities.reasoning_budgets
    budget = request.thinking_token_budget
    plan = with_reasoning(plan, reasoning, budget, engine_enforces=enforces)
    if guarded and not request.include_stop_str_in_output:
        # For an engine without grammars; with include_stop_str_in_output the
        # matched tag would be sent, so not then.
        return dataclasses.replace(plan, stops=plan.stops + TOOL_MARKUP_STOPS)
    if tools is None:
        return plan
    return dataclasses.replace(plan, tools=tools.decoding)


async def plan_completion(
    request: CompletionRequest, response_id: str, engine: Engine, config: ServerConfig
) -> Plan:
    """Check and tokenize a completions request (one prompt or a batch).

    Each prompt is a string or token ids; a batch gives ``n`` choices per prompt,
    prompt-major. With ``echo`` each choice first sends its prompt's text (a
    token-id prompt is decoded, control tokens left out). Every text prompt is
    checked to fit before any is tokenized (a long one in a worker thread).

    Raises:
        ModelNotFound: 404, unknown model.
        RequestError: 400: too many choices, token ids outside the vocabulary, an
            empty prompt, or one that does not fit.
    """
    model = resolve_model(request.model, engine, config)
    prompts = request.prompts
    _check_n(request.n, len(prompts), config)
    if engine.output_kind is OutputKind.TEXT:
        return text_completion_plan(request, response_id, engine, config, model)
    tokenizer = engine.tokenizer
    vocab_size = len(tokenizer.pieces)
    context = engine.model.context_length
    params = (
        ["prompt"]
        if len(prompts) == 1
        else [f"prompt[{i}]" for i in range(len(prompts))]
    )
    texts = {
        i: text_prompt(tokenizer, prompt, context_length=context, param=params[i])
        for i, prompt in enumerate(prompts)
        if isinstance(prompt, str)
    }
    token_ids: list[list[int]] = []
    echoes: list[str] = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            ids = await tokenize(texts[i])
            echo = prompt
        else:
            ids = checked_ids(prompt, vocab_size, params[i], "token ids")
            echo = _decode(tokenizer, ids)
        if not ids:
            raise RequestError(
                f"The prompt has no tokens ({params[i]})", param=params[i]
            )
        token_ids.append(ids)
        echoes.append(echo if request.echo else "")
    return _plan(request, response_id, engine, config, model, token_ids, echoes)


def _check_n(n: int, prompts: int, config: ServerConfig) -> None:
    if n * prompts <= config.max_n:
        return
    if prompts == 1:
        message = f"Invalid value for 'n': at most {config.max_n} choices; got {n}"
    else:
        message = (
            f"Invalid value for 'n': {prompts} prompts x n={n} is {n * prompts} "
            f"choices, at most {config.max_n}"
        )
    raise RequestError(message, param="n", code="invalid_value")


def _decode(tokenizer: Tokenizer, ids: list[int]) -> str:
    special = tokenizer.special_ids
    pieces = tokenizer.pieces
    data = b"".join(pieces[i] for i in ids if i not in special)
    return data.decode("utf-8", errors="replace")


def _plan(
    request: ChatCompletionRequest | CompletionRequest,
    response_id: str,
    engine: TokenEngine,
    config: ServerConfig,
    model: str,
    prompts: list[list[int]],
    echoes: list[str],
    grammar: Grammar | None = None,
) -> Plan:
    chat = isinstance(request, ChatCompletionRequest)
    max_tokens = fit_max_tokens(
        max(len(p) for p in prompts),
        request.requested_max_tokens,
        engine.model.context_length,
        config.default_max_tokens,
        prompt_param="messages" if chat else "prompt",
        max_tokens_param=request.max_tokens_param,
    )
    params = sampling_params(request, max_tokens, len(engine.tokenizer.pieces))
    if grammar is not None:
        params = dataclasses.replace(params, grammar=grammar)
    return plan_of(request, response_id, model, prompts, echoes, params)
