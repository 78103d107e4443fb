"""The playground page in a real Chromium, against real servers.

The default model through llama.cpp serves the page and the streams; a scripted
server whose every sequence fails at its fourth decode step (``--fault
error-after:3``) gives the mid-stream error. That server allows the llama.cpp
server's origin with CORS, so the fault test is a cross-origin stream, preflight
included; the llama.cpp server allows no origin, which the browser enforces.

Every state the page reaches is screenshotted into the test's own tmp folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page

from sluicegate.testing import ServerProcess

from .conftest import start_server, stop_server

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.llamacpp,
    pytest.mark.slow,
]

NO_END_TOKENS = {"1": -100, "106": -100, "212": -100}
"""``logit_bias`` banning the default model's end tokens (see tests/integration)."""
WAIT_MS = 60_000
"""A liveness deadline for the page's own work, not a timing check."""
PNG = b"\x89PNG\r\n\x1a\n"
EXTRA = "more body fields (JSON object)"

_PAINTS = """() => {
  window.paints = [];
  const observer = new MutationObserver(() => {
    const text = document.getElementById("choice-0-text");
    if (text !== null) {
      const length = text.textContent.length;
      const last = window.paints[window.paints.length - 1];
      if (last === undefined || last.length !== length) {
        window.paints.push({at: performance.now(), length});
      }
    }
  });
  observer.observe(document.getElementById("choices"),
    {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    logs = tmp_path_factory.mktemp("browser-servers")
    server = start_server(
        "llamacpp",
        logs,
        "--engine",
        "llamacpp",
        "--n-ctx",
        "2048",
        "--parallel",
        "2",
        "--ledger",
        str(logs / "llamacpp.sqlite3"),
    )
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def faulty(
    llama: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    logs = tmp_path_factory.mktemp("browser-scripted")
    server = start_server(
        "scripted",
        logs,
        "--engine",
        "scripted",
        "--fault",
        "error-after:3",
        "--scripted-rate",
        "50",
        "--no-ledger",
        "--cors-origin",
        llama.base_url,
    )
    yield server
    stop_server(server)


def open_page(browser: BrowserContext, server: ServerProcess) -> Page:
    """The playground of ``server``, its model list loaded."""
    page = browser.new_page()
    page.goto(f"{server.base_url}/")  # / redirects to the page
    assert page.url == f"{server.base_url}/playground"
    page.wait_for_function(
        "() => document.getElementById('model').options.length > 1", timeout=WAIT_MS
    )
    return page


def fill(page: Page, fields: dict[str, str]) -> None:
    """Fill the form by the controls' labels (so that the labels are right)."""
    for label, value in fields.items():
        page.get_by_label(label, exact=True).fill(value)


def send_and_wait(page: Page) -> str:
    """Send with Ctrl+Enter from the prompt; the end state the page shows."""
    page.locator("#prompt").press("Control+Enter")
    return wait_end(page)


def wait_end(page: Page) -> str:
    page.wait_for_function(
        "() => !['', 'streaming'].includes(document.getElementById('end-state')"
        ".dataset.state)",
        timeout=WAIT_MS,
    )
    state: str = page.locator("#end-state").get_attribute("data-state") or ""
    return state


def screenshot(page: Page, folder: Path, name: str) -> None:
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.read_bytes().startswith(PNG)


def completion_mode(page: Page) -> None:
    page.get_by_label("Completion (/completions)").check()


def events(page: Page) -> list[dict[str, Any]]:
    """The inspector's rows: ms, bytes, kind and payload text."""
    rows: list[dict[str, Any]] = page.eval_on_selector_all(
        "#events tr",
        """rows => rows.map(r => ({ms: Number(r.cells[0].textContent),
            bytes: Number(r.cells[1].textContent), kind: r.cells[2].textContent,
            payload: r.cells[3].textContent}))""",
    )
    return rows


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8"))


