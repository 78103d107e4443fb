"""Bodies drawn from the request schemas never get a 5xx, and every answer is whole.

Hypothesis reads the JSON schema of ``ChatCompletionRequest`` and
``CompletionRequest`` (``server/schemas/chat.py``; the refused parameters are in
``server/schemas/parse.py``) and draws bodies from it: each field gets a value of its
schema, one at or just past a bound of it, a value of another JSON type,
``null``, an array or object nested up to past the parser's 1,024 levels, a huge
string or number, or a string of non-ASCII digits; bodies carry unknown fields
too, up to past their cap, and sometimes the body is no object at all. The JSON
text is written here, not by ``json.dumps``, so a value may be nested deeper
than Python recurses.

Each body goes to both endpoints, as a stream and not, through the raw ASGI
fakes (``asgi.py``) and the scripted engine. Every answer must be below 500; a
4xx has the OpenAI error shape and a bounded message; a 200 stream ends with
exactly one ``data: [DONE]`` and no error, or with one in-band error event and
nothing after it; a 200 JSON answer has its choices.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.schemas import parse as request_parse
from sluicegate.server.schemas.chat import ChatCompletionRequest, CompletionRequest

from .asgi import CHAT, COMPLETIONS, Exchange

EXAMPLES = 150
"""Bodies per endpoint and mode (stream or not); the four tests take 15 s on this
project's 2-core machine, about twice that while other work shares it."""
MAX_MESSAGE_CHARS = 2000
"""An error message echoes a bounded part of the value seen; the values drawn
here reach 200,000 characters."""
EXCHANGE_TIMEOUT_S = 30.0
"""A liveness deadline for one request (the scripted engine has no pace here)."""
MODEL_ID = "scripted"

MODELS: dict[str, type[BaseModel]] = {
    CHAT: ChatCompletionRequest,
    COMPLETIONS: CompletionRequest,
}
# Refused unless left at their default; checked before validation, echoing values.
UNSUPPORTED: dict[str, tuple[str, ...]] = {
    CHAT: tuple(request_parse._CHAT_UNSUPPORTED),
    COMPLETIONS: tuple(request_parse._COMPLETION_UNSUPPORTED),
}
# Values a schema's types admit but which almost never serve (any model name is a
# string): a few that do, beside what the schema gives.
HINTS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from([MODEL_ID, "default", "other"]),
    "logit_bias": st.dictionaries(
        st.integers(0, 400).map(str), st.floats(-100, 100), max_size=3
    ),
    "content": st.text(max_size=12),
    # Empty prompts, ids past the vocabulary and turns out of order are refused;
    # these are well-formed (beside what the schema gives).
    "prompt": st.one_of(
        st.text(min_size=1, max_size=12),
        st.lists(st.integers(0, 300), min_size=1, max_size=4),
        st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=3),
        st.lists(st.lists(st.integers(0, 300), min_size=1, max_size=3), max_size=3),
        st.just(""),
        st.lists(st.integers(-(2**40), 2**40), max_size=3),
    ),
    "messages": st.one_of(
        st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["system", "user", "assistant"]),
                    "content": st.text(max_size=12),
                }
            ),
            max_size=3,
        ),
        st.integers(1, 3).map(
            lambda turns: [
                {"role": ["user", "assistant"][i % 2], "content": f"m{i}"}
                for i in range(2 * turns - 1)
            ]
        ),
        st.just([{"role": "user", "content": "Hi"}]),
    ),
}

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
# Mostly just under the parser's 1,024 levels (deeper than repr() recurses).
DEPTHS = st.sampled_from([2, 500, 900, 980, 990, 1000, 1010, 1020, 1024, 1100])
HUGE_NUMBERS = st.sampled_from(
    [
        "1" * 400,
        "9" * 5000,  # past int()'s 4,300-digit limit
        "-" + "9" * 5000,
        "18446744073709551616",  # 2**64
        "-9223372036854775809",  # -2**63 - 1
        "1e400",
        "-1e400",
        "1.7976931348623157e308",
        "4.9e-324",
        "0." + "0" * 3000 + "1",
        "1" + "0" * 30 + ".5",
    ]
)
DIGITS = st.sampled_from(
    [
        "\N{SUPERSCRIPT TWO}",  # str.isdigit(), but int() refuses it
        "\N{ARABIC-INDIC DIGIT ONE}",  # int() reads it as 1
        "\N{ARABIC-INDIC DIGIT ONE}\N{ARABIC-INDIC DIGIT TWO}",
        "\N{FULLWIDTH DIGIT ONE}\N{FULLWIDTH DIGIT TWO}",
        "\N{DEVANAGARI DIGIT SEVEN}",
        "\N{MATHEMATICAL BOLD DIGIT ONE}",
        "\N{ROMAN NUMERAL TWELVE}",
        "1\N{COMBINING ACUTE ACCENT}",
        "1_000",
        " 7",
        "0x10",
    ]
)


