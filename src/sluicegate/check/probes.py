"""The conformance probes, in the order ``check`` reports them, and their runner.

``run_probes`` is pure: a recording in, one ``ProbeResult`` per probe out, each
with the probe's rule (the first paragraph of its docstring) and its source (the
``Spec:`` paragraph).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import replace

from sluicegate.check import (
    fidelity,
    framing,
    messages_probes,
    reasoning,
    reasoning_events,
    responses_probes,
    semantics,
    tools,
)
from sluicegate.check.transcript import Transcript
from sluicegate.check.verdicts import Probe, ProbeResult, Verdict

__all__ = [
    "API_PROBES",
    "MESSAGES_PROBES",
    "PROBES",
    "RESPONSES_PROBES",
    "describe",
    "failed",
    "run_probes",
]

PROBES: tuple[Probe, ...] = (
    framing.content_type,
    framing.anti_buffering,
    framing.framing,
    framing.role_first,
    framing.not_cumulative,
    framing.finish_reason_once,
    framing.done_once_last,
    framing.same_ids,
    framing.end_states,
    semantics.usage_included,
    semantics.usage_absent,
    semantics.multibyte_text,
    semantics.stop_strings,
    semantics.max_tokens_one,
    semantics.n_choices,
    semantics.rejects_invalid,
    semantics.disconnect_then_serve,
    tools.tool_calls_agree,
    tools.tool_call_deltas,
    tools.tool_call_finish,
    tools.tool_arguments_valid,
    tools.structured_output,
    reasoning.reasoning_framing,
    fidelity.continuous_usage,
    fidelity.parallel_tool_calls,
    fidelity.time_to_headers,
    fidelity.cached_tokens,
    fidelity.resume_past_end,
)
RESPONSES_PROBES: tuple[Probe, ...] = (
    *(getattr(responses_probes, name) for name in responses_probes.__all__),
    reasoning_events.responses_reasoning_framing,
    fidelity.responses_resume_past_end,
)
MESSAGES_PROBES: tuple[Probe, ...] = (
    *(getattr(messages_probes, name) for name in messages_probes.__all__),
    reasoning_events.messages_reasoning_framing,
)
API_PROBES: dict[str, tuple[Probe, ...]] = {
    "chat": PROBES,
    "responses": RESPONSES_PROBES,
    "messages": MESSAGES_PROBES,
    "all": PROBES + RESPONSES_PROBES + MESSAGES_PROBES,
}
"""The probes ``check --api`` runs for each choice."""

_PREFIXES = {"responses": "responses_", "messages": "messages_"}
"""The name prefix of each API's exchanges but chat's (``record_events.py``)."""


def split_recording(
    recording: Mapping[str, Transcript],
) -> dict[str, dict[str, Transcript]]:
    """A recording's exchanges by API: ``chat``, ``responses``, ``messages``
    (an exchange is chat's unless its name has another API's prefix)."""
    parts: dict[str, dict[str, Transcript]] = {api: {} for api in API_PROBES}
    del parts["all"]
    for name, transcript in recording.items():
        api = next((a for a, p in _PREFIXES.items() if name.startswith(p)), "chat")
        parts[api][name] = transcript
    return parts


def recorded_api(recording: Mapping[str, Transcript]) -> str:
    """The ``--api`` a recording was made with: its one API, or ``all``."""
    present = [api for api, part in split_recording(recording).items() if part]
    return present[0] if len(present) == 1 else "all"


def run_api_probes(recording: Mapping[str, Transcript], api: str) -> list[ProbeResult]:
    """Grade ``recording`` with ``api``'s probes (``API_PROBES``); for
    ``all``, each API's probes on that API's exchanges only."""
    if api != "all":
        return run_probes(recording, API_PROBES[api])
    parts = split_recording(recording)
    return [
        result
        for name, part in parts.items()
        for result in run_probes(part, API_PROBES[name])
    ]


def describe(probe: Probe) -> tuple[str, str, str]:
    """``(name, rule, source)`` of a probe, from its name and docstring."""
    doc = inspect.getdoc(probe) or ""
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n") if p.strip()]
    rule = paragraphs[0] if paragraphs else ""
    source = next((p[len("Spec: ") :] for p in paragraphs if p.startswith("Spec:")), "")
    return probe.__name__.replace("_", "-"), rule, source


def run_probes(
    recording: Mapping[str, Transcript], probes: Sequence[Probe] = PROBES
) -> list[ProbeResult]:
    """Grade ``recording`` with every probe, in order.

    Returns:
        One ``ProbeResult`` per probe, named, with its rule and source.
    """
    results = []
    for probe in probes:
        name, rule, source = describe(probe)
        results.append(replace(probe(recording), probe=name, rule=rule, source=source))
    return results


def failed(results: Sequence[ProbeResult]) -> list[ProbeResult]:
    """The results whose verdict is ``fail``."""
    return [r for r in results if r.verdict is Verdict.FAIL]
