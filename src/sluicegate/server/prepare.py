"""Validated request -> ``Plan``: model, prompt ids, sampling, limits, all checked.

Everything that can be refused is refused here, before any byte of the response:
an unknown model (404), too many choices, an empty prompt, token ids outside the
vocabulary, and a prompt plus ``max_tokens`` that does not fit the context window
(400, naming the limit and the values seen).

Spec: ../shared/DESIGN.md, "Status first, errors in band"; OpenAI API reference,
"Create chat completion" (``max_completion_tokens``, ``n``).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from sluicegate.core.chunks import Endpoint, ResponseHeader
from sluicegate.core.errors import ModelNotFound, RequestError
from sluicegate.engines.base import Engine, GenerateRequest, SamplingParams
from sluicegate.server.config import ServerConfig
from sluicegate.server.schemas import ChatCompletionRequest, CompletionRequest
from sluicegate.server.templates import ChatTemplate, encode_prompt

__all__ = [
    "Plan",
    "fit_max_tokens",
    "new_response_id",
    "plan_chat",
    "plan_completion",
    "resolve_model",
]


@dataclass(frozen=True, slots=True)
class Plan:
    """What to ask the engine for, and what every chunk of the answer shares.

    Attributes:
        header: id, created, model name, endpoint, ``n`` and ``include_usage``.
        prompt_token_ids: the prompt, tokenized (tokens, never empty).
        params: sampling for every choice (``max_tokens`` already fitted).
        stops: stop strings (matched on text by the server, not the engine).
        stream: whether to answer with an event stream.
    """

    header: ResponseHeader
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    stops: tuple[str, ...]
    stream: bool

    @property
    def sequence_ids(self) -> list[str]:
        """Engine request ids, one per choice: ``"<response id>-<index>"``."""
        return [f"{self.header.id}-{i}" for i in range(self.header.n)]

    def requests(self) -> list[GenerateRequest]:
        """One ``GenerateRequest`` per choice, in index order."""
        return [
            GenerateRequest(sid, self.prompt_token_ids, self.params)
            for sid in self.sequence_ids
        ]


def new_response_id(endpoint: Endpoint) -> str:
    """A fresh response id: ``chatcmpl-<24 hex>`` or ``cmpl-<24 hex>``."""
    prefix = "chatcmpl" if endpoint is Endpoint.CHAT else "cmpl"
    return f"{prefix}-{secrets.token_hex(12)}"


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
) -> int:
    """The ``max_tokens`` to generate with, or a 400 when it cannot fit.

    Args:
        prompt_tokens: length of the tokenized prompt (tokens).
        requested: the request's ``max_tokens``/``max_completion_tokens``, or
            ``None``.
        context_length: the model's context window (tokens).
        default: ``ServerConfig.default_max_tokens``: used when ``requested`` is
            ``None``, capped by the room left; ``None`` means all the room left.
        prompt_param: the ``param`` named when the prompt alone is too long.

    Returns:
        A token count >= 1 with ``prompt_tokens + result <= context_length``.

    Raises:
        RequestError: 400 when the prompt leaves no room, or when ``requested``
            does not fit; the message gives the window and the values seen.
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
            f"max_tokens is {requested} but the context window is {context_length} "
            f"tokens and the prompt has {prompt_tokens} tokens: at most {room} fit",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return requested


def plan_chat(
    request: ChatCompletionRequest,
    response_id: str,
    engine: Engine,
    template: ChatTemplate,
    config: ServerConfig,
) -> Plan:
    """Check and tokenize a chat request.

    Raises:
        ModelNotFound: 404, unknown model.
        RequestError: 400: too many choices, a template error, or a prompt that
            does not fit (see ``fit_max_tokens``).
    """
    model = resolve_model(request.model, engine, config)
    _check_n(request.n, config)
    prompt = template.encode(request.messages)
    max_tokens = _fit(request.requested_max_tokens, len(prompt), engine, config)
    return _plan(request, response_id, Endpoint.CHAT, model, prompt, max_tokens)


def plan_completion(
    request: CompletionRequest, response_id: str, engine: Engine, config: ServerConfig
) -> Plan:
    """Check and tokenize a completions request (string or token-id prompt).

    Raises:
        ModelNotFound: 404, unknown model.
        RequestError: 400: too many choices, token ids outside the vocabulary, an
            empty prompt, or one that does not fit.
    """
    model = resolve_model(request.model, engine, config)
    _check_n(request.n, config)
    if isinstance(request.prompt, str):
        prompt = encode_prompt(engine.tokenizer, request.prompt)
    else:
        prompt = _checked_ids(request.prompt, len(engine.tokenizer.pieces))
    if not prompt:
        raise RequestError("The prompt has no tokens", param="prompt")
    requested = request.requested_max_tokens
    max_tokens = _fit(requested, len(prompt), engine, config, "prompt")
    return _plan(request, response_id, Endpoint.COMPLETION, model, prompt, max_tokens)


def _check_n(n: int, config: ServerConfig) -> None:
    if n > config.max_n:
        raise RequestError(
            f"Invalid value for 'n': at most {config.max_n} choices; got {n}",
            param="n",
            code="invalid_value",
        )


def _checked_ids(ids: list[int], vocab_size: int) -> list[int]:
    bad = next((i for i in ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise RequestError(
            f"Invalid value for 'prompt': token ids must be in [0, {vocab_size}); "
            f"got {bad}",
            param="prompt",
            code="invalid_value",
        )
    return ids


def _fit(
    requested: int | None,
    prompt_tokens: int,
    engine: Engine,
    config: ServerConfig,
    prompt_param: str = "messages",
) -> int:
    return fit_max_tokens(
        prompt_tokens,
        requested,
        engine.model.context_length,
        config.default_max_tokens,
        prompt_param=prompt_param,
    )


def _plan(
    request: ChatCompletionRequest | CompletionRequest,
    response_id: str,
    endpoint: Endpoint,
    model: str,
    prompt: list[int],
    max_tokens: int,
) -> Plan:
    header = ResponseHeader(
        id=response_id,
        created=int(time.time()),
        model=model,
        endpoint=endpoint,
        n=request.n,
        include_usage=request.include_usage,
    )
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        seed=request.seed,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
    )
    return Plan(header, tuple(prompt), params, tuple(request.stop), request.stream)
