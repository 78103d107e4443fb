from __future__ import annotations

import orjson
import pytest

from sluicegate.core.events import FinishReason, ToolCallFragment, Usage
from sluicegate.core.wire.chunks import (
    MAX_INT,
    MIN_INT,
    Endpoint,
    ResponseHeader,
    chat_chunk,
    completion_chunk,
    dumps,
    error_payload,
    usage_chunk,
    usage_dict,
)
from sluicegate.core.wire.completions import chat_completion, text_completion

CHAT = ResponseHeader("chatcmpl-1", 1700000000, "gemma", Endpoint.CHAT)
CHAT_USAGE = ResponseHeader(
    "chatcmpl-1", 1700000000, "gemma", Endpoint.CHAT, include_usage=True
)
TEXT = ResponseHeader("cmpl-1", 1700000000, "gemma", Endpoint.COMPLETION, n=2)


def test_dumps_is_compact_utf8_and_escapes_control_characters() -> None:
    assert dumps({"a": [1, None], "b": "é\n\r\x00\u2028"}) == (
        '{"a":[1,null],"b":"é\\n\\r\\u0000\u2028"}'.encode()
    )


def test_dumps_writes_finish_reasons_as_wire_strings() -> None:
    assert dumps([FinishReason.STOP, FinishReason.LENGTH]) == b'["stop","length"]'


def test_dumps_rejects_a_lone_surrogate() -> None:
    with pytest.raises(TypeError):
        dumps("\ud800")
    with pytest.raises(TypeError):  # an integer to clamp does not excuse it
        dumps(["\ud800", 2**70])


def test_dumps_writes_an_integer_past_64_bits_as_the_nearest_bound() -> None:
    payload = {"usage": {"a": 2**64, "b": -(2**70), "c": 7}, "n": [2**65, (1, 2**99)]}
    assert orjson.loads(dumps(payload)) == {
        "usage": {"a": MAX_INT, "b": MIN_INT, "c": 7},
        "n": [MAX_INT, [1, MAX_INT]],
    }
    assert payload["usage"] == {"a": 2**64, "b": -(2**70), "c": 7}  # not changed


def test_dumps_clamps_every_integer_once_one_is_past_64_bits() -> None:
    # orjson writes up to 2**64 - 1 as it is; once a frame needs the clamp,
    # every integer of it is within the signed range (one bound for a frame).
    usage = usage_chunk(CHAT, Usage(2**63 + 5, 2**64))
    assert orjson.loads(dumps(usage))["usage"] == {
        "prompt_tokens": MAX_INT,
        "completion_tokens": MAX_INT,
        "total_tokens": MAX_INT,
    }
    assert orjson.loads(dumps(usage_chunk(CHAT, Usage(MAX_INT, 1))))["usage"] == {
        "prompt_tokens": MAX_INT,
        "completion_tokens": 1,
        "total_tokens": MAX_INT + 1,  # orjson writes it: no clamp needed
    }


