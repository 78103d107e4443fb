"""Probes of what a stream means: usage, text, stops, limits, statuses, aborts.

Each probe is pure: a recording in, a ``ProbeResult`` out (see ``check.verdicts``).
Comparisons with non-streamed answers rely on temperature 0 being deterministic,
which holds for llama.cpp-style servers serving one request at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluicegate.check import names
from sluicegate.check.transcript import Transcript, json_body, parse
from sluicegate.check.verdicts import (
    ProbeResult,
    clip,
    fail,
    not_observable,
    passed,
)
from sluicegate.client.assemble import StreamAssembler
from sluicegate.client.results import StreamResult

__all__ = [
    "disconnect_then_serve",
    "max_tokens_one",
    "multibyte_text",
    "n_choices",
    "rejects_invalid",
    "stop_strings",
    "usage_absent",
    "usage_included",
]

PROMPT_AFTER_ABORT_S = 5.0
"""Slack for the request after a disconnect: its time to first text may exceed
the baseline's by this much (plus a factor of 3) before it counts as stuck."""


def assemble(t: Transcript) -> StreamResult:
    """The client's view of a recorded stream."""
    assembler = StreamAssembler(int(t.request.get("n") or 1))
    assembler.head(t.status or 0, t.headers, 0.0)
    assembler.feed(t.body, t.ttft_s or 0.0)
    return assembler.flush(t.elapsed_s, client_gone=t.closed_early)


def plain(t: Transcript) -> tuple[str, Mapping[str, Any] | None, str | None]:
    """A non-streamed answer's choice-0 text, usage and finish reason."""
    body = json_body(t)
    if not isinstance(body, dict) or not body.get("choices"):
        return "", None, None
    choice = body["choices"][0]
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
    return text or "", usage, choice.get("finish_reason")


def _pair(recording: Mapping[str, Transcript], *keys: str) -> list[Transcript] | str:
    missing = [k for k in keys if k not in recording]
    if missing:
        return f"not recorded: {', '.join(missing)}"
    bad = [k for k in keys if recording[k].status != 200]
    if bad:
        first = recording[bad[0]]
        return f"{bad[0]} answered {first.status}: {clip(first.body, 120)}"
    return [recording[k] for k in keys]


def usage_included(recording: Mapping[str, Transcript]) -> ProbeResult:
    """With ``include_usage``, every chunk has ``usage: null`` except one last
    chunk (``choices: []``) before ``[DONE]``, whose counts equal the
    non-streamed answer's.

    Spec: OpenAI API reference, "Create chat completion" (``stream_options``).
    """
    got = _pair(recording, names.STREAM, names.PLAIN)
    if isinstance(got, str):
        return not_observable(got)
    stream, reference = got
    chunks = [c for _, c in parse(stream).chunks]
    if not chunks or not isinstance(last := chunks[-1].get("usage"), dict):
        return fail(f"the last chunk has no usage: {clip(chunks[-1:])}")
    if chunks[-1].get("choices") != []:
        return fail(f"the usage chunk has choices: {clip(chunks[-1])}")
    early = [i for i, c in enumerate(chunks[:-1]) if c.get("usage") is not None]
    missing = [i for i, c in enumerate(chunks[:-1]) if "usage" not in c]
    if early or missing:
        which = early or missing
        return fail(
            f"chunk #{which[0]} has usage {clip(chunks[which[0]].get('usage'))}"
        )
    _, want, _ = plain(reference)
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    if want is None or any(last.get(k) != want.get(k) for k in keys):
        return fail(f"streamed usage {clip(last)} != non-streamed {clip(want)}")
    return passed(f"usage {last.get('prompt_tokens')}+{last.get('completion_tokens')}")


def usage_absent(recording: Mapping[str, Transcript]) -> ProbeResult:
    """Without ``include_usage``, no chunk carries a usage object.

    Spec: OpenAI API reference, "Create chat completion" (``stream_options``).
    """
    got = _pair(recording, names.NO_USAGE)
    if isinstance(got, str):
        return not_observable(got)
    for pos, chunk in parse(got[0]).chunks:
        if chunk.get("usage") is not None:
            return fail(f"event #{pos} has usage {clip(chunk['usage'])}")
    return passed("no usage without include_usage")


def multibyte_text(recording: Mapping[str, Transcript]) -> ProbeResult:
    """Streamed multi-byte text has no U+FFFD and equals the non-streamed text
    at temperature 0.

    Spec: docs/DESIGN.md, "Tokens and text".
    """
    got = _pair(recording, names.MULTIBYTE, names.MULTIBYTE_PLAIN)
    if isinstance(got, str):
        return not_observable(got)
    streamed = assemble(got[0]).text
    want, _, _ = plain(got[1])
    if "\ufffd" in streamed and "\ufffd" not in want:
        return fail(f"U+FFFD in the stream: {clip(streamed)}")
    if streamed != want:
        return fail(f"streamed {clip(streamed, 80)} != plain {clip(want, 80)}")
    if streamed.isascii():
        return not_observable(f"the answer was ASCII only: {clip(streamed, 80)}")
    return passed(f"{len(streamed)} chars equal, e.g. {clip(streamed, 40)}")