def test_sse_parser_handles_split_frames_crlf_and_comments(
    browser: BrowserContext, llama: ServerProcess
) -> None:
    """The page's parser, fed one stream split at every offset, CRLF and CR line
    ends and comments, gives the same events (WHATWG's examples among them)."""
    page = browser.new_page()
    page.goto(f"{llama.base_url}/playground")
    result = page.evaluate(
        """async () => {
      const {SSEDecoder} = await import("/playground/sse.js");
      const run = (parts) => {
        const d = new SSEDecoder();
        const out = [];
        for (const p of parts) out.push(...d.feed(p));
        out.push(...d.flush());
        return out.map(i => i.kind === "event" ? [i.type, i.data, i.id, i.bytes]
                                                : ["comment", i.text, i.bytes]);
      };
      const stream = "\\ufeffdata: YHOO\\ndata: +2\\ndata: 10\\n\\n: keep-alive\\n\\n" +
        "event: add\\r\\ndata: é€\\r\\nid: 7\\r\\n\\r\\ndata\\rdata:\\r\\r" +
        "event: lone\\n\\nretry: x\\ndata:  two spaces\\n\\ndata: cut";
      const whole = run([stream]);
      const splits = [];
      for (let i = 0; i <= stream.length; i++) {
        splits.push(JSON.stringify(run([stream.slice(0, i), stream.slice(i)])));
      }
      const oneByOne = run([...stream]);
      return {whole, splits: [...new Set(splits)],
              oneByOne: JSON.stringify(oneByOne), crEnd: run(["data: x\\n\\r"])};
    }"""
    )
    size = _utf8_size
    assert result["whole"] == [
        [
            "message",
            "YHOO\n+2\n10",
            "",
            size("\ufeffdata: YHOO\ndata: +2\ndata: 10\n\n"),
        ],
        ["comment", "keep-alive", size(": keep-alive\n")],
        ["add", "é€", "7", size("event: add\r\ndata: é€\r\nid: 7\r\n\r\n")],
        ["message", "\n", "7", size("data\rdata:\r\r")],
        ["message", " two spaces", "7", size("retry: x\ndata:  two spaces\n\n")],
    ]
    assert [json.loads(s) for s in result["splits"]] == [result["whole"]]
    assert json.loads(result["oneByOne"]) == result["whole"]
    assert result["crEnd"] == [["message", "x", "", size("data: x\n\r")]]
    page.close()


def test_a_prompt_streams_and_its_text_grows_over_time(
    browser: BrowserContext, llama: ServerProcess, tmp_path: Path
) -> None:
    """Chat mode, sent from the keyboard: the text is painted many times as the
    events come, each event is in the inspector with its time and size, and the
    stream ends finished with usage and a TTFT and gaps on the timing strip."""
    page = open_page(browser, llama)
    fill(
        page,
        {
            "User message": "Tell me about the sea.",
            "max_tokens": "24",
            "temperature": "0",
            EXTRA: json.dumps({"logit_bias": NO_END_TOKENS}),
        },
    )
    page.evaluate(_PAINTS)
    page.get_by_label("User message", exact=True).press("Control+Enter")
    page.wait_for_function("() => window.paints.length >= 1", timeout=WAIT_MS)
    screenshot(page, tmp_path, "streaming")
    assert wait_end(page) == "finished"
    screenshot(page, tmp_path, "finished")

    paints = page.evaluate("window.paints")
    times = sorted({p["at"] for p in paints})
    assert len(times) >= 5, paints  # painted as it came, not once at the end
    lengths = [p["length"] for p in paints]
    assert lengths == sorted(lengths), lengths
    text = page.locator("#choice-0-text").text_content() or ""
    assert len(text) == lengths[-1] > 0
    rows = events(page)
    chunks = [r for r in rows if r["kind"] == "chunk"]
    assert len(chunks) >= 5, rows
    assert rows[-1]["kind"] == "done"
    assert [r["ms"] for r in rows] == sorted(r["ms"] for r in rows)
    assert all(r["bytes"] > len("data: \n\n") for r in rows), rows
    assert json.loads(chunks[0]["payload"])["object"] == "chat.completion.chunk"
    assert page.locator("#choice-0-finish").get_attribute("data-finish-reason") == (
        "length"
    )
    assert "24 completion tokens" in (page.locator("#usage").text_content() or "")
    assert page.locator("#timing-strip span").count() >= 5
    assert (page.locator("#timing-summary").text_content() or "").startswith("TTFT: ")
    page.close()


def test_multi_byte_text_renders_without_replacement_characters(
    browser: BrowserContext, llama: ServerProcess, tmp_path: Path
) -> None:
    """Emoji that the model writes one byte token at a time arrive and paint as
    whole characters: no U+FFFD anywhere in the text or the inspector."""
    page = open_page(browser, llama)
    completion_mode(page)
    fill(
        page,
        {"Prompt": "🦩🪼 🦩🪼 🦩🪼 🦩🪼 🦩", "max_tokens": "24", "temperature": "0"},
    )
    assert send_and_wait(page) == "finished"
    screenshot(page, tmp_path, "multi-byte")
    text = page.locator("#choice-0-text").text_content() or ""
    assert "🪼" in text or "🦩" in text, text
    assert "\ufffd" not in text
    assert all("\ufffd" not in r["payload"] for r in events(page))
    page.close()


