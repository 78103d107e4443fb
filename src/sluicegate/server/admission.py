"""Admission before the first byte: API keys, per-key quotas, and their refusals.

``Admission`` answers two questions about a request, both before any byte of the
response: who is asking (``authenticate``: 401 for a missing or unknown key) and
may it run now (``admit``: 403 for a key without access to the model, 429 when the
key's requests/minute or tokens/minute bucket is empty). A refusal is an
``AdmissionError`` carrying the status, the OpenAI error fields and, for 429 and
503, the ``Retry-After`` seconds.

Invariants:
    - Keys are compared with ``hmac.compare_digest`` against every configured key
      (no early exit), so the time taken does not depend on which key matched.
    - A key is never stored in the ledger or logged: rows carry ``key_id``, the
      key's name from the keys file or a short SHA-256 prefix.
    - Quotas are token buckets that refill continuously. A request takes one
      request and reserves ``prompt + n * max_tokens`` tokens up front, from both
      buckets or neither; ``Grant.release(used)`` returns the unused part.
    - Without configured keys every request is ``anonymous`` (quotas still apply,
      shared by all).

Deliberate divergence: the buckets live in this process; several replicas behind a
load balancer each enforce the full quota.

Spec: ../shared/DESIGN.md, "Status first, errors in band"; issue 5, "Admission
before the first byte"; OpenAI API reference, "Error codes" (401, 403, 429, 503).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from sluicegate.core.errors import SluicegateError

__all__ = [
    "ANONYMOUS",
    "Admission",
    "AdmissionError",
    "ApiKey",
    "Forbidden",
    "Grant",
    "OverQuota",
    "Quota",
    "TokenBucket",
    "Unauthenticated",
    "Unavailable",
    "key_id_of",
    "read_keys_file",
]

ANONYMOUS = "anonymous"
"""The ``key_id`` of every request when no API keys are configured."""


class AdmissionError(SluicegateError):
    """A request refused before the first byte (401, 403, 429 or 503).

    Attributes:
        status: the HTTP status to answer with.
        message: human-readable; never contains the key or the prompt.
        error_type: OpenAI error ``type``.
        code: OpenAI error ``code``.
        retry_after_s: whole seconds for ``Retry-After`` (429/503), else ``None``.
    """

    status: ClassVar[int] = 400
    error_type: ClassVar[str] = "invalid_request_error"

    def __init__(self, message: str, code: str, retry_after_s: int | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.retry_after_s = retry_after_s


class Unauthenticated(AdmissionError):
    """No API key, or one this server does not know (401)."""

    status: ClassVar[int] = 401


class Forbidden(AdmissionError):
    """A known key without access to the requested model (403)."""

    status: ClassVar[int] = 403


class OverQuota(AdmissionError):
    """The key's requests/minute or tokens/minute bucket is empty (429)."""

    status: ClassVar[int] = 429
    error_type: ClassVar[str] = "rate_limit_error"


class Unavailable(AdmissionError):
    """The server is draining or overloaded (503)."""

    status: ClassVar[int] = 503
    error_type: ClassVar[str] = "server_error"


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One configured key.

    Attributes:
        secret: the key as clients send it after ``Bearer``.
        models: model names the key may use; empty means every model.
        key_id: what the ledger and metrics show instead of the key.
    """

    secret: str = field(repr=False)
    models: frozenset[str] = frozenset()
    key_id: str = ""

    def __post_init__(self) -> None:
        if not self.secret:
            raise ValueError("an API key must not be empty")
        if not self.key_id:
            object.__setattr__(self, "key_id", key_id_of(self.secret))


def key_id_of(secret: str) -> str:
    """The id that stands for ``secret``: ``key-`` and 8 hex digits of its SHA-256."""
    return "key-" + hashlib.sha256(secret.encode()).hexdigest()[:8]


def read_keys_file(path: Path) -> list[ApiKey]:
    """Parse a keys file: one ``key [model,model...]`` per line.

    Blank lines and lines starting with ``#`` are skipped; a key without models
    may use every model.

    Raises:
        OSError: the file cannot be read.
        ValueError: a line with more than two fields, naming its line number.
    """
    keys = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) > 2:
            raise ValueError(
                f"{path}:{number}: expected 'key [model,...]', got {len(fields)} fields"
            )
        models = fields[1].split(",") if len(fields) == 2 else []
        keys.append(ApiKey(fields[0], frozenset(m for m in models if m)))
    return keys


class TokenBucket:
    """A bucket of ``capacity`` units refilled at ``capacity`` per 60 seconds.

    Args:
        capacity: units per minute (> 0); the bucket starts full.
        now: the clock time (seconds) it starts at.
    """

    def __init__(self, capacity: float, now: float) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be > 0, got {capacity!r}")
        self.capacity = capacity
        self._rate_per_s = capacity / 60.0
        self._level = capacity
        self._at = now

    def level(self, now: float) -> float:
        """Units available at ``now`` (refilled since the last call)."""
        self._level = min(
            self.capacity, self._level + (now - self._at) * self._rate_per_s
        )
        self._at = max(self._at, now)
        return self._level

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` units are available (0 when they are now)."""
        missing = amount - self.level(now)
        return max(missing, 0.0) / self._rate_per_s

    def take(self, amount: float) -> None:
        """Remove ``amount`` units (call ``wait_s`` first; may go negative)."""
        self._level -= amount

    def give(self, amount: float) -> None:
        """Return ``amount`` units, never above ``capacity``."""
        self._level = min(self.capacity, self._level + amount)