def stop_strings(recording: Mapping[str, Transcript]) -> ProbeResult:
    """Stop strings (one; several) end the text right before the first match,
    never leak into it, and the text before them is all sent; finish is
    ``stop``.

    Spec: OpenAI API reference, "Create chat completion" (``stop``);
    docs/DESIGN.md, "Stop strings".
    """
    got = _pair(recording, names.PLAIN)
    if isinstance(got, str):
        return not_observable(got)
    full, _, _ = plain(got[0])
    checked = []
    for key in (names.STOP_ONE, names.STOP_MANY):
        if key not in recording:
            continue
        t = recording[key]
        stops = t.request.get("stop") or []
        cut = min((full.find(s) for s in stops if s in full), default=-1)
        if cut < 0:
            continue
        result = assemble(t)
        if any(s in result.text for s in stops):
            return fail(f"{key}: a stop string leaked: {clip(result.text)}")
        if result.text != full[:cut] or result.finish_reason != "stop":
            return fail(
                f"{key}: got {clip(result.text, 60)} ({result.finish_reason}), "
                f"want {clip(full[:cut], 60)} (stop)"
            )
        checked.append(f"{key} {clip(stops, 40)}")
    return passed("; ".join(checked)) if checked else not_observable("no stop run")


def max_tokens_one(recording: Mapping[str, Transcript]) -> ProbeResult:
    """``max_tokens: 1`` gives a finished stream of at most one token (finish
    ``length``, or ``stop`` if that token ended the answer).

    Spec: OpenAI API reference, "Create chat completion" (``max_tokens``).
    """
    got = _pair(recording, names.MAX1)
    if isinstance(got, str):
        return not_observable(got)
    result = assemble(got[0])
    if result.end_state != "finished":
        return fail(
            f"{result.end_state}: {clip(result.protocol_error or result.error)}"
        )
    if result.finish_reason not in ("length", "stop"):
        return fail(f"finish_reason {result.finish_reason!r}")
    if result.usage is not None and result.usage.completion_tokens > 1:
        return fail(f"completion_tokens {result.usage.completion_tokens}")
    return passed(f"{clip(result.text, 40)} ({result.finish_reason})")


def n_choices(recording: Mapping[str, Transcript]) -> ProbeResult:
    """``n: 2`` streams choices with indices 0 and 1, each finished once.

    Spec: OpenAI API reference, "Create chat completion" (``n``).
    """
    t = recording.get(names.N2)
    if t is None:
        return not_observable("not recorded: n2")
    if t.status is not None and 400 <= t.status < 500:
        return not_observable(f"n=2 declined with {t.status}: {clip(t.body, 100)}")
    result = assemble(t)
    indexes = [c.index for c in result.choices]
    if indexes != [0, 1] or result.end_state != "finished":
        reasons = [c.finish_reason for c in result.choices]
        return fail(f"{result.end_state}: indices {indexes}, finishes {reasons}")
    return passed(f"choices 0 and 1: {[c.finish_reason for c in result.choices]}")


def rejects_invalid(recording: Mapping[str, Transcript]) -> ProbeResult:
    """Invalid requests get a 4xx with an OpenAI error body before any stream
    (never 200 and an error event).

    Spec: OpenAI API reference, "Error codes"; docs/DESIGN.md, "Status first,
    errors in band".
    """
    cases = {k: t for k, t in recording.items() if k.startswith(names.INVALID)}
    if not cases:
        return not_observable("not recorded: invalid")
    for key, t in cases.items():
        if t.status is None or not 400 <= t.status < 500:
            return fail(f"{key} {clip(dict(t.request))}: status {t.status}")
        body = json_body(t)
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict) or not isinstance(error.get("message"), str):
            return fail(
                f"{key}: {t.status} body is not an OpenAI error: {clip(t.body)}"
            )
    return passed(", ".join(f"{k}: {t.status}" for k, t in cases.items()))


def disconnect_then_serve(recording: Mapping[str, Transcript]) -> ProbeResult:
    """After a client closes a stream mid-answer, the next request is served
    promptly (the aborted one no longer holds the engine).

    Spec: docs/DESIGN.md, "Engine protocols" (``abort``) and "End states".
    """
    got = _pair(recording, names.DISCONNECTED, names.AFTER_DISCONNECT, names.STREAM)
    if isinstance(got, str):
        return not_observable(got)
    _, after, baseline = got
    result = assemble(after)
    if result.end_state != "finished":
        return fail(f"the request after the disconnect is {result.end_state}")
    # An empty answer has no first text: its end is then the time to judge.
    base = baseline.ttft_s if baseline.ttft_s is not None else baseline.elapsed_s
    took = after.ttft_s if after.ttft_s is not None else after.elapsed_s
    limit = 3 * base + PROMPT_AFTER_ABORT_S
    if took > limit:
        return fail(f"answered after {took:.3f} s (limit {limit:.2f} s)")
    return passed(f"answered after {took:.3f} s (baseline {base:.3f} s)")
