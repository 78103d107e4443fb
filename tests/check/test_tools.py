"""The tool-call and structured-output probes, one broken rule at a time.

Each case edits one exchange of the vendored good recording (recorded from the
real default model) and names the probe that must fail and why.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluicegate.check import names, tools
from sluicegate.check.record import (
    TOOL_CUT_MAX_TOKENS,
    TOOL_MAX_TOKENS,
    TOOL_PROMPT,
    WEATHER_TOOL,
)
from sluicegate.check.transcript import Transcript, load_recording
from sluicegate.check.verdicts import ProbeResult, Verdict
from tests.server.test_reasoning import scripted_app

GOOD = load_recording(
    (Path(__file__).parent / "transcripts" / "good.json").read_bytes()
)


def edited(key: str, old: str, new: str) -> dict[str, Transcript]:
    """The good recording with ``old`` replaced by ``new`` in one body."""
    return edited_in(GOOD, key, old, new)


def edited_in(
    recording: dict[str, Transcript], key: str, old: str, new: str
) -> dict[str, Transcript]:
    """``recording`` with ``old`` replaced by ``new`` in one body."""
    body = recording[key].body.decode()
    assert old in body, (key, old, body)
    new_body = body.replace(old, new).encode()
    return {**recording, key: replace(recording[key], body=new_body)}


def first_fragment_of(recording: dict[str, Transcript]) -> str:
    body = recording[names.TOOLS].body.decode()
    start = body.index('{"index":0,"id"')
    return body[start : body.index("}}]", start) + 2]


def verdict(result: ProbeResult, want: Verdict, evidence: str) -> None:
    assert result.verdict is want, result
    assert evidence in result.evidence, result


HEAD = first_fragment_of(GOOD)
CALL_ID = HEAD.split('"id":"')[1].split('"')[0]


@pytest.mark.parametrize(
    ("old", "new", "evidence"),
    [
        (HEAD, HEAD.replace('"index":0', '"index":1'), "index 1 before index 0"),
        (HEAD, HEAD.replace('"type":"function",', ""), "without id, type or name"),
        (HEAD, HEAD.replace('"name":"get_weather"', '"name":""'), "without id"),
        (HEAD, HEAD.replace('"index":0', '"index":"0"'), "without an integer index"),
        ('{"arguments":"{"}', '{"arguments":7}', "arguments are not a string"),
        (
            '{"index":0,"function":{"arguments":"{"}}',
            '{"index":0,"function":{"arguments":"{"}},' + HEAD.replace("0", "1", 1),
            f"id {CALL_ID!r} again",
        ),
        (
            '{"index":0,"function":{"arguments":"{"}}',
            '{"index":0,"function":{"name":"get_weather","arguments":"{"}}',
            "name sent again",
        ),
    ],
)
def test_each_broken_fragment_rule_fails_the_deltas_probe(
    old: str, new: str, evidence: str
) -> None:
    verdict(
        tools.tool_call_deltas(edited(names.TOOLS, old, new)), Verdict.FAIL, evidence
    )


def test_a_null_head_key_in_a_later_fragment_counts_as_absent() -> None:
    old = '{"index":0,"function":{"arguments":"{"}}'
    new = '{"index":0,"id":null,"type":null,"function":{"arguments":"{"}}'
    result = tools.tool_call_deltas(edited(names.TOOLS, old, new))
    verdict(result, Verdict.PASS, "fragments")


def test_calls_that_differ_only_in_spacing_agree_as_parsed_json() -> None:
    recording = edited(names.TOOLS_PLAIN, '\\"city\\": ', '\\"city\\":')
    result = tools.tool_calls_agree(recording)
    verdict(result, Verdict.PASS, "as parsed JSON")
    verdict(tools.tool_calls_agree(GOOD), Verdict.PASS, "byte for byte")


def test_answers_without_calls_are_not_observable_for_the_call_probes() -> None:
    cut = {
        names.TOOLS: GOOD[names.TOOLS_CUT],
        names.TOOLS_PLAIN: GOOD[names.TOOLS_CUT_PLAIN],
    }
    for probe in (tools.tool_calls_agree, tools.tool_arguments_valid):
        verdict(probe(cut), Verdict.NOT_OBSERVABLE, "neither answer made a call")


def test_other_statuses_than_200_fail_and_4xx_is_not_observable() -> None:
    broken = {**GOOD, names.TOOLS_PLAIN: replace(GOOD[names.TOOLS_PLAIN], status=500)}
    verdict(tools.tool_calls_agree(broken), Verdict.FAIL, "tools_plain answered 500")
    cut = {**GOOD, names.TOOLS_CUT: replace(GOOD[names.TOOLS_CUT], status=503)}
    verdict(tools.tool_call_deltas(cut), Verdict.FAIL, "tools_cut answered 503")
    declined = {**GOOD, names.TOOLS: replace(GOOD[names.TOOLS], status=400)}
    result = tools.tool_call_deltas(declined)  # the cut stream made no call
    verdict(result, Verdict.NOT_OBSERVABLE, "no call streamed")


def test_a_call_with_text_beside_it_or_no_call_fails_the_finish_probe() -> None:
    text = edited(names.TOOLS_PLAIN, '"content":null', '"content":"Sure."')
    verdict(tools.tool_call_finish(text), Verdict.FAIL, "content beside the call")
    no_call = edited(names.TOOLS_PLAIN, '"tool_calls":[', '"ignored":[')
    verdict(tools.tool_call_finish(no_call), Verdict.FAIL, "no call, though")
    cut = edited(
        names.TOOLS_CUT_PLAIN,
        '"finish_reason":"length"',
        '"finish_reason":"tool_calls"',
    )
    verdict(tools.tool_call_finish(cut), Verdict.FAIL, "tools_cut_plain: finish_reason")
    both = "tools: tool_calls; tools_plain: tool_calls"
    verdict(tools.tool_call_finish(GOOD), Verdict.PASS, both)


THINKING = [b"<think>", *[b" step"] * (TOOL_MAX_TOKENS + 8)]
"""A thinking model that reasons past every ``max_tokens`` the recorder asks."""


async def _tool_exchanges(tokens: list[bytes]) -> dict[str, Transcript]:
    """The four tool exchanges, as ``check`` sends them, answered by sluicegate
    serving a scripted model that says ``tokens``."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    call: dict[str, Any] = {
        "model": "scripted",
        "messages": [{"role": "user", "content": TOOL_PROMPT}],
        "tools": [WEATHER_TOOL],
        "tool_choice": choice,
        "temperature": 0,
        "max_tokens": TOOL_MAX_TOKENS,
    }
    cut = {**call, "max_tokens": TOOL_CUT_MAX_TOKENS}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    app = scripted_app(tokens)
    out = {}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t/v1/"
    ) as http:
        for name, body in (
            (names.TOOLS, {**call, **usage}),
            (names.TOOLS_PLAIN, call),
            (names.TOOLS_CUT, {**cut, **usage}),
            (names.TOOLS_CUT_PLAIN, cut),
        ):
            answer = await http.post("chat/completions", json=body)
            out[name] = Transcript(
                request=body,
                path="chat/completions",
                status=answer.status_code,
                headers=dict(answer.headers),
                body=answer.content,
            )
    return out


