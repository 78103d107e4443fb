"""The sans-IO core: token ids to safe text, and text to correct SSE frames.

Pure and synchronous: stdlib plus one JSON encoder (orjson), no asyncio, no HTTP.
Every stateful object has one verb pair: ``feed(x)`` returns everything that is safe
to emit now, ``flush()`` returns the rest and ends the object.

Modules: ``detokenize`` (token ids -> text), ``stops`` (stop strings),
``choice`` (both, per choice), ``choice_setup`` (a choice's options and
decoders), ``reasoning`` (reasoning apart from content, by a model family's
markers), ``logprobs`` (logprobs aligned with delta text), ``decoding``
(``ResponseDecoder``: one response's engine outputs -> stream events), ``sse``
(event-stream codec), ``chunks`` (OpenAI payload builders), ``stream`` (the
per-response state machine and its ``outcome``), ``endstate`` (how a stream
ended: ``classify``), ``scheduling`` (``BatchScheduler``: continuous batching
as bookkeeping), ``events`` and ``errors``.
"""

from sluicegate.core.choice import ChoiceDecoder, ChoiceStep
from sluicegate.core.chunks import Endpoint, ResponseHeader, dumps
from sluicegate.core.detokenize import IncrementalDetokenizer, WindowedDetokenizer
from sluicegate.core.endstate import EndState, classify
from sluicegate.core.events import (
    Delta,
    End,
    EngineOutput,
    Fail,
    Finish,
    FinishReason,
    Heartbeat,
    StreamEvent,
    Usage,
)
from sluicegate.core.reasoning import ReasoningSplitter, ReasoningStep
from sluicegate.core.sse import DONE, Event, SSEDecoder, encode_comment, encode_event
from sluicegate.core.stops import StopMatcher, StopStep
from sluicegate.core.stream import StreamMachine, StreamState

__all__ = [
    "DONE",
    "ChoiceDecoder",
    "ChoiceStep",
    "Delta",
    "End",
    "EndState",
    "Endpoint",
    "EngineOutput",
    "Event",
    "Fail",
    "Finish",
    "FinishReason",
    "Heartbeat",
    "IncrementalDetokenizer",
    "ReasoningSplitter",
    "ReasoningStep",
    "ResponseHeader",
    "SSEDecoder",
    "StopMatcher",
    "StopStep",
    "StreamEvent",
    "StreamMachine",
    "StreamState",
    "Usage",
    "WindowedDetokenizer",
    "classify",
    "dumps",
    "encode_comment",
    "encode_event",
]