def test_a_stop_string_ends_the_stream_with_finish_reason_stop(
    browser: BrowserContext, llama: ServerProcess, tmp_path: Path
) -> None:
    """A stop string cut from the middle of the model's own greedy answer ends
    the painted text just before it, with ``finish_reason: stop``."""
    payload = {
        "prompt": "The quick brown fox",
        "max_tokens": 24,
        "temperature": 0,
        "logit_bias": NO_END_TOKENS,
    }
    answer = httpx.post(f"{llama.base_url}/v1/completions", json=payload, timeout=60)
    unstopped: str = answer.json()["choices"][0]["text"]
    third = len(unstopped) // 3
    stop = unstopped[third : third + 5]
    assert len(stop) == 5, unstopped
    assert "\n" not in stop, unstopped
    page = open_page(browser, llama)
    completion_mode(page)
    fill(
        page,
        {
            "Prompt": str(payload["prompt"]),
            "max_tokens": "24",
            "temperature": "0",
            "stop (one per line)": stop,
            EXTRA: json.dumps({"logit_bias": NO_END_TOKENS}),
        },
    )
    assert send_and_wait(page) == "finished"
    screenshot(page, tmp_path, "stopped-by-stop-string")
    assert page.locator("#choice-0-finish").get_attribute("data-finish-reason") == (
        "stop"
    )
    text = page.locator("#choice-0-text").text_content()
    assert text == unstopped[: unstopped.index(stop)]
    page.close()


def test_the_stop_button_aborts_the_request_in_the_engine(
    browser: BrowserContext, llama: ServerProcess, tmp_path: Path
) -> None:
    """Stop (pressed from the keyboard) cancels the fetch; the page then shows,
    from the server, the ledger row ``aborted`` and no KV cell in use; the
    server's own endpoints say the same."""
    page = open_page(browser, llama)
    completion_mode(page)
    fill(
        page,
        {
            "Prompt": "Once upon a time",
            "max_tokens": "1024",
            EXTRA: json.dumps({"logit_bias": NO_END_TOKENS}),
        },
    )
    page.get_by_role("button", name="Send").press("Enter")
    page.wait_for_function(
        "() => (document.getElementById('choice-0-text') || {textContent: ''})"
        ".textContent.length > 0",
        timeout=WAIT_MS,
    )
    page.get_by_role("button", name="Stop").press("Enter")
    assert wait_end(page) == "aborted"
    report = page.locator("#abort-report")
    page.wait_for_function(
        "() => document.getElementById('abort-report').dataset.endState !== undefined",
        timeout=WAIT_MS,
    )
    screenshot(page, tmp_path, "aborted")
    assert report.get_attribute("data-end-state") == "aborted"
    assert report.get_attribute("data-kv-cells-used") == "0"
    chunk = json.loads(next(r for r in events(page) if r["kind"] == "chunk")["payload"])
    response_id = chunk["id"]
    assert f"{response_id}-0" in (report.text_content() or "")

    with httpx.Client(base_url=llama.base_url, timeout=10) as http:
        rows = http.get("/engine/requests", params={"id": response_id}).json()["data"]
        stats = http.get("/engine/stats").json()
    assert [r["end_state"] for r in rows] == ["aborted"]
    assert rows[0]["completion_tokens"] < 1024
    assert f"{response_id}-0" in stats["aborted_ids"]
    assert stats["kv_cells_used"] == 0
    assert stats["running"] == 0
    page.wait_for_function(  # the server view lists it too
        "id => [...document.querySelectorAll('#recent tr')]"
        ".some(r => r.textContent.includes(id) && r.dataset.endState === 'aborted')",
        arg=response_id,
        timeout=WAIT_MS,
    )
    page.close()