@dataclass(frozen=True, slots=True)
class Quota:
    """Per-key limits; ``None`` disables a limit.

    Attributes:
        requests_per_minute: requests started per minute.
        tokens_per_minute: prompt + ``max_tokens`` reserved per minute (tokens).
    """

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None


class Grant:
    """An admitted request's reservation; ``release`` returns the unused tokens."""

    def __init__(self, key_id: str, reserved: int, bucket: TokenBucket | None):
        self.key_id = key_id
        self.reserved_tokens = reserved
        self._bucket = bucket

    def release(self, used_tokens: int) -> None:
        """Give back ``reserved - used_tokens`` tokens; later calls do nothing."""
        if self._bucket is not None:
            self._bucket.give(max(self.reserved_tokens - used_tokens, 0))
            self._bucket = None


class Admission:
    """API keys and quotas of one server.

    Args:
        keys: configured keys; empty means no authentication.
        quota: the per-key limits (the same for every key).
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        keys: Iterable[ApiKey] = (),
        quota: Quota | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._keys = list(keys)
        self._quota = quota or Quota()
        self._clock = clock
        self._buckets: dict[tuple[str, str], TokenBucket] = {}

    def authenticate(self, headers: Mapping[str, str]) -> ApiKey | None:
        """The key of a request from its ``Authorization: Bearer`` header.

        Returns:
            The matching key, or ``None`` when no keys are configured.

        Raises:
            Unauthenticated: no bearer key, or none that matches (401).
        """
        if not self._keys:
            return None
        scheme, _, presented = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise Unauthenticated(
                "Missing API key: send 'Authorization: Bearer <key>'",
                "missing_api_key",
            )
        found = None
        given = presented.strip().encode()
        for key in self._keys:  # all of them: the time must not tell which matched
            if hmac.compare_digest(given, key.secret.encode()):
                found = key
        if found is None:
            raise Unauthenticated("Incorrect API key provided", "invalid_api_key")
        return found

    def admit(self, key: ApiKey | None, model: str, tokens: int) -> Grant:
        """Check ``key``'s access to ``model`` and take its quota.

        Args:
            key: from ``authenticate``.
            model: the served model id the request resolved to.
            tokens: prompt + ``n * max_tokens`` to reserve (tokens).

        Raises:
            Forbidden: the key's model list does not include ``model`` (403).
            OverQuota: a bucket is short; ``retry_after_s`` is when it will not be
                (429). Nothing is taken then.
        """
        if key is not None and key.models and model not in key.models:
            raise Forbidden(
                f"This API key has no access to the model {model!r}",
                "model_access_denied",
            )
        key_id = key.key_id if key is not None else ANONYMOUS
        now = self._clock()
        requests = self._bucket(key_id, "requests", now)
        token_bucket = self._bucket(key_id, "tokens", now)
        if token_bucket is not None and tokens > token_bucket.capacity:
            raise OverQuota(
                f"This request reserves {tokens} tokens (prompt + max_tokens); "
                f"the quota is {token_bucket.capacity:g} tokens per minute",
                "tokens_over_quota",
                60,
            )
        waits = [
            bucket.wait_s(amount, now)
            for bucket, amount in ((requests, 1), (token_bucket, tokens))
            if bucket is not None
        ]
        if any(waits):
            raise OverQuota(
                "Rate limit reached for requests or tokens per minute",
                "rate_limit_exceeded",
                max(1, math.ceil(max(waits))),
            )
        if requests is not None:
            requests.take(1)
        if token_bucket is not None:
            token_bucket.take(tokens)
        return Grant(key_id, tokens, token_bucket)

    def _bucket(self, key_id: str, kind: str, now: float) -> TokenBucket | None:
        limit = (
            self._quota.requests_per_minute
            if kind == "requests"
            else self._quota.tokens_per_minute
        )
        if limit is None:
            return None
        bucket = self._buckets.get((key_id, kind))
        if bucket is None:
            bucket = self._buckets[key_id, kind] = TokenBucket(limit, now)
        return bucket
