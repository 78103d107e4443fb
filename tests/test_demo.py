from __future__ import annotations

import io

import orjson

from sluicegate.demo import run_demo


def run(created: int = 1700000000) -> list[str]:
    out = io.StringIO()
    run_demo(out, created=created)
    return out.getvalue().split("\n")


def test_demo_prints_the_naive_decode_with_broken_characters() -> None:
    assert run()[0] == (
        "naive per-token decode: 'Caf\ufffd\ufffd costs 5\ufffd\ufffd.\\n###END more'"
    )


def test_demo_emits_and_holds_as_the_lesson_shows() -> None:
    lines = [line for line in run() if line.startswith("token ")]
    rows = []
    for line in lines:
        token = line.split()[1]
        emit, held = line.split(" emit ")[1].split(" held ")
        held, _, stop = held.partition(" stop ")
        rows.append((token, emit.strip(), held.strip(), stop))
    assert rows == [
        ("1", "'Caf'", "''", ""),
        ("2", "''", "''", ""),
        ("3", "'é'", "''", ""),
        ("4", "' costs'", "''", ""),
        ("5", "' 5'", "''", ""),
        ("6", "''", "''", ""),
        ("7", "'€'", "''", ""),
        ("8", "'.\\n'", "''", ""),
        ("9", "''", "'##'", ""),
        ("10", "''", "'###'", ""),
        ("11", "''", "''", "'###END'"),
    ]
    assert "11 tokens consumed, 6 content events, stopped=True" in run()


def test_demo_frames_are_the_lessons_chat_stream() -> None:
    lines = run(created=42)
    frames = [line for line in lines if line.startswith("data: ")]
    assert frames[-1] == "data: [DONE]"
    chunks = [orjson.loads(line[len("data: ") :]) for line in frames[:-1]]
    assert {(c["id"], c["created"], c["object"]) for c in chunks} == {
        ("chatcmpl-demo", 42, "chat.completion.chunk")
    }
    choices = [c["choices"] for c in chunks]
    assert [(ch[0]["delta"], ch[0]["finish_reason"]) for ch in choices[:-1]] == [
        ({"role": "assistant"}, None),
        ({"content": "Caf"}, None),
        ({"content": "é"}, None),
        ({"content": " costs"}, None),
        ({"content": " 5"}, None),
        ({"content": "€"}, None),
        ({"content": ".\n"}, None),
        ({}, "stop"),
    ]
    assert choices[-1] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 9,
        "completion_tokens": 11,
        "total_tokens": 20,
    }
    # Frames are separated by blank lines, one data line each.
    text = "\n".join(lines)
    assert text.endswith("data: [DONE]\n\n")
    assert text.count("\n\ndata: ") == len(frames)
