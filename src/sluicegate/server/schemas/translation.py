"""A chat request made of another API's, and where each of its messages came from.

The Responses and Messages APIs translate a body into a chat request whose
messages are not the client's one for one: ``instructions`` or ``system``
comes first, several ``function_call`` items make one assistant message, a
turn's tool results become messages of their own. A refusal about a chat
message (the template's, a message's rules) names the client's parameter it
came from (``input[3]``, not ``messages[4]``) through ``Translation.names``.

Spec: OpenAI API reference, "Responses"; Anthropic API reference, "Messages".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from sluicegate.core.errors import RequestError
from sluicegate.server.schemas.chat import ChatCompletionRequest
from sluicegate.server.schemas.parse import parse_chat_request

__all__ = ["Translation", "translate"]


@dataclasses.dataclass(frozen=True, slots=True)
class Translation:
    """A chat request and the client's name of each of its messages.

    Attributes:
        chat: the validated chat request.
        names: ``messages[i]`` -> the parameter it came from
            (``{"messages[0]": "instructions", "messages[1]": "input[0]"}``),
            for ``RequestError.rename_params``.
    """

    chat: ChatCompletionRequest
    names: Mapping[str, str]


def translate(body: dict[str, Any], origins: Sequence[str]) -> Translation:
    """Validate the chat request ``body``, whose ``messages[i]`` came from
    ``origins[i]``.

    Raises:
        RequestError: 400 from ``parse_chat_request``; a ``param`` under a
            chat message names its origin instead (``input[3].role``).
    """
    names = {f"messages[{i}]": origin for i, origin in enumerate(origins)}
    try:
        chat = parse_chat_request(body)
    except RequestError as exc:
        exc.rename_params(names)
        raise
    return Translation(chat, names)
