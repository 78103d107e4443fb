"""ServerConfig: the settings one server process runs with.

Every limit here is enforced before the first byte of a response (the status code
can still change then), except ``heartbeat_interval_s``, which paces the SSE
comments written while a stream waits for its engine.

Spec: ../shared/DESIGN.md, "Status first, errors in band" and "The wire".
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ServerConfig"]


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Settings of one server; all fields have working defaults.

    Attributes:
        model_aliases: model names accepted besides the engine's own model id
            (a request naming any other model gets 404; omitting ``model`` means
            the served model).
        max_body_bytes: largest request body, in bytes (4 MiB); larger -> 413.
        heartbeat_interval_s: seconds without a write after which a stream sends
            the SSE comment ``: keep-alive`` (from the moment the headers go out,
            through queue wait and prefill). Must be > 0.
        default_max_tokens: ``max_tokens`` when the request has none, in tokens;
            ``None`` means all the room the context window leaves after the
            prompt (``context_length - prompt_tokens``). An explicit value is
            still capped by that room.
        max_n: most choices one request may ask for.
    """

    model_aliases: tuple[str, ...] = ("default",)
    max_body_bytes: int = 4 * 1024 * 1024
    heartbeat_interval_s: float = 15.0
    default_max_tokens: int | None = None
    max_n: int = 16

    def __post_init__(self) -> None:
        if self.heartbeat_interval_s <= 0:
            raise ValueError(
                f"heartbeat_interval_s must be > 0, got {self.heartbeat_interval_s!r}"
            )
        if self.max_body_bytes < 1:
            raise ValueError(
                f"max_body_bytes must be >= 1, got {self.max_body_bytes!r}"
            )
        if self.max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {self.max_n!r}")