def _text(value: Any) -> str:
    """JSON text of a value small enough for ``json.dumps``."""
    return json.dumps(value, ensure_ascii=False)


def _deep(depth: int, leaf: str, kind: str) -> str:
    if kind == "array":
        return "[" * depth + leaf + "]" * depth
    return '{"a": ' * depth + leaf + "}" * depth


@st.composite
def _nested(draw: st.DrawFn) -> str:
    """An array or object nested ``depth`` levels around a leaf."""
    depth = draw(DEPTHS)
    leaf = draw(st.sampled_from(["", "1", '"x"', "null", "{}"]))
    kind = draw(st.sampled_from(["array", "object"]))
    if kind == "object" and not leaf:
        leaf = "1"
    return _deep(depth, leaf, kind)


@st.composite
def _huge_string(draw: st.DrawFn) -> str:
    piece = draw(st.sampled_from(["a", "\N{HORIZONTAL ELLIPSIS}", "<eos>", "7", "😀"]))
    chars = draw(st.sampled_from([1001, 20_000, 200_000]))
    return _text(piece * (chars // len(piece)))


def _schema_values(node: Mapping[str, Any] | bool, defs: Mapping[str, Any]) -> Any:
    """Python values of one JSON schema node (a subset: what pydantic writes)."""
    if isinstance(node, bool):  # ``true``: any value; ``false``: none
        return JSON if node else st.nothing()
    if "$ref" in node:
        return _schema_values(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in node:
        return st.one_of([_schema_values(n, defs) for n in node["anyOf"]])
    if "const" in node:
        return st.just(node["const"])
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return st.text(max_size=12)
    if kind == "integer":
        low = node.get("minimum", node.get("exclusiveMinimum", -11) + 1)
        high = node.get("maximum", node.get("exclusiveMaximum", low + 12) - 1)
        wide = st.integers(low, max(high, low + 2**40))
        return st.one_of(*[st.integers(low, high)] * 4, wide)
    if kind == "number":
        return st.floats(
            node.get("minimum", node.get("exclusiveMinimum", -3.0)),
            node.get("maximum", node.get("exclusiveMaximum", 3.0)),
            exclude_min="exclusiveMinimum" in node,
            exclude_max="exclusiveMaximum" in node,
        )
    if kind == "array":
        items = _schema_values(node.get("items", {}), defs)
        low = node.get("minItems", 0)
        return st.lists(items, min_size=low, max_size=min(node.get("maxItems", 4), 4))
    if kind == "object" and "properties" in node:
        required = set(node.get("required", ()))
        fields = {
            name: HINTS[name] if name in HINTS else _schema_values(sub, defs)
            for name, sub in node["properties"].items()
        }
        return st.fixed_dictionaries(
            {k: v for k, v in fields.items() if k in required},
            optional={k: v for k, v in fields.items() if k not in required},
        )
    if kind == "object":
        values = _schema_values(node.get("additionalProperties", {}), defs)
        keys = st.text(max_size=5) | st.integers(0, 400).map(str)
        return st.dictionaries(keys, values, max_size=3)
    return JSON


def _bounds(node: Mapping[str, Any], defs: Mapping[str, Any]) -> list[str]:
    """JSON texts at and just past each bound the node states."""
    if "$ref" in node:
        return _bounds(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in node:
        return [t for n in node["anyOf"] for t in _bounds(n, defs)]
    out = []
    for name, step in (
        ("minimum", -1),
        ("maximum", 1),
        ("exclusiveMinimum", 0),
        ("exclusiveMaximum", 0),
    ):
        if name in node:
            bound = node[name]
            out.append(_text(bound))
            if node.get("type") == "integer":
                out.append(_text(bound + step))
            else:
                out.append(_text(math.nextafter(bound, bound + (step or -1))))
                out.append(_text(math.nextafter(bound, bound - (step or -1))))
    if "maxItems" in node:
        out.append(_text(["x"] * (node["maxItems"] + 1)))
    if "minItems" in node and node["minItems"] > 0:
        out.append("[]")
    return out


@st.composite
def _field_text(
    draw: st.DrawFn, name: str, node: Mapping[str, Any], defs: Any, schema_share: int
) -> str:
    """JSON text of one field's value: of its schema ``schema_share`` times in
    ``schema_share + 10``, else at a bound or hostile."""
    bounds = _bounds(node, defs)
    kind = draw(
        st.sampled_from(
            ["schema"] * schema_share
            + ["bound"] * (2 if bounds else 0)
            + ["json", "null", "nested", "nested", "nested", "huge", "number"]
            + ["digits"]
        )
    )
    if kind == "schema":
        values = HINTS[name] if name in HINTS else _schema_values(node, defs)
        return _text(draw(values))
    if kind == "bound":
        return draw(st.sampled_from(bounds))
    if kind == "json":
        return _text(draw(JSON))
    if kind == "null":
        return "null"
    if kind == "nested":
        return draw(_nested())
    if kind == "huge":
        return draw(_huge_string())
    if kind == "number":
        return draw(HUGE_NUMBERS)
    digits = draw(DIGITS)
    return draw(st.sampled_from([_text(digits), _text({digits: 1}), _text([digits])]))


@st.composite
def _unknown_names(draw: st.DrawFn) -> list[str]:
    """Unknown parameter names: none, a few, a huge one, or past the cap."""
    kind = draw(st.sampled_from(["none"] * 3 + ["few", "huge", "many"]))
    if kind == "none":
        return []
    if kind == "few":
        return draw(st.lists(st.text(min_size=1, max_size=10), max_size=4))
    if kind == "huge":
        return ["x" * draw(st.sampled_from([65, 10_000, 100_000]))]
    count = draw(st.sampled_from([request_parse.MAX_UNKNOWN_PARAMETERS, 65, 1000]))
    return [f"u{i}" for i in range(count)]


@st.composite
def _body(draw: st.DrawFn, path: str, stream: bool) -> bytes:
    """The JSON text of one request body for ``path``."""
    whole = draw(st.sampled_from(["object"] * 12 + ["json", "nested", "empty"]))
    if whole == "json":
        return _text(draw(JSON)).encode()
    if whole == "nested":
        return draw(_nested()).encode()
    if whole == "empty":
        return b"{}"
    schema = MODELS[path].model_json_schema()
    defs = schema.get("$defs", {})
    fields: dict[str, Mapping[str, Any]] = {
        **schema["properties"],
        **{name: {} for name in UNSUPPORTED[path]},
    }
    # "clean": every value of its schema (most serve); "one": one hostile value;
    # "many": any field may be hostile.
    mode = draw(st.sampled_from(["clean", "one", "many"]))
    names = [*schema["required"]]
    optional = set(fields) - set(names)
    if mode == "clean":
        optional -= set(UNSUPPORTED[path])
    names += draw(st.lists(st.sampled_from(sorted(optional)), max_size=8))
    hostile = draw(st.sampled_from(names)) if mode == "one" else None
    parts: dict[str, str] = {"stream": _text(stream)}
    for name in names:
        if mode == "clean" or (mode == "one" and name != hostile):
            values = (
                HINTS[name] if name in HINTS else _schema_values(fields[name], defs)
            )
            parts[name] = _text(draw(values))
        else:
            share = 6 if mode == "many" else 0
            parts[name] = draw(_field_text(name, fields[name], defs, share))
    if mode == "many" and draw(st.integers(0, 4)) == 0:  # a required field left out
        del parts[schema["required"][0]]
    for name in draw(_unknown_names()) if mode != "clean" else []:
        parts.setdefault(name, _text(1))
    return (
        "{" + ", ".join(f"{_text(k)}: {v}" for k, v in parts.items()) + "}"
    ).encode()


async def _exchange(path: str, body: bytes) -> Exchange:
    engine = ScriptedEngine("Hi there<end_of_turn>", tokens_per_s=float("inf"))
    ex = Exchange(create_app(engine, ServerConfig(default_max_tokens=8)), path, body)
    with anyio.fail_after(EXCHANGE_TIMEOUT_S):
        await ex.run()
    return ex


def _check(ex: Exchange, body: bytes) -> None:
    shown = body[:300]
    assert ex.completed, (ex.messages[:2], shown)
    status = ex.status
    assert status is not None, shown
    assert status < 500, (status, ex.body[:500], shown)
    content_type = dict(ex.headers).get(b"content-type", b"")
    if status >= 400:
        assert content_type == b"application/json", (status, ex.body[:300])
        error = json.loads(ex.body)["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str)
        assert len(error["message"]) <= MAX_MESSAGE_CHARS, error["message"][:300]
        assert isinstance(error["type"], str)
        assert error["param"] is None or isinstance(error["param"], str)
        assert error["code"] is None or isinstance(error["code"], str)
        return
    assert status == 200, (status, shown)
    if content_type.startswith(b"text/event-stream"):
        events = ex.events()  # the core's strict decoder: whole events only
        assert events, shown
        if ex.done_count() == 0:
            ex.only_error()  # one in-band error event, and it is the last
        else:
            assert ex.done_count() == 1, ex.body[-300:]
            assert events[-1].data == "[DONE]", ex.body[-300:]
            assert not [p for p in ex.payloads() if "error" in p], ex.body[-300:]
    else:
        answer = json.loads(ex.body)
        assert answer["choices"], answer


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_bodies_drawn_from_the_schema_never_get_a_server_error(
    path: str, stream: bool
) -> None:
    statuses: set[int] = set()

    @settings(
        max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(_body(path, stream))
    def run(body: bytes) -> None:
        ex = anyio.run(_exchange, path, body)
        _check(ex, body)
        assert ex.status is not None
        statuses.add(ex.status)

    run()
    # Not all refused: the bodies reach the engine and the response code too.
    assert {200, 400} <= statuses, statuses


@pytest.mark.anyio
async def test_the_fuzzer_draws_every_field_of_the_served_openapi_schema() -> None:
    """The schemas drawn from cover what ``GET /openapi.json`` says each endpoint
    takes."""
    engine = ScriptedEngine()
    app = create_app(engine, ServerConfig())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.get("/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path, model in MODELS.items():
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]
        served = set(schema["schema"]["properties"])
        drawn = {*model.model_json_schema()["properties"], *UNSUPPORTED[path]}
        assert served <= drawn, sorted(served - drawn)
        assert set(schema["schema"]["required"]) == set(
            model.model_json_schema()["required"]
        )
