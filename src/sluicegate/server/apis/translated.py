"""The APIs whose requests become chat requests (Responses, Messages): one planning.

A Responses or Messages body is parsed by its API's models, translated into a
``ChatCompletionRequest`` (``responses_api.to_chat_request``,
``messages_api.to_chat_request``), then admitted and planned exactly as a chat
request (``CompletionRoutes._check_admissible``, ``prepare.tokens.plan_chat``);
its plan's frames are written by its API's stream machine. ``plan_translated``
does the part after the translation for both, so a refusal from the chat checks
names the API's own parameter (``named_as``) on either: a chat message by the
item or turn it came from (``Translation.names``: ``input[3]``, not
``messages[4]``), any other by the API's name of that chat parameter.

Spec: OpenAI API reference, "Responses"; Anthropic API reference, "Messages".
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from sluicegate.core.errors import RequestError
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.server.admission.keys import ApiKey
from sluicegate.server.prepare.plan import Plan
from sluicegate.server.prepare.tokens import plan_chat
from sluicegate.server.schemas.translation import Translation

if TYPE_CHECKING:
    from sluicegate.server.apis.completion_routes import CompletionRoutes

__all__ = ["named_as", "plan_translated", "with_endpoint"]


@contextlib.contextmanager
def named_as(names: Mapping[str, str]) -> Iterator[None]:
    """Inside: a ``RequestError`` from the chat checks an API's request goes
    through names that API's parameters (``RequestError.rename_params``)."""
    try:
        yield
    except RequestError as exc:
        exc.rename_params(names)
        raise


def with_endpoint(plan: Plan, endpoint: Endpoint) -> Plan:
    """``plan``, its responses written by ``endpoint``'s stream machine."""
    header = dataclasses.replace(plan.header, endpoint=endpoint)
    return dataclasses.replace(plan, header=header)


async def plan_translated(
    routes: CompletionRoutes,
    endpoint: Endpoint,
    names: Mapping[str, str],
    translate: Callable[[], Translation],
    response_id: str,
    key: ApiKey | None,
    small: bool,
) -> Plan:
    """The plan of the chat request ``translate()`` makes of an ``endpoint``
    request, admitted for ``key`` and written by ``endpoint``'s stream machine.

    Args:
        names: the API's name of each chat parameter (``named_as``); a chat
            message is named by the translation's ``names`` first.
        small: a request that, short only of tokens, is still planned
            (``CompletionRoutes._check_admissible``).

    Raises:
        What ``translate``, ``CompletionRoutes._check_admissible`` and
        ``plan_chat`` raise; a ``RequestError`` names the API's parameter.
    """
    with named_as(names):
        translation = translate()
        chat = translation.chat
        with named_as(translation.names):  # first: messages[i] is the client's
            served = await routes._check_admissible(key, chat, small)
            plan = await plan_chat(
                chat, response_id, served.engine, served.template, routes.config
            )
    return with_endpoint(plan, endpoint)
