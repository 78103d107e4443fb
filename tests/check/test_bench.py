from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluicegate.check.bench import load_prompts
from sluicegate.check.stats import percentile, summarize
from sluicegate.cli import main
from sluicegate.client import StreamAssembler, StreamResult
from sluicegate.core.events import Usage
from sluicegate.testing import free_port

from .live import serve


def result(token_times: list[float], finished: bool = True) -> StreamResult:
    """A stream with one text event at each of ``token_times`` (seconds)."""
    assembler = StreamAssembler()
    assembler.head(200, {}, 0.01)
    for t in token_times:
        assembler.feed(
            b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n', t
        )
    if finished:
        assembler.feed(
            b'data: {"choices":[{"index":0,"finish_reason":"stop"}]}\n\n', 1.0
        )
        assembler.feed(b"data: [DONE]\n\n", 1.0)
    return assembler.flush(1.0)


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0


def test_summary_reports_ttft_itl_e2e_tokens_and_end_states() -> None:
    results = [result([0.1, 0.2, 0.4]), result([0.3, 0.5], finished=False)]
    summary = summarize(results, wall_s=2.0)
    assert summary.end_states == {"finished": 1, "truncated": 1}
    assert summary.ttft_s["p50"] == pytest.approx(0.2)
    assert summary.itl_s["p50"] == pytest.approx(0.2)  # gaps 0.1, 0.2, 0.2
    assert summary.e2e_s["p50"] == 1.0  # only finished requests
    assert summary.output_tokens == 5
    assert summary.output_tokens_per_s == 2.5


def test_usage_counts_override_event_counts() -> None:
    one = result([0.1])
    with_usage = type(one)(
        one.end_state, one.status, usage=Usage(3, 7), timing=one.timing
    )
    assert summarize([with_usage], 1.0).output_tokens == 7


def test_prompts_file_accepts_prompts_and_messages(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt": "a"}\n\n{"messages": [{"role": "user", "content": "b"}]}\n'
    )
    assert load_prompts(path) == [
        [{"role": "user", "content": "a"}],
        [{"role": "user", "content": "b"}],
    ]
    path.write_text("[1]\n")
    with pytest.raises(ValueError, match="expected prompt"):
        load_prompts(path)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_bench_smoke_against_the_scripted_engine(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--engine", "scripted", "--scripted-rate", "1000"]
    with serve(args, tmp_path / "server.log") as url:
        code = main(["bench", url, "--requests", "6", "--concurrency", "2",
                     "--max-tokens", "4", "--json", str(out)])  # fmt: skip
        rated = main(["bench", url, "--requests", "3", "--rate", "50",
                      "--max-tokens", "2", "--prompt-words", "3"])  # fmt: skip
    assert code == 0
    assert rated == 0
    doc = json.loads(out.read_text())
    assert doc["end_states"] == {"finished": 6}
    assert doc["requests"] == 6
    assert doc["output_tokens"] == 24


@pytest.mark.parametrize(
    "args",
    [
        ["--concurrency", "0"],
        ["--concurrency", "-3"],
        ["--rate", "0"],
        ["--requests", "0"],
        ["--max-tokens", "-1"],
        ["--timeout-s", "x"],
    ],
)
def test_bench_refuses_counts_and_rates_that_are_not_positive(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from sluicegate.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench", "http://127.0.0.1:9", *args])
    assert exit_.value.code == 2  # a usage error, before any request
    assert args[0] in capsys.readouterr().err


def test_bench_of_a_server_it_cannot_reach_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It printed a table of dashes and "1 truncated" (exit 1)."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main(["bench", url, "--requests", "2"]) == 2
    out = capsys.readouterr().out
    assert f"cannot reach {url}" in out
    assert "truncated" not in out
