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
    assert {k: v for k, v in graded.items() if v[0] != "pass"} == {}, (
        capsys.readouterr().out
    )


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
