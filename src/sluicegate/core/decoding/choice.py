"""One choice's token ids -> safe text: a detokenizer, then a stop matcher.

``ChoiceDecoder`` is what the server keeps per choice: it turns each engine step's
token ids into text that may be sent now, reports a matched stop string as
``FinishReason.STOP``, and counts completion tokens.

Invariants (property-tested):

- The text and the token count do not depend on how the token ids are split into
  ``feed`` calls. With stop strings the ids are taken one at a time, so the count
  ends exactly at the token that completed the stop string.
- Once a stop string matched, later token ids are discarded and not counted (an
  engine may produce a token or two before its abort lands).

Spec: docs/DESIGN.md, "Tokens and text" and "Stop strings".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sluicegate.core.decoding.detokenize import (
    IncrementalDetokenizer,
    WindowedDetokenizer,
)
from sluicegate.core.decoding.stops import StopMatcher
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import Delta, FinishReason, Usage
from sluicegate.core.slot_init import slot_init

__all__ = ["ChoiceDecoder", "ChoiceStep"]


@slot_init
@dataclass(frozen=True, slots=True)
class ChoiceStep:
    """Text safe to emit now, and ``FinishReason.STOP`` when a stop string matched.

    Attributes:
        text: content text safe to send now.
        finish_reason: ``FinishReason.STOP`` when a stop string matched.
        reasoning: reasoning text safe to send now, before ``text`` (a choice
            decoded with a reasoning splitter); ``""`` otherwise.
    """

    text: str
    finish_reason: FinishReason | None = None
    reasoning: str = ""
    _shared: tuple[Delta, ...] | None = field(
        default=None, init=False, compare=False, repr=False
    )

    def events(self, index: int, usage: Usage | None = None) -> tuple[Delta, ...]:
        """The text as choice ``index``'s content ``Delta`` (with ``usage``), or
        ``()`` for empty text; the reasoning is not in it.

        Once per token: a shared step's ``Delta`` of choice 0 without usage is
        built once and shared too (immutable, about 0.3 us a token less).
        """
        if index == 0 and usage is None:
            shared = self._shared
            if shared is not None:
                return shared
        if not self.text:
            return ()
        return (Delta(index, self.text, None, usage),)


_set_shared = vars(ChoiceStep)["_shared"].__set__
_NOTHING = ChoiceStep("")
_set_shared(_NOTHING, ())

# ``ChoiceStep(text)`` by text, for short texts: a token's text is mostly one piece
# of the vocabulary, so a few thousand texts come back again and again, in every
# choice and response. Sharing their (immutable) steps saves building one per
# token. Cleared when full: bounded, and it follows what is being generated.
_TEXT_STEPS: dict[str, ChoiceStep] = {"": _NOTHING}
_MAX_TEXT_STEPS = 8192
_MAX_SHARED_CHARS = 32


def _new_text_step(text: str) -> ChoiceStep:
    step = ChoiceStep(text)
    if len(text) <= _MAX_SHARED_CHARS:
        _set_shared(step, (Delta(0, text, None, None),) if text else ())
        if len(_TEXT_STEPS) >= _MAX_TEXT_STEPS:
            _TEXT_STEPS.clear()
            _TEXT_STEPS[""] = _NOTHING
        _TEXT_STEPS[text] = step
    return step


class ChoiceDecoder:
    """Token ids of one choice in, text out; counts completion tokens fed.

    Args:
        detokenizer: a fresh detokenizer for this choice (owned from now on).
        stops: a fresh stop matcher for this choice (owned from now on); one with
            no stop strings passes text through.
    """

    __slots__ = ("_closed", "_completion_tokens", "_detokenizer", "_stopped", "_stops")

    def __init__(
        self,
        detokenizer: IncrementalDetokenizer | WindowedDetokenizer,
        stops: StopMatcher,
    ) -> None:
        self._detokenizer = detokenizer
        self._stops = stops
        self._completion_tokens = 0
        self._stopped = False  # the same as self._stops.finished, read sooner
        self._closed = False

    @property
    def completion_tokens(self) -> int:
        """Token ids fed before a stop string matched (``skip_ids`` included)."""
        return self._completion_tokens

    @property
    def finished(self) -> bool:
        """Whether a stop string matched: send ``Finish(STOP)``, abort the engine."""
        return self._stops.finished

    @property
    def stop(self) -> str | None:
        """The stop string that matched, or ``None``."""
        return self._stops.stop

    @property
    def held(self) -> str:
        """Text the stop matcher holds back now (not yet safe to send)."""
        return self._stops.held

    def feed(self, token_ids: Iterable[int]) -> ChoiceStep:
        """Take one engine step's token ids and return the text safe to send.

        Args:
            token_ids: new token ids, in order (any number; ``skip_ids`` of the
                detokenizer are counted but never become text).

        Returns:
            ``ChoiceStep(text)``, possibly with empty text; or
            ``ChoiceStep(text_before_stop, FinishReason.STOP)`` on the step where a
            stop string completes. After that, ``ChoiceStep("")`` for every call
            (the ids are discarded and not counted).

        Raises:
            LocalProtocolError: after ``flush()``.
            ValueError: a token id outside the detokenizer's vocabulary (with
                stop strings, the ids before it have been taken).
        """
        if self._closed:
            raise LocalProtocolError("ChoiceDecoder.feed() after flush()")
        if self._stopped:
            return _NOTHING
        stops = self._stops
        detokenizer = self._detokenizer
        ids = tuple(token_ids)
        # ``_release`` is ``StopMatcher.feed`` without its checks and its
        # ``StopStep`` (it sets ``_stop`` on a match), ``_feed_one`` is
        # ``feed((token_id,))`` from a table of piece texts, and the step is a
        # shared one: no allocation per token on the hottest path of a server.
        if len(ids) == 1:
            text = detokenizer._feed_one(ids[0])
            if stops._stops:  # no stop strings: nothing to match or hold
                text = stops._release(text)
            self._completion_tokens += 1
        elif not stops._stops:
            # The count cannot end inside the step: take its text in one piece.
            text = stops._release(detokenizer.feed(ids))
            self._completion_tokens += len(ids)
        else:
            text = ""
            for token_id in ids:
                text += stops._release(detokenizer.feed((token_id,)))
                self._completion_tokens += 1
                if stops._stop is not None:
                    break
        if stops._stop is not None:
            self._stopped = True
            return ChoiceStep(text, FinishReason.STOP)
        step = _TEXT_STEPS.get(text)
        return step if step is not None else _new_text_step(text)

    def flush(self) -> ChoiceStep:
        """End of the choice: the detokenizer's tail through the stop matcher, then
        what the matcher held. Ends the object.

        Returns:
            ``ChoiceStep(rest)`` when the choice ends for another reason (length,
            end-of-sequence token); ``ChoiceStep(text_before_stop,
            FinishReason.STOP)`` if the tail completes a stop string;
            ``ChoiceStep("")`` if a stop string had matched already.

        Raises:
            LocalProtocolError: called twice.
        """
        if self._closed:
            raise LocalProtocolError("ChoiceDecoder.flush() called twice")
        self._closed = True
        tail = self._detokenizer.flush()
        stops = self._stops
        if stops.finished:
            stops.flush()
            return ChoiceStep("")
        step = stops.feed(tail)
        if step.stop is not None:
            stops.flush()
            return ChoiceStep(step.text, FinishReason.STOP)
        return ChoiceStep(step.text + stops.flush())
