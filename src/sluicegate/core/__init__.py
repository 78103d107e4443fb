"""The sans-IO core: token ids to safe text, and text to correct SSE frames.

Pure and synchronous: stdlib plus one JSON encoder (orjson), no asyncio, no HTTP.
Every stateful object has one verb pair: ``feed(x)`` returns everything that is safe
to emit now, ``flush()`` returns the rest and ends the object.

Subpackages: ``decoding`` (token ids -> safe text: ``detokenize``, ``stops``,
``choice`` and ``choice_setup`` per choice, ``reasoning`` apart from content,
``toolcalls``, and ``response``: ``ResponseDecoder``, one response's engine
outputs -> stream events), ``wire`` (stream events -> bytes: ``sse``, the
``chunks`` builders, ``stream``: the per-response state machine and its
``outcome``, and the Responses and Messages machines) and ``upstream`` (an
upstream's OpenAI event stream read back: ``UpstreamReader``). Shared by them:
``events``, ``errors``, ``endstate`` (how a stream ended: ``classify``),
``logprobs`` (logprobs aligned with delta text), ``scheduling``
(``BatchScheduler``: continuous batching as bookkeeping) and ``redact``.
"""

from sluicegate.core.decoding.choice import ChoiceDecoder, ChoiceStep
from sluicegate.core.decoding.detokenize import (
    IncrementalDetokenizer,
    WindowedDetokenizer,
)
from sluicegate.core.decoding.reasoning import ReasoningSplitter, ReasoningStep
from sluicegate.core.decoding.stops import StopMatcher, StopStep
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
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader, dumps
from sluicegate.core.wire.sse import (
    DONE,
    Event,
    SSEDecoder,
    encode_comment,
    encode_event,
)
from sluicegate.core.wire.stream import StreamMachine, StreamState

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
