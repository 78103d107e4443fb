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

An engine that takes text (``OutputKind.TEXT``: an upstream server, which has its
own template, tokenizer and context window) gets no token work at all: each
prompt goes to it in the API's terms (``TextPrompt``), ``max_tokens`` is the
client's (or the configured default), and the engine answers what does not fit
with its own status before the first byte. ``tools``, ``tool_choice``,
``parallel_tool_calls`` and ``response_format`` go to it as the client set them:
it constrains and parses the calls itself, and they come back as tool-call
fragments (no ``Plan.tools``: no parser of the server's reads its text).

Spec: docs/DESIGN.md, "Status first, errors in band"; OpenAI API reference,
"Create chat completion" (``max_completion_tokens``, ``n``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

import anyio.to_thread

from sluicegate import __version__
from sluicegate.core.chunks import Endpoint, ResponseHeader
from sluicegate.core.errors import ModelNotFound, RequestError
from sluicegate.core.toolcalls import OPEN_TAG
from sluicegate.core.tooldecoder import ToolCallOptions
from sluicegate.engines.base import (
    Engine,
    GenerateRequest,
    Grammar,
    OutputKind,
    SamplingParams,
    TextPrompt,
    Tokenizer,
)
from sluicegate.server.config import ServerConfig
from sluicegate.server.constraints import NO_TOOL_MARKUP, grammar_for_request
from sluicegate.server.prompt_text import OFF_LOOP_CHARS, tokenize
from sluicegate.server.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
)
from sluicegate.server.templates import ChatTemplate, text_prompt
from sluicegate.server.tools import resolve_tools

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


def new_response_id(endpoint: Endpoint) -> str:
    """A fresh response id: ``chatcmpl-<24 hex>`` or ``cmpl-<24 hex>``."""
    prefix = "chatcmpl" if endpoint is Endpoint.CHAT else "cmpl"
    return f"{prefix}-{secrets.token_hex(12)}"


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
    if engine.output_kind is OutputKind.TEXT:
        messages = tuple(_message_json(m) for m in request.messages)
        text = TextPrompt(
            Endpoint.CHAT,
            messages,
            stop=tuple(request.stop),
            extra=_constraint_fields(request),
        )
        return _text_plan(request, response_id, engine, config, model, [text], [""])
    assert template is not None, "an engine of token ids has a chat template"
    tools = resolve_tools(request)
    grammar = grammar_for_request(request)  # a schema it cannot express: 400
    render = functools.partial(
        template.prompt,
        request.messages,
        add_generation_prompt=request.add_generation_prompt,
        context_length=engine.model.context_length,
        tools=tools,
    )
    # A long conversation renders in a worker thread, as a long prompt tokenizes:
    # the loop keeps its share of the interpreter meanwhile.
    if sum(len(message.content) for message in request.messages) < OFF_LOOP_CHARS:
        prompt = render()
    else:
        prompt = await anyio.to_thread.run_sync(render)
    ids = await tokenize(prompt)
    shows_markup = tools is None and _shows_tool_markup(request)
    if shows_markup and grammar is None:
        grammar = NO_TOOL_MARKUP
    plan = _plan(request, response_id, engine, config, model, [ids], [""], grammar)
    if shows_markup and not request.include_stop_str_in_output:
        # For an engine without grammars; with include_stop_str_in_output the
        # matched tag would be sent, so not then.
        return dataclasses.replace(plan, stops=plan.stops + TOOL_MARKUP_STOPS)
    if tools is None:
        return plan
    return dataclasses.replace(plan, tools=tools.decoding)


TOOL_MARKUP_STOPS = (OPEN_TAG, "<tool_response")
"""Where a turn that may not call (``tool_choice: "none"``) ends if the model
starts to write tool markup anyway (an engine without grammars), as it may
after calls in the history: the text before is the answer, finish ``stop``."""


def _shows_tool_markup(request: ChatCompletionRequest) -> bool:
    """Whether the prompt shows tools or past calls (in the format of
    docs/tools.md), so that a turn that may not call could imitate them: such a
    turn decodes under ``NO_TOOL_MARKUP`` and ends at ``TOOL_MARKUP_STOPS``."""
    return bool(request.tools) or any(
        m.role == "tool" or m.tool_calls for m in request.messages
    )


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
        return _text_completion_plan(request, response_id, engine, config, model)
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
            ids = _checked_ids(prompt, vocab_size, params[i], "token ids")
            echo = _decode(tokenizer, ids)
        if not ids:
            raise RequestError(
                f"The prompt has no tokens ({params[i]})", param=params[i]
            )
        token_ids.append(ids)
        echoes.append(echo if request.echo else "")
    return _plan(request, response_id, engine, config, model, token_ids, echoes)


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
    if request.response_format is not None:
        fields["response_format"] = request.response_format.model_dump(
            mode="json", by_alias=True, exclude_none=True
        )
    return fields


def _text_completion_plan(
    request: CompletionRequest,
    response_id: str,
    engine: Engine,
    config: ServerConfig,
    model: str,
) -> Plan:
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
    if request.top_logprobs_k is not None:
        raise RequestError(
            "logprobs are not available from this model's engine (an upstream server)",
            param="logprobs",
        )
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
    texts = [
        dataclasses.replace(t, max_tokens=max_tokens, extra={**t.extra, **sampling})
        for t in texts
    ]
    # Without a tokenizer the window is the upstream's to enforce; the bound
    # here is for quotas only.
    params = _sampling(
        request, max_tokens or engine.model.context_length, vocab_size=None
    )
    plan = _plan_of(request, response_id, model, [[] for _ in texts], echoes, params)
    return dataclasses.replace(plan, text_prompts=tuple(texts))


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


def _checked_ids(ids: list[int], vocab_size: int, param: str, what: str) -> list[int]:
    if not ids or (min(ids) >= 0 and max(ids) < vocab_size):  # in C, most requests
        return ids
    bad = next(i for i in ids if not 0 <= i < vocab_size)
    raise RequestError(
        f"Invalid value for '{param}': {what} must be in [0, {vocab_size}); got {bad}",
        param=param,
        code="invalid_value",
    )


def _decode(tokenizer: Tokenizer, ids: list[int]) -> str:
    special = tokenizer.special_ids
    pieces = tokenizer.pieces
    data = b"".join(pieces[i] for i in ids if i not in special)
    return data.decode("utf-8", errors="replace")


def _plan(
    request: ChatCompletionRequest | CompletionRequest,
    response_id: str,
    engine: Engine,
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
    params = _sampling(request, max_tokens, len(engine.tokenizer.pieces))
    params = dataclasses.replace(params, grammar=grammar)
    return _plan_of(request, response_id, model, prompts, echoes, params)


def _plan_of(
    request: ChatCompletionRequest | CompletionRequest,
    response_id: str,
    model: str,
    prompts: list[list[int]],
    echoes: list[str],
    params: SamplingParams,
) -> Plan:
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
    )


def _sampling(
    request: ChatCompletionRequest | CompletionRequest,
    max_tokens: int,
    vocab_size: int | None,
) -> SamplingParams:
    """``vocab_size``: token ids are checked against it; ``None`` (an engine
    that takes text, whose vocabulary is its own): passed on unchecked."""
    bias = request.logit_bias or {}
    stop_ids = request.stop_token_ids
    if vocab_size is not None:
        _checked_ids([int(k) for k in bias], vocab_size, "logit_bias", "token ids")
        _checked_ids(stop_ids, vocab_size, "stop_token_ids", "token ids")
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
