"""Liveness while a large schema compiles: another stream's gaps, /health latency.

Against a running server (``sluicegate serve --engine llamacpp``): one stream
counts to 500 while, 1.5 s in, one request brings a ``response_format`` (or,
with ``tools``, a required tool) whose object schema has N properties. Prints
the big request's status and time, the stream's largest gap between events and
``/health``'s largest latency, overall and during the big request.

    python bench/schema_liveness.py http://127.0.0.1:8000 1200 [format|tools]
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import httpx

COUNT = [{"role": "user", "content": "Count from 1 to 500, one per line."}]


def main(base: str, n_properties: int, mode: str) -> None:
    gaps: list[tuple[float, float]] = []
    health: list[tuple[float, float]] = []
    done = threading.Event()

    def stream() -> None:
        body = {
            "messages": COUNT,
            "max_tokens": 400,
            "stream": True,
            "temperature": 0,
            "stream_options": {"include_obfuscation": False},
        }
        with (
            httpx.Client(base_url=base, timeout=120) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            last = None
            for line in response.iter_lines():
                if line.startswith("data: "):
                    now = time.monotonic()
                    if last is not None:
                        gaps.append((now, now - last))
                    last = now
        done.set()

    def probe() -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            while not done.is_set():
                started = time.monotonic()
                client.get("/health")
                health.append((started, time.monotonic() - started))
                time.sleep(0.02)

    threads = [threading.Thread(target=stream), threading.Thread(target=probe)]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    props = {f"p{i}": {"type": "string", "maxLength": 8} for i in range(n_properties)}
    schema = {"type": "object", "properties": props, "required": list(props)[:3]}
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}
    body["max_tokens"] = 3
    if mode == "format":
        fmt = {"name": "x", "schema": schema}
        body["response_format"] = {"type": "json_schema", "json_schema": fmt}
    else:
        body["tools"] = [
            {"type": "function", "function": {"name": "f", "parameters": schema}}
        ]
        body["tool_choice"] = "required"
    t0 = time.monotonic()
    answer = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
    t1 = time.monotonic()
    print(f"big request: {answer.status_code} in {t1 - t0:.2f} s")
    for thread in threads:
        thread.join()
    for name, series in (("stream gap", gaps), ("/health", health)):
        during = [v for t, v in series if t0 <= t <= t1 + 0.5]
        print(
            f"{name}: max {max(v for _, v in series) * 1000:.0f} ms overall, "
            f"{max(during, default=0) * 1000:.0f} ms during ({len(during)} samples)"
        )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "format")
