"""``sluicegate check --api`` for the Responses and Messages APIs, live."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluicegate.cli import main
from sluicegate.client import Client, StreamResult
from sluicegate.core.endstate import EndState

from .live import serve

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp, pytest.mark.timeout(600)]


@pytest.mark.parametrize("apis", [("responses", "messages")])
def test_check_passes_the_responses_and_messages_probes(
    apis: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    verdicts: dict[str, dict[str, str]] = {}
    with serve(["--n-ctx", "2048"], tmp_path / "server.log") as url:
        for api in apis:
            out = tmp_path / f"{api}.json"
            main(["check", url, "--api", api, "--max-tokens", "12", "--json", str(out)])
            verdicts.update(
                {p["probe"]: p for p in json.loads(out.read_text())["probes"]}
            )
        results = _client_streams(url)
    for api, result in sorted(results.items()):  # the client library reads both APIs
        assert result.end_state is EndState.FINISHED, (api, result)
        assert result.text
        assert result.usage
        assert result.usage.completion_tokens >= 1
    assert results["messages"].finish_reason == "max_tokens"
    assert results["responses"].finish_reason == "max_output_tokens"
    assert {k.split("-")[0] for k in verdicts} == set(apis)
    graded = {k: (v["verdict"], v["evidence"]) for k, v in verdicts.items()}
    # The default model does not reason: nothing to grade reasoning on.
    unseen = {k for k, v in graded.items() if v[0] == "not-observable"}
    assert unseen <= {"responses-reasoning-framing", "messages-reasoning-framing"}
    assert {
        k: v for k, v in graded.items() if v[0] not in ("pass", "not-observable")
    } == {}, capsys.readouterr().out


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


def test_check_all_grades_each_api_on_its_own_exchanges_and_replays_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live, saved, replayed = (tmp_path / f"{n}.json" for n in ("live", "rec", "rep"))
    with serve(["--n-ctx", "2048"], tmp_path / "server.log") as url:
        argv = ["check", url, "--api", "all", "--max-tokens", "12"]
        argv += ["--prefill-tokens", "20"]
        code = main([*argv, "--save", str(saved), "--json", str(live)])
    replay_code = main(["check", "--replay", str(saved), "--json", str(replayed)])
    probes = json.loads(live.read_text())["probes"]
    prefixes = {p["probe"].split("-")[0] for p in probes}
    assert {"responses", "messages", "framing"} <= prefixes  # chat's too
    failures = {p["probe"]: p["evidence"] for p in probes if p["verdict"] == "fail"}
    assert failures == {}, capsys.readouterr().out
    assert code == 0
    # A replay without --api grades what the recording holds: the same verdicts.
    again = json.loads(replayed.read_text())["probes"]
    assert [(p["probe"], p["verdict"]) for p in again] == [
        (p["probe"], p["verdict"]) for p in probes
    ]
    assert replay_code == 0
