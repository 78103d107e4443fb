"""Probes of what a gateway tends to drop or invent: usage, calls, head, cache, resume.

Each probe is pure: a recording in, a ``ProbeResult`` out (see ``check.verdicts``).
They hold for any OpenAI-compatible endpoint, a server or a gateway in front of
one; what an endpoint does not offer (an extension, a prefix cache, resumable
streams) grades ``not-observable``, never ``fail``:

- ``continuous_usage``: vLLM's ``stream_options.continuous_usage_stats``
  extension, usage on every chunk; once offered, every chunk's prompt count
  is the prompt's (not a gateway's 0 until the last chunk);
- ``parallel_tool_calls``: ``parallel_tool_calls: false`` holds whatever the
  model behind it would have sent;
- ``time_to_headers``: the response head is not held back for a long prefill;
- ``cached_tokens``: cached prompt tokens said alike streamed and not (the
  first of three sends fills a cache; the other two are graded);
- ``resume_past_end`` (chat) and ``responses_resume_past_end`` (a stored
  Responses stream): a resume cursor at the end of an ended stream is
  answered with a status an ``EventSource`` stops on, not an empty 200 (the
  Messages API has no resumption).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from sluicegate.check import names
from sluicegate.check.responses_probes import TERMINAL
from sluicegate.check.semantics import assemble, plain
from sluicegate.check.transcript import Transcript, parse
from sluicegate.check.verdicts import (
    ProbeResult,
    clip,
    fail,
    not_observable,
    passed,
)

__all__ = [
    "HEAD_LEAD_S",
    "SLOW_FIRST_S",
    "cached_tokens",
    "continuous_usage",
    "parallel_tool_calls",
    "responses_resume_past_end",
    "resume_past_end",
    "time_to_headers",
]

SLOW_FIRST_S = 2.0
"""A first content later than this (seconds) is a slow prefill worth grading."""
HEAD_LEAD_S = 1.0
"""How long before such a first content the head must have come (seconds): a
server that holds its head until the first content sends both together."""


def _graded(recording: Mapping[str, Transcript], key: str) -> Transcript | ProbeResult:
    """The exchange ``key`` answered 200, or the verdict when it was not: a 4xx
    declines an optional feature (not observable), anything else fails."""
    t = recording.get(key)
    if t is None:
        return not_observable(f"{key} was not recorded")
    if t.status is None:
        return not_observable(f"{key} got no answer")
    if 400 <= t.status < 500:
        return not_observable(f"{key} declined with {t.status}: {clip(t.body, 100)}")
    if t.status != 200:
        return fail(f"{key} answered {t.status}: {clip(t.body, 120)}")
    return t


def _usage_problem(usage: Any, final: Mapping[str, Any]) -> str | None:
    if not isinstance(usage, dict):
        return f"usage {clip(usage)}"
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if prompt != final.get("prompt_tokens"):
        return (
            f"prompt_tokens {prompt!r}, the last chunk's {final.get('prompt_tokens')!r}"
        )
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return f"usage {clip(usage)}"
    if usage.get("total_tokens") != prompt + completion:
        return f"usage {clip(usage)}: total != prompt + completion"
    return None


def continuous_usage(recording: Mapping[str, Transcript]) -> ProbeResult:
    """With ``stream_options.continuous_usage_stats`` honoured (usage on the
    chunks before the last), every chunk's usage has the final prompt count
    (at least 1), totals that add up, and completion counts that never fall.

    Spec: vLLM, "OpenAI-compatible server" (``continuous_usage_stats``);
    OpenAI API reference, "The chat completion chunk object" (``usage``).
    """
    t = _graded(recording, names.CONTINUOUS)
    if isinstance(t, ProbeResult):
        return t
    chunks = [c for _, c in parse(t).chunks]
    final = chunks[-1].get("usage") if chunks else None
    if not isinstance(final, dict):
        return fail(f"the last chunk has no usage: {clip(chunks[-1:])}")
    early = [c["usage"] for c in chunks[:-1] if c.get("usage") is not None]
    if not early:
        return not_observable("no usage before the last chunk: the extension is off")
    prompt = final.get("prompt_tokens")
    if not isinstance(prompt, int) or prompt < 1:
        return fail(f"the final usage says the prompt has {prompt!r} tokens")
    completions = []
    for i, usage in enumerate(early):
        problem = _usage_problem(usage, final)
        if problem:
            return fail(f"chunk #{i}: {problem}")
        completions.append(usage["completion_tokens"])
    completions.append(final.get("completion_tokens"))
    if any(not isinstance(c, int) for c in completions) or completions != sorted(
        completions
    ):
        return fail(f"completion_tokens over the chunks: {clip(completions)}")
    return passed(f"{len(early)} chunks with usage, prompt_tokens {prompt} on each")


def parallel_tool_calls(recording: Mapping[str, Transcript]) -> ProbeResult:
    """With ``parallel_tool_calls: false``, a streamed answer makes at most
    one tool call, even to a request that asks for two.

    Spec: OpenAI API reference, "Create chat completion"
    (``parallel_tool_calls``).
    """
    t = _graded(recording, names.TOOLS_SERIAL)
    if isinstance(t, ProbeResult):
        return t
    choices = assemble(t).choices
    calls = (
        (choices[0].tool_calls + choices[0].incomplete_tool_calls) if choices else []
    )
    if len(calls) > 1:
        made = [(c.name, c.arguments) for c in calls]
        return fail(f"{len(calls)} calls: {clip(made)}")
    return passed(f"{len(calls)} call{'' if len(calls) == 1 else 's'}")


def time_to_headers(recording: Mapping[str, Transcript]) -> ProbeResult:
    """During a slow prefill (first content after ``SLOW_FIRST_S``), the
    response head comes at least ``HEAD_LEAD_S`` before the first content, so
    a client (and every proxy on the way) hears the request was taken.

    Spec: docs/upstreams.md, "When the client's status is sent"; WHATWG
    HTML, "9.2 Server-sent events" (a stream's head, then comments keep it
    alive).
    """
    t = _graded(recording, names.SLOW_PREFILL)
    if isinstance(t, ProbeResult):
        return t
    first = t.ttft_s if t.ttft_s is not None else t.elapsed_s
    if first < SLOW_FIRST_S:
        return not_observable(f"first content after {first:.2f} s: too quick to tell")
    if t.head_s is None:
        return fail("no head time was recorded")
    if t.head_s > first - HEAD_LEAD_S:
        return fail(f"head after {t.head_s:.2f} s, first content after {first:.2f} s")
    return passed(f"head after {t.head_s:.2f} s, first content after {first:.2f} s")


def _cached(usage: Any) -> tuple[int | None, str | None]:
    """``(cached tokens or None when unsaid, problem)`` of a chat usage."""
    if not isinstance(usage, dict):
        return None, f"usage {clip(usage)}"
    details = usage.get("prompt_tokens_details")
    if details is None or (
        isinstance(details, dict) and "cached_tokens" not in details
    ):
        return None, None
    cached = details.get("cached_tokens") if isinstance(details, dict) else details
    prompt = usage.get("prompt_tokens")
    if cached is None:
        return None, None
    if (
        type(cached) is not int
        or not isinstance(prompt, int)
        or not 0 <= cached <= prompt
    ):
        return None, f"cached_tokens {cached!r} of prompt_tokens {prompt!r}"
    return cached, None


def cached_tokens(recording: Mapping[str, Transcript]) -> ProbeResult:
    """A prompt sent three times in a row says its cached tokens
    (``usage.prompt_tokens_details.cached_tokens``, 0 to the prompt's tokens)
    alike in its second answer (not streamed) and third (streamed): where one
    reports a cache hit, so does the other.

    Spec: OpenAI API reference, "The chat completion object"
    (``usage.prompt_tokens_details``); vLLM, SGLang and llama.cpp's server
    report it the same way.
    """
    got: dict[str, int | None] = {}
    for key in (names.CACHED_PLAIN, names.CACHED_STREAM):
        t = _graded(recording, key)
        if isinstance(t, ProbeResult):
            return t
        if t.streamed:
            chunks = [c for _, c in parse(t).chunks]
            usage = chunks[-1].get("usage") if chunks else None
        else:
            usage = plain(t)[1]
        value, problem = _cached(usage)
        if problem:
            return fail(f"{key}: {problem}")
        got[key] = value
    hits = {k: v for k, v in got.items() if v}
    if not hits:
        return not_observable(f"no cache hit reported on a repeated prompt: {got}")
    if len(hits) < len(got):
        return fail(f"one answer reports the cache hit, the other not: {got}")
    return passed(f"cached_tokens {got}")


def resume_past_end(recording: Mapping[str, Transcript]) -> ProbeResult:
    """A resumable stream's resume at its last event id, once it ended, is
    answered with a status other than 200 (an ``EventSource`` stops), or a 200
    with a terminal event; never an empty 200 it reconnects to for ever.

    Spec: WHATWG HTML, "9.2.3 Processing model" (any status but 200 fails the
    connection, for good); docs/resumable-streams.md.
    """
    return _past_end(
        recording,
        names.RESUMABLE,
        names.RESUME_PAST_END,
        lambda data: data == "[DONE]" or '"error"' in data,
        "the stream carried no event ids: not resumable",
    )


def responses_resume_past_end(recording: Mapping[str, Transcript]) -> ProbeResult:
    """A stored Responses stream resumed after its last event
    (``starting_after`` its last ``sequence_number``), once it ended, is
    answered with a status other than 200, or a 200 with a terminal event;
    never an empty 200.

    Spec: OpenAI API reference, "Retrieve a model response" (``stream``,
    ``starting_after``); WHATWG HTML, "9.2.3 Processing model";
    docs/apis.md, "Stored responses".
    """
    return _past_end(
        recording,
        names.RESPONSES_RESUMABLE,
        names.RESPONSES_RESUME_PAST_END,
        _responses_terminal,
        "the stream said no response id or sequence numbers: not resumable",
    )


def _responses_terminal(data: str) -> bool:
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    kind = event.get("type") if isinstance(event, dict) else None
    return kind in TERMINAL or kind == "error"


def _past_end(
    recording: Mapping[str, Transcript],
    stream_key: str,
    resume_key: str,
    terminal: Callable[[str], bool],
    unresumable: str,
) -> ProbeResult:
    """The resume-past-end verdict: ``terminal`` tells a 200's last event
    that ends the stream."""
    stream = _graded(recording, stream_key)
    if isinstance(stream, ProbeResult):
        return stream
    resume = recording.get(resume_key)
    if resume is None:
        return not_observable(unresumable)
    if resume.status is None:
        return not_observable(f"{resume_key} got no answer")
    if resume.status != 200:
        return passed(f"{resume.status}: an EventSource stops")
    data = parse(resume).data
    if data and terminal(data[-1]):
        return passed(f"200 ending with {clip(data[-1], 60)}")
    return fail(f"200 with {len(data)} events: {clip(resume.body, 100)}")
