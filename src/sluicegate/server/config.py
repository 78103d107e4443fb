"""ServerConfig: the settings one server process runs with.

Every limit here is enforced before the first byte of a response (the status code
can still change then), except ``heartbeat_interval_s``, which paces the SSE
comments written while a stream waits for its engine.

Spec: docs/DESIGN.md, "Status first, errors in band" and "The wire".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sluicegate.server.admission import ApiKey, Quota

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
        api_keys: accepted keys (``Authorization: Bearer``) of the API routes
            (``/v1/*``, ``/openapi.json``, and any unknown path); empty: no auth.
        admin_keys: accepted keys of the operator routes (``/metrics``,
            ``/engine/stats``). Empty: those routes are open while ``api_keys``
            is empty too, and refused (403) once it is not, since
            ``/engine/stats`` shows every key's requests. ``/health`` and
            ``/ready`` never need a key.
        allowed_hosts: ``Host`` names a route that needs no key accepts, besides
            IP literals and ``localhost`` names (a DNS-rebinding page sends its
            own name); ``"*"`` accepts any; others get 421. ``None``: no check
            (embedding behind a front that checks); ``serve`` always sets it.
        quota: per-key requests/minute and tokens/minute (429 past them).
        retry_after_s: ``Retry-After`` seconds of a 503 (overload, draining).
        first_token_timeout_s: seconds to the first token before the in-band
            ``first_token_timeout`` error; ``None``: no limit.
        request_timeout_s: seconds for a whole response before the in-band
            ``request_timeout`` error; ``None``: no limit.
        max_stream_buffer_bytes: bytes (content plus a fixed cost per queued
            event, see ``buffer.EVENT_COST_BYTES``) that may wait for one slow
            client; more aborts its stream.
        stuck_stream_timeout_s: seconds a client may accept no byte before its
            stream is aborted.
        stream_interval_s: pacing, at most one event per stream per interval
            (the first token excepted); 0 disables.
        stream_retain_frames: frames of each event stream kept in its event log
            once written (frames; 0: none). Nothing replays them yet: the seam
            for resumable streams.
        ledger_path: the SQLite ledger file; ``None`` keeps rows in memory only.
        chat_template: Jinja source that replaces the model's chat template
            (``--chat-template FILE``); ``None`` keeps the model's own.
    """

    model_aliases: tuple[str, ...] = ("default",)
    max_body_bytes: int = 4 * 1024 * 1024
    heartbeat_interval_s: float = 15.0
    default_max_tokens: int | None = None
    max_n: int = 16
    api_keys: tuple[ApiKey, ...] = ()
    admin_keys: tuple[ApiKey, ...] = ()
    allowed_hosts: tuple[str, ...] | None = None
    quota: Quota = field(default_factory=Quota)
    retry_after_s: int = 1
    first_token_timeout_s: float | None = None
    request_timeout_s: float | None = None
    max_stream_buffer_bytes: int = 1024 * 1024
    stuck_stream_timeout_s: float = 30.0
    stream_interval_s: float = 0.0
    stream_retain_frames: int = 0
    ledger_path: Path | None = None
    chat_template: str | None = None

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
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ValueError(
                f"default_max_tokens must be >= 1 or None, got "
                f"{self.default_max_tokens!r}"
            )
        for name in ("first_token_timeout_s", "request_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 or None, got {value!r}")
        if self.stuck_stream_timeout_s <= 0 or self.max_stream_buffer_bytes < 1:
            raise ValueError(
                "expected stuck_stream_timeout_s > 0 and max_stream_buffer_bytes >= 1, "
                f"got {self.stuck_stream_timeout_s!r} and "
                f"{self.max_stream_buffer_bytes!r}"
            )
        if self.stream_retain_frames < 0:
            raise ValueError(
                f"stream_retain_frames must be >= 0, got {self.stream_retain_frames!r}"
            )
        if self.stream_interval_s < 0:
            raise ValueError(
                f"stream_interval_s must be >= 0, got {self.stream_interval_s!r}"
            )