def test_chat_chunk_has_openai_fields_in_order() -> None:
    chunk = chat_chunk(CHAT, 0, {"content": "Hi"})
    assert chunk == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gemma",
        "choices": [
            {
                "index": 0,
                "delta": {"content": "Hi"},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    assert list(chunk) == ["id", "object", "created", "model", "choices"]


def test_chat_finish_chunk_has_empty_delta_and_reason() -> None:
    chunk = chat_chunk(CHAT, 0, {}, FinishReason.LENGTH)
    assert chunk["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    ]


def test_chat_chunk_copies_the_delta() -> None:
    delta = {"content": "a"}
    chunk = chat_chunk(CHAT, 0, delta)
    delta["content"] = "b"
    assert chunk["choices"][0]["delta"] == {"content": "a"}


def test_include_usage_puts_usage_null_on_every_chunk() -> None:
    assert chat_chunk(CHAT_USAGE, 0, {"role": "assistant"})["usage"] is None
    assert "usage" not in chat_chunk(CHAT, 0, {"role": "assistant"})


def test_system_fingerprint_is_sent_only_when_known() -> None:
    header = ResponseHeader("c", 1, "m", Endpoint.CHAT, system_fingerprint="fp_1")
    chunk = chat_chunk(header, 0, {})
    assert list(chunk)[:5] == ["id", "object", "created", "model", "system_fingerprint"]
    assert chunk["system_fingerprint"] == "fp_1"
    assert "system_fingerprint" not in chat_chunk(CHAT, 0, {})


def test_completion_chunk_has_text_and_logprobs() -> None:
    chunk = completion_chunk(TEXT, 1, "é", FinishReason.STOP)
    assert chunk == {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1700000000,
        "model": "gemma",
        "choices": [
            {"index": 1, "text": "é", "logprobs": None, "finish_reason": "stop"}
        ],
    }


def test_usage_dict_adds_total_tokens() -> None:
    assert usage_dict(Usage(9, 11)) == {
        "prompt_tokens": 9,
        "completion_tokens": 11,
        "total_tokens": 20,
    }


def test_usage_dict_names_cached_prompt_tokens_only_when_there_are_some() -> None:
    assert usage_dict(Usage(9, 11, cached_tokens=4))["prompt_tokens_details"] == {
        "cached_tokens": 4
    }
    assert "prompt_tokens_details" not in usage_dict(Usage(9, 11, cached_tokens=0))


@pytest.mark.parametrize("header", [CHAT, CHAT_USAGE, TEXT])
def test_usage_chunk_has_no_choices_and_the_usage(header: ResponseHeader) -> None:
    chunk = usage_chunk(header, Usage(9, 11))
    assert chunk == {
        "id": header.id,
        "object": header.endpoint.value,
        "created": 1700000000,
        "model": "gemma",
        "choices": [],
        "usage": {"prompt_tokens": 9, "completion_tokens": 11, "total_tokens": 20},
    }


def test_chat_completion_response() -> None:
    response = chat_completion(
        CHAT, [("Hi", FinishReason.STOP), ("", FinishReason.LENGTH)], Usage(3, 2)
    )
    assert response == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "gemma",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi"},
                "logprobs": None,
                "finish_reason": "stop",
            },
            {
                "index": 1,
                "message": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": "length",
            },
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def test_text_completion_response() -> None:
    response = text_completion(TEXT, [("a", FinishReason.LENGTH)], Usage(1, 1))
    assert response == {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1700000000,
        "model": "gemma",
        "choices": [
            {"index": 0, "text": "a", "logprobs": None, "finish_reason": "length"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def test_error_payload_has_the_openai_error_shape() -> None:
    assert error_payload("engine died", "server_error", code="engine_error") == {
        "error": {
            "message": "engine died",
            "type": "server_error",
            "param": None,
            "code": "engine_error",
        }
    }
    assert orjson.loads(dumps(error_payload("bad", "invalid_request_error", "n"))) == {
        "error": {
            "message": "bad",
            "type": "invalid_request_error",
            "param": "n",
            "code": None,
        }
    }


def test_a_whole_chat_completion_has_its_reasoning_and_its_calls() -> None:
    header = ResponseHeader("chatcmpl-1", 1, "m", Endpoint.CHAT, 2)
    call = ToolCallFragment(0, "call_1", "get", '{"a": 1}')
    response = chat_completion(
        header,
        [("", FinishReason.TOOL_CALLS), ("hi", FinishReason.STOP)],
        Usage(3, 4),
        tool_calls=[(call,), ()],
        reasoning=["why", ""],
    )
    first, second = (choice["message"] for choice in response["choices"])
    assert first == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "why",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get", "arguments": '{"a": 1}'},
            }
        ],
    }
    assert second == {"role": "assistant", "content": "hi", "reasoning_content": None}
