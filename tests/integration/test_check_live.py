"""``sluicegate check`` in-process against the session's llama.cpp server,
direct and through a gateway in front of it.

One ``check --api all`` run grades every API on its own exchanges (chat
completions, Responses, Messages): the same exchanges and probes as ``check``
with each ``--api`` on its own, recorded once. Its recording, replayed, grades
alike; the client library reads both event APIs from the same server. The
same run through a gateway (``serve --upstream``) gives every probe the
verdict it gives direct: the hop loses nothing a probe can see.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluicegate.cli import main
from sluicegate.client import Client, StreamResult
from sluicegate.core.endstate import EndState
from sluicegate.model import DEFAULT_MODEL_ID

from .gateway import api_base, start_gateway
from .servers import ServerProcess, StartServer

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp, pytest.mark.timeout(1200)]

EVENT_APIS = ("responses", "messages")
"""The APIs whose probe names start with their name; every other probe is chat's."""


def api_of(probe: dict[str, Any]) -> str:
    prefix = str(probe["probe"]).split("-")[0]
    return prefix if prefix in EVENT_APIS else "chat"


def test_check_all_passes_every_api_on_the_default_model_and_replays_alike(
    llama_server: ServerProcess,
    start_server: StartServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base_url = llama_server.base_url
    live, saved, replayed = (tmp_path / f"{n}.json" for n in ("live", "rec", "rep"))
    argv = ["--api", "all", "--max-tokens", "12", "--prefill-tokens", "20"]
    code = main(["check", base_url, *argv, "--save", str(saved), "--json", str(live)])
    replay_code = main(["check", "--replay", str(saved), "--json", str(replayed)])
    results = _client_streams(base_url)
    gateway = start_gateway(
        start_server, "gateway-check", [api_base(llama_server)], DEFAULT_MODEL_ID
    )
    hop = tmp_path / "gateway.json"
    hop_code = main(["check", gateway.base_url, *argv, "--json", str(hop)])
    out = capsys.readouterr().out

    probes = json.loads(live.read_text())["probes"]
    assert {p["probe"].split("-")[0] for p in probes} >= {*EVENT_APIS, "framing"}
    failures = {p["probe"]: p["evidence"] for p in probes if p["verdict"] == "fail"}
    assert failures == {}, out
    assert code == 0
    assert {p["verdict"] for p in probes} <= {"pass", "not-observable"}, out
    unseen = {p["probe"] for p in probes if p["verdict"] == "not-observable"}
    # The default model does not reason: nothing to grade reasoning on; a
    # 20-token prompt is too quick a prefill to time, and the engine reports
    # no cached tokens of its own.
    chat_unseen = {name for name in unseen if api_of({"probe": name}) == "chat"}
    expected = {"multibyte-text", "reasoning-framing", "time-to-headers"}
    assert chat_unseen <= expected | {"cached-tokens"}, out
    assert unseen - chat_unseen <= {
        "responses-reasoning-framing",
        "messages-reasoning-framing",
    }, out
    assert {api_of(p) for p in probes} == {"chat", *EVENT_APIS}
    # A replay without --api grades what the recording holds: the same verdicts.
    again = json.loads(replayed.read_text())["probes"]
    assert [(p["probe"], p["verdict"]) for p in again] == [
        (p["probe"], p["verdict"]) for p in probes
    ]
    assert replay_code == 0
    for api, result in sorted(results.items()):  # the client library reads both APIs
        assert result.end_state is EndState.FINISHED, (api, result)
        assert result.text
        assert result.usage
        assert result.usage.completion_tokens >= 1
    assert results["messages"].finish_reason == "max_tokens"
    assert results["responses"].finish_reason == "max_output_tokens"
    # Through the gateway: the same verdict for every probe, the same exit code.
    through = json.loads(hop.read_text())["probes"]
    assert _verdicts(through) == _verdicts(probes), out
    assert hop_code == code


def _verdicts(probes: list[Any]) -> dict[str, str]:
    """Each probe's verdict; time-to-headers' not-observable (a first content
    sooner than its threshold this time) read as the pass it is otherwise."""
    verdicts = {p["probe"]: p["verdict"] for p in probes}
    if verdicts.get("time-to-headers") == "not-observable":
        verdicts["time-to-headers"] = "pass"
    return verdicts


def _client_streams(url: str) -> dict[str, StreamResult]:
    with Client(url) as client:
        hi = [{"role": "user", "content": "Count to twenty."}]
        with client.stream_messages(hi, model="default", max_tokens=4) as stream:
            texts = [d.text for d in stream]
            messages = stream.result()
        assert "".join(texts) == messages.text
        with client.stream_responses(
            "Count to twenty.", model="default", max_output_tokens=16
        ) as stream:
            responses = stream.result()
    return {"messages": messages, "responses": responses}
