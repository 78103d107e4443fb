from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sluicegate.check.probes import PROBES, describe, run_probes
from sluicegate.check.transcript import dump_recording, load_recording
from sluicegate.check.verdicts import Verdict
from sluicegate.cli import main

CORPUS = Path(__file__).parent / "transcripts"
ALL = [describe(p)[0] for p in PROBES]

# The probes each bad transcript must fail; every other probe must not fail.
EXPECTED_FAILS = {
    "good": set(),
    "good_padded": set(),
    "truncated": {
        "finish-reason-once",
        "done-once-last",
        "end-states",
        "usage-included",
    },
    "error_event": {"end-states", "usage-included"},
    "duplicated_done": {"done-once-last"},
    "cumulative_deltas": {"not-cumulative"},
    "usage_every_chunk": {"usage-included"},
    "finish_reason_empty": {"finish-reason-once"},
    "missing_role": {"role-first"},
    "tool_calls_differ": {"tool-calls-agree"},
    "tool_call_head_repeated": {"tool-call-deltas"},
    "tool_finish_stop": {"tool-call-finish"},
    "tool_arguments_invalid": {"tool-arguments-valid"},
    "structured_output_invalid": {"structured-output"},
    "tools_declined": set(),
    "reasoning": set(),
    "reasoning_after_content": {"reasoning-framing"},
}
FIDELITY_PROBES = [describe(p)[0] for p in PROBES if p.__module__.endswith("fidelity")]
TOOL_PROBES = {
    "tool-calls-agree",
    "tool-call-deltas",
    "tool-call-finish",
    "tool-arguments-valid",
    "structured-output",
}


def verdicts(name: str) -> dict[str, Verdict]:
    recording = load_recording((CORPUS / f"{name}.json").read_bytes())
    return {r.probe: r.verdict for r in run_probes(recording)}


def test_the_corpus_is_what_the_table_expects() -> None:
    assert {p.stem for p in CORPUS.glob("*.json")} == set(EXPECTED_FAILS)


@pytest.mark.parametrize("name", sorted(EXPECTED_FAILS))
def test_each_transcript_fails_exactly_its_probes(name: str) -> None:
    got = verdicts(name)
    assert {p for p, v in got.items() if v is Verdict.FAIL} == EXPECTED_FAILS[name]


def test_the_good_recording_passes_every_probe() -> None:
    got = verdicts("good")
    # Recorded from a model that does not reason: nothing to grade there.
    assert got.pop("reasoning-framing") is Verdict.NOT_OBSERVABLE
    # Recorded before the fidelity probes' exchanges existed: those probes are
    # graded on written transcripts (test_fidelity_probes.py).
    for probe in FIDELITY_PROBES:
        assert got.pop(probe) is Verdict.NOT_OBSERVABLE, probe
    assert set(got.values()) == {Verdict.PASS}


def test_a_reasoning_stream_passes_the_reasoning_probe() -> None:
    assert verdicts("reasoning")["reasoning-framing"] is Verdict.PASS


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"content":"Hello"', '"content":"</think>Hello"'),
        ('"reasoning_tokens":2', '"reasoning_tokens":0'),
        ('"reasoning_tokens":2', '"reasoning_tokens":9999'),
    ],
)
def test_a_marker_in_the_content_or_a_wrong_count_fails_the_reasoning_probe(
    old: str, new: str
) -> None:
    recording = load_recording((CORPUS / "reasoning.json").read_bytes())
    stream = recording["stream"]
    assert old.encode() in stream.body
    body = stream.body.replace(old.encode(), new.encode())
    edited = {**recording, "stream": dataclasses.replace(stream, body=body)}
    got = {r.probe: r.verdict for r in run_probes(edited)}
    assert got["reasoning-framing"] is Verdict.FAIL