@pytest.mark.anyio
async def test_an_answer_cut_inside_its_reasoning_is_not_a_finish_failure() -> None:
    """A thinking model cut by max_tokens before it called: reasoning, finish
    length and (not streamed) ``content: ""``; the probe failed it as text
    beside the call, though nothing of the call could be seen yet."""
    recording = await _tool_exchanges(THINKING)
    message = json.loads(recording[names.TOOLS_PLAIN].body)["choices"][0]
    assert message["finish_reason"] == "length"
    assert message["message"]["reasoning_content"]
    assert not message["message"]["content"]
    result = tools.tool_call_finish(recording)
    verdict(result, Verdict.NOT_OBSERVABLE, "inside their reasoning")
    # One answer that can be judged is: text where the call should be fails.
    spoken = edited_in(recording, names.TOOLS_PLAIN, '"content":""', '"content":"Hi"')
    verdict(tools.tool_call_finish(spoken), Verdict.FAIL, "content beside the call")


@pytest.mark.parametrize(
    ("old", "new", "evidence"),
    [
        ('\\"Paris\\", \\"unit\\": \\"c\\"}', '\\"Paris\\"', "not a JSON object"),
        ('\\"unit\\": \\"c\\"', '\\"unit\\": \\"k\\"', "is not one of ['c', 'f']"),
        ('"name":"get_weather"', '"name":"get_time"', "not an offered function"),
    ],
)
def test_bad_arguments_or_an_unknown_function_fail_the_arguments_probe(
    old: str, new: str, evidence: str
) -> None:
    result = tools.tool_arguments_valid(edited(names.TOOLS_PLAIN, old, new))
    verdict(result, Verdict.FAIL, evidence)


def test_structured_output_that_is_not_json_fails_and_a_cut_one_is_unseen() -> None:
    prose = edited(names.SCHEMA_PLAIN, '"content":"{', '"content":"A cat: {')
    verdict(tools.structured_output(prose), Verdict.FAIL, "the content is not JSON")
    cut = edited(
        names.SCHEMA_PLAIN, '"finish_reason":"stop"', '"finish_reason":"length"'
    )
    verdict(tools.structured_output(cut), Verdict.NOT_OBSERVABLE, "max_tokens")


def test_every_tool_probe_names_a_function_calling_or_structured_output_source() -> (
    None
):
    from sluicegate.check.probes import describe

    probes: list[Any] = [getattr(tools, name) for name in tools.__all__]
    for probe in probes:
        _, rule, source = describe(probe)
        assert rule
        assert source.startswith("OpenAI API reference"), source
