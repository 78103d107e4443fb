"""The sluicegate HTTP client: strict SSE decoding, delta assembly, end states.

``Client`` (blocking) and ``AsyncClient`` send streaming chat and completion
requests to any OpenAI-compatible server; every stream ends in one
``StreamResult`` whose ``end_state`` is a ``sluicegate.core.EndState``. Outcomes
are values; only misuse raises (``StreamConsumed``, ``StreamClosed``). A
resumable stream whose connection drops is resumed (``Resumption``).
"""

from sluicegate.client.aio import AsyncClient
from sluicegate.client.assemble import StreamAssembler
from sluicegate.client.results import (
    ChoiceResult,
    StreamResult,
    TextDelta,
    TimeoutKind,
    Timing,
    ToolCall,
)
from sluicegate.client.shell import Resumption, Timeouts
from sluicegate.client.stream_aio import AsyncStream
from sluicegate.client.stream_sync import Stream
from sluicegate.client.sync import Client

__all__ = [
    "AsyncClient",
    "AsyncStream",
    "ChoiceResult",
    "Client",
    "Resumption",
    "Stream",
    "StreamAssembler",
    "StreamResult",
    "TextDelta",
    "TimeoutKind",
    "Timeouts",
    "Timing",
    "ToolCall",
]