@pytest.mark.parametrize(
    ("old", "new", "want"),
    [
        # Markers the model writes in its answer are its text: the server
        # passes them on (the first end marker ended the reasoning).
        ('"content":"Hello"', '"content":"<think>Hello"', Verdict.PASS),
        ('"content":"Hello"', '"content":"Hello </think> <think>"', Verdict.PASS),
        # Where the reasoning and the answer meet is the server's split.
        ('"content":"Hello"', '"content":" \\n</think>Hello"', Verdict.FAIL),
        ('"reasoning_content":"in words."', '"reasoning_content":"words</think>"',
         Verdict.FAIL),
        ('"reasoning_content":"Count "', '"reasoning_content":"<think>Count "',
         Verdict.FAIL),
    ],
)  # fmt: skip
def test_only_a_marker_where_reasoning_and_answer_meet_fails_the_probe(
    old: str, new: str, want: Verdict
) -> None:
    """The probe failed any ``</think>`` in the answer and an answer opening
    with ``<think>``: a model that writes its markers again in its answer
    failed the server that passed them on as the model wrote them."""
    recording = load_recording((CORPUS / "reasoning.json").read_bytes())
    stream = recording["stream"]
    old_bytes, new_bytes = old.encode(), new.encode()
    assert old_bytes in stream.body
    body = stream.body.replace(old_bytes, new_bytes)
    edited = {**recording, "stream": dataclasses.replace(stream, body=body)}
    got = {r.probe: r for r in run_probes(edited)}
    assert got["reasoning-framing"].verdict is want, got["reasoning-framing"]


def test_a_missing_exchange_is_not_observable_not_a_pass() -> None:
    got = verdicts("missing_role")
    assert got["multibyte-text"] is Verdict.NOT_OBSERVABLE
    assert got["rejects-invalid"] is Verdict.NOT_OBSERVABLE
    assert got["usage-included"] is Verdict.PASS


def test_a_server_that_declines_tools_is_not_observable_not_a_pass() -> None:
    got = verdicts("tools_declined")
    assert {p: got[p] for p in TOOL_PROBES} == dict.fromkeys(
        TOOL_PROBES, Verdict.NOT_OBSERVABLE
    )


def test_the_tool_probes_are_not_observable_without_their_exchanges() -> None:
    got = verdicts("missing_role")
    assert {p: got[p] for p in TOOL_PROBES} == dict.fromkeys(
        TOOL_PROBES, Verdict.NOT_OBSERVABLE
    )


def test_every_probe_states_its_rule_and_source() -> None:
    for probe in PROBES:
        name, rule, source = describe(probe)
        assert rule, name
        assert any(s in source for s in ("OpenAI", "WHATWG", "DESIGN.md")), name


def test_recordings_round_trip_through_json_even_with_bad_utf8() -> None:
    recording = load_recording((CORPUS / "truncated.json").read_bytes())
    stream = recording["stream"]
    broken = {"stream": type(stream)(request=stream.request, body=b"data: \xff\n\n")}
    assert load_recording(dump_recording(broken))["stream"].body == b"data: \xff\n\n"
    assert load_recording(dump_recording(recording)) == recording


@pytest.mark.parametrize(("name", "code"), [("good", 0), ("truncated", 1)])
def test_cli_replay_exits_1_only_when_a_probe_fails(
    name: str, code: int, tmp_path: Path
) -> None:
    out = tmp_path / "verdicts.json"
    args = ["check", "--replay", str(CORPUS / f"{name}.json"), "--json", str(out)]
    assert main(args) == code
    text = out.read_text()
    assert f'"failed": {len(EXPECTED_FAILS[name])}' in text


def test_cli_replay_of_a_missing_file_exits_2(tmp_path: Path) -> None:
    assert main(["check", "--replay", str(tmp_path / "nope.json")]) == 2


@pytest.mark.timeout(120)
def test_check_against_a_keyed_server_without_its_key_says_so_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from .live import serve

    args = ["--engine", "scripted", "--api-key", "sk-good", "--no-ledger"]
    with serve(args, tmp_path / "server.log") as url:
        code = main(["check", url, "--model", "scripted"])
        wrong = main(["check", url, "--model", "scripted", "--api-key", "sk-bad"])
    out = capsys.readouterr().out
    assert (code, wrong) == (2, 2)  # nothing graded, not a pass
    assert "answered 401: pass --api-key" in out
    assert "answered 401: pass a key it accepts" in out