def test_a_mid_stream_fault_shows_as_errored_across_origins(
    browser: BrowserContext, llama: ServerProcess, faulty: ServerProcess, tmp_path: Path
) -> None:
    """The page of one server streams from another that allows its origin; an
    engine error after three tokens shows as ``errored``, with the error event
    and the text that came before it."""
    page = open_page(browser, llama)
    base = page.get_by_label("Base URL")
    base.fill(f"{faulty.base_url}/v1")
    base.press("Tab")  # change: the model list reloads from that server
    page.wait_for_function(
        "() => [...document.getElementById('model').options]"
        ".some(o => o.value === 'scripted')",
        timeout=WAIT_MS,
    )
    fill(page, {"User message": "Hello", "max_tokens": "16"})
    assert send_and_wait(page) == "errored"
    screenshot(page, tmp_path, "errored")
    rows = events(page)
    assert rows[-1]["kind"] == "error", rows
    assert "error" in json.loads(rows[-1]["payload"])
    assert len(page.locator("#choice-0-text").text_content() or "") > 0
    assert not [r for r in rows if r["kind"] == "done"]
    page.close()


def test_an_origin_the_server_does_not_allow_is_refused_by_the_browser(
    browser: BrowserContext, llama: ServerProcess, faulty: ServerProcess, tmp_path: Path
) -> None:
    """CORS is off by default: the page of the scripted server cannot read a
    stream from the llama.cpp server; no status reached the page."""
    page = open_page(browser, faulty)
    page.get_by_label("Base URL").fill(f"{llama.base_url}/v1")
    assert send_and_wait(page) == "truncated"
    screenshot(page, tmp_path, "refused-origin")
    assert "connection:" in (page.locator("#usage").text_content() or "")
    assert events(page) == []
    page.close()


def test_every_control_is_labelled_and_reachable_by_keyboard(
    browser: BrowserContext, llama: ServerProcess, tmp_path: Path
) -> None:
    """In the browser's accessibility tree every control has a name, the text
    areas are live regions, and Tab walks the form to Send."""
    page = open_page(browser, llama)
    cdp = page.context.new_cdp_session(page)
    tree = cdp.send("Accessibility.getFullAXTree")["nodes"]
    controls = {
        "textbox",
        "combobox",
        "checkbox",
        "radio",
        "button",
        "spinbutton",
        "searchbox",
    }
    unnamed = [
        n
        for n in tree
        if not n.get("ignored")
        and n.get("role", {}).get("value") in controls
        and not n.get("name", {}).get("value")
    ]
    assert unnamed == []
    named = {
        (n["role"]["value"], n.get("name", {}).get("value"))
        for n in tree
        if not n.get("ignored") and "role" in n
    }
    for expected in [
        ("textbox", "Base URL"),
        ("combobox", "Model"),
        ("textbox", "User message"),
        ("spinbutton", "max_tokens"),
        ("checkbox", "logprobs"),
        ("radio", "Completion (/completions)"),
        ("button", "Send"),
        ("button", "Stop"),
    ]:
        assert expected in named, sorted(named, key=str)
    snapshot = page.locator("#request-form").aria_snapshot()
    assert 'textbox "Base URL"' in snapshot
    focused = []
    page.locator("#base-url").focus()
    for _ in range(40):
        focused.append(page.evaluate("document.activeElement.id"))
        if focused[-1] == "send":
            break
        page.keyboard.press("Tab")
    assert focused[-1] == "send", focused
    assert {"api-key", "model", "prompt", "max-tokens", "logprobs"} <= set(focused)
    screenshot(page, tmp_path, "keyboard-focus")
    page.close()


def test_reasoning_is_shown_apart_from_the_answer(
    browser: BrowserContext, tmp_path: Path
) -> None:
    """A scripted thinking model (its markers split by ``--reasoning-parser``):
    the page paints the reasoning in its own section, the answer below."""
    script = tmp_path / "thinking.txt"
    script.write_text("<think>plan: 2+2=4</think>The answer is 4.", encoding="utf-8")
    server = start_server(
        "scripted-thinking",
        tmp_path,
        "--engine",
        "scripted",
        "--scripted-text",
        str(script),
        "--scripted-rate",
        "200",
        "--reasoning-parser",
        "qwen3",
        "--no-ledger",
    )
    try:
        page = open_page(browser, server)
        fill(page, {"User message": "2+2?"})
        assert send_and_wait(page) == "finished"
        screenshot(page, tmp_path, "reasoning")
        assert page.locator("#choice-0-reasoning").text_content() == "plan: 2+2=4"
        assert page.locator("#choice-0-text").text_content() == "The answer is 4."
        assert page.locator("#choice-0-reasoning").is_visible()
        page.close()
    finally:
        stop_server(server)
