"""ServerConfig: the settings one server process runs with.

Every limit here is enforced before the first byte of a response (the status code
can still change then), except ``heartbeat_interval_s``, which paces the SSE
comments written while a stream waits for its engine.

Spec: docs/DESIGN.md, "Status first, errors in band" and "The wire".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sluicegate.core.decoding.reasoning_parsers import REASONING_PARSERS
from sluicegate.core.schema_limits import SchemaLimits
from sluicegate.server.admission.keys import ApiKey
from sluicegate.server.admission.quotas import Quota
from sluicegate.server.schemas.fields import MAX_STREAM_INTERVAL

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
            ``/engine/stats``, ``/engine/requests``). Empty: those routes are
            open while ``api_keys`` is empty too, and refused (403) once it is
            not, since ``/engine/stats`` shows every key's requests. ``/health`` and
            ``/ready`` never need a key.
        allowed_hosts: ``Host`` names a route that needs no key accepts, besides
            IP literals and ``localhost`` names (a DNS-rebinding page sends its
            own name); ``"*"`` accepts any; others get 421. ``None``: no check
            (embedding behind a front that checks); ``serve`` always sets it.
        cors_origins: web origins (``http(s)://host[:port]``, or ``"*"``) whose
            pages may call the server from a browser (``cors.py``); empty: none
            (no CORS header, no preflight answered).
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
        stream_interval: write each stream's content every this many tokens
            (the first at once; the end, errors and heartbeats at once), as
            vLLM's ``--stream-interval``; 1: as they come. A request's
            ``stream_options.stream_interval`` overrides it.
        obfuscation: pad every event of a stream so that its size does not
            tell its text (``core/wire/padding.py``); a request's
            ``stream_options.include_obfuscation`` overrides it.
        cadence_s: send each stream's events on a clock of this period
            (seconds; 0: as they come); a request's
            ``stream_options.cadence_ms`` overrides it.
        resumable_streams: whether an event stream is resumable when its request
            does not say (``stream_options.resumable``); see
            docs/resumable-streams.md.
        store_responses: whether a Responses API request that does not set
            ``store`` is stored (retrievable, chainable); see docs/apis.md.
        resume_grace_s: seconds a resumable stream keeps generating with no
            reader attached before its engine request is aborted.
        max_log_bytes: bytes of frames kept per resumable stream (older frames
            go first; a resume before them gets 410).
        max_store_bytes: bytes of frames kept over all resumable streams
            (finished ones go first; new resumable streams get 503 while live
            ones fill it).
        resume_ttl_s: seconds a finished resumable stream stays readable.
        redis_url: the Redis (``redis://host:port/db``) that holds the per-key
            quotas and the resumable streams' logs, shared by every replica
            pointed at it; ``None``: both in this process.
        ledger_path: the SQLite ledger file; ``None`` keeps rows in memory only.
        ledger_url: a ``postgresql://`` URL of a ledger database that replicas
            share, instead of ``ledger_path``; see ``server/ledger/pg.py``.
        ledger_lease_s: with ``ledger_url``: seconds without a heartbeat after
            which this server counts as dead and a replica marks its open rows
            ``truncated``.
        chat_template: Jinja source that replaces the model's chat template
            (``--chat-template FILE``); ``None`` keeps the model's own.
        reasoning_parser: ``--reasoning-parser``: how the output of an engine
            that takes token ids is split into reasoning and content: a name
            of ``core.reasoning.REASONING_PARSERS``, or ``"auto"`` (detected
            from each chat template; none for the built-in Gemma one).
        schema_limits: bounds on each JSON schema a request carries (400 past
            one); see docs/security.md, "Schema limits".
        schema_timeout_s: seconds to check and compile a request's schemas,
            off the event loop (400 ``schema_timeout`` past it).
        workers: how many processes serve this port (``serve --workers``,
            ``workers.py``); above 1, ``/engine/requests`` reads the ledger's
            file or database (every worker's rows), and ``/health`` names the
            process that answered (``pid``).
    """

    model_aliases: tuple[str, ...] = ("default",)
    max_body_bytes: int = 4 * 1024 * 1024
    heartbeat_interval_s: float = 15.0
    default_max_tokens: int | None = None
    max_n: int = 16
    api_keys: tuple[ApiKey, ...] = ()
    admin_keys: tuple[ApiKey, ...] = ()
    allowed_hosts: tuple[str, ...] | None = None
    cors_origins: tuple[str, ...] = ()
    quota: Quota = field(default_factory=Quota)
    retry_after_s: int = 1
    first_token_timeout_s: float | None = None
    request_timeout_s: float | None = None
    max_stream_buffer_bytes: int = 1024 * 1024
    stuck_stream_timeout_s: float = 30.0
    stream_interval_s: float = 0.0
    stream_interval: int = 1
    obfuscation: bool = True
    cadence_s: float = 0.0
    resumable_streams: bool = False
    store_responses: bool = False
    resume_grace_s: float = 30.0
    max_log_bytes: int = 1024 * 1024
    max_store_bytes: int = 256 * 1024 * 1024
    resume_ttl_s: float = 600.0
    redis_url: str | None = None
    ledger_path: Path | None = None
    ledger_url: str | None = None
    ledger_lease_s: float = 10.0
    chat_template: str | None = None
    reasoning_parser: str = "auto"
    schema_limits: SchemaLimits = field(default_factory=SchemaLimits)
    schema_timeout_s: float = 10.0
    workers: int = 1

    def __post_init__(self) -> None:
        if self.heartbeat_interval_s <= 0:
            raise ValueError(
                f"heartbeat_interval_s must be > 0, got {self.heartbeat_interval_s!r}"
            )
        if self.max_body_bytes < 1:
            raise ValueError(
                f"max_body_bytes must be >= 1, got {self.max_body_bytes!r}"
            )
        if self.reasoning_parser != "auto" and (
            self.reasoning_parser not in REASONING_PARSERS
        ):
            known = ", ".join(["auto", *sorted(REASONING_PARSERS)])
            raise ValueError(
                f"reasoning_parser must be one of {known}, got "
                f"{self.reasoning_parser!r}"
            )
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers!r}")
        if self.max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {self.max_n!r}")
        if self.schema_timeout_s <= 0:
            raise ValueError(
                f"schema_timeout_s must be > 0, got {self.schema_timeout_s!r}"
            )
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ValueError(
                f"default_max_tokens must be >= 1 or None, got "
                f"{self.default_max_tokens!r}"
            )
        if self.retry_after_s < 0:
            raise ValueError(f"retry_after_s must be >= 0, got {self.retry_after_s!r}")
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
        if self.resume_grace_s < 0 or self.resume_ttl_s <= 0:
            raise ValueError(
                "expected resume_grace_s >= 0 and resume_ttl_s > 0, got "
                f"{self.resume_grace_s!r} and {self.resume_ttl_s!r}"
            )
        if self.max_log_bytes < 1 or self.max_store_bytes < self.max_log_bytes:
            raise ValueError(
                "expected max_log_bytes >= 1 and max_store_bytes >= max_log_bytes, "
                f"got {self.max_log_bytes!r} and {self.max_store_bytes!r}"
            )
        if not 0 <= self.cadence_s <= 1.0:
            raise ValueError(f"cadence_s must be in [0, 1], got {self.cadence_s!r}")
        if not 1 <= self.stream_interval <= MAX_STREAM_INTERVAL:
            raise ValueError(
                f"stream_interval must be in [1, {MAX_STREAM_INTERVAL}], "
                f"got {self.stream_interval!r}"
            )
        if self.stream_interval_s < 0:
            raise ValueError(
                f"stream_interval_s must be >= 0, got {self.stream_interval_s!r}"
            )
