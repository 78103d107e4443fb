"""Admission before the first byte: API keys, per-key quotas, and their refusals.

``Admission`` answers two questions about a request, both before any byte of the
response: who is asking (``authenticate``: 401 for a missing or unknown key) and
may it run now (``admit``: 403 for a key without access to the model, 400 for a
request no wait would let in, 429 when the key's requests/minute or tokens/minute
bucket is empty). A refusal is an
``AdmissionError`` carrying the status, the OpenAI error fields and, for 429 and
503, the ``Retry-After`` seconds.

Invariants:
    - Keys are compared with ``hmac.compare_digest`` against every configured key
      (no early exit), so the time taken does not depend on which key matched.
    - A key is never stored in the ledger or logged: rows carry ``key_id``, the
      key's name from the keys file or a short SHA-256 prefix.
    - Quotas are token buckets that refill continuously. A request takes one
      request and reserves ``prompt + n * max_tokens`` tokens up front, from both
      buckets or neither; ``Grant.release(used)`` returns the unused part, and
      ``Grant.refund()`` everything, the request included, when the engine
      refused it (a full queue's 503 costs no quota).
    - A 429 is only ever answered to a request that a later retry can pass: one
      that reserves more tokens than a whole minute's quota, or has more choices
      than the engine can queue at once, is a 400 naming ``max_tokens`` or
      ``n`` (clients such as the ``openai`` SDK retry 429 and 5xx by
      themselves, and would retry these for ever).
    - Without configured keys every request is ``anonymous`` (quotas still apply,
      shared by all).

The buckets and grants are ``quotas.py``'s. They live in this process, unless the
server is given a ``SharedQuotas`` (``redis_quotas.RedisQuotas``, with
``ServerConfig.redis_url``): then every replica takes from the same buckets,
through ``admit_async`` and ``probe``, and a store it cannot reach refuses the
request with 503 rather than letting it through unmetered. Deliberate divergence:
without one, several replicas behind a load balancer each enforce the full quota.

Spec: docs/DESIGN.md, "Admission and limits"; OpenAI API reference, "Error
codes" (401, 403, 429, 503); openai-python, "Retries" (429 and >= 500).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sluicegate.core.errors import RequestError
from sluicegate.server.admission.quotas import (
    Grant,
    Quota,
    SharedBucket,
    SharedQuotas,
    TokenBucket,
)
from sluicegate.server.http.errors import (
    Forbidden,
    OverQuota,
    Unauthenticated,
)

__all__ = [
    "ANONYMOUS",
    "Admission",
    "ApiKey",
    "bearer_key",
    "key_id_of",
    "read_keys_file",
]

ANONYMOUS = "anonymous"
"""The ``key_id`` of every request when no API keys are configured."""


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


def bearer_key(
    headers: Mapping[str, str], keys: Iterable[ApiKey], role: str = "API"
) -> ApiKey:
    """The one of ``keys`` that the ``Authorization: Bearer`` header presents (or,
    for API keys without that header, ``x-api-key`` as Anthropic's clients send).

    Args:
        headers: the request's headers (lower-case names).
        keys: the accepted keys, all compared (the time must not tell which
            matched).
        role: ``"API"`` or ``"admin"``: named in the message and the code.

    Raises:
        Unauthenticated: no bearer key (``missing_<role>_key``), or none that
            matches (``invalid_<role>_key``), 401.
    """
    code = role.lower()
    authorization = headers.get("authorization", "")
    if not authorization and role == "API" and "x-api-key" in headers:
        authorization = "Bearer " + headers["x-api-key"]
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise Unauthenticated(
            f"Missing {role} key: send 'Authorization: Bearer <key>'",
            f"missing_{code}_key",
        )
    found = None
    given = presented.strip().encode()
    for key in keys:
        if hmac.compare_digest(given, key.secret.encode()):
            found = key
    if found is None:
        raise Unauthenticated(f"Incorrect {role} key provided", f"invalid_{code}_key")
    return found


def read_keys_file(path: Path) -> list[ApiKey]:
    """Parse a keys file: one ``key [model,model...]`` per line.

    Blank lines and lines starting with ``#`` are skipped; a key without models
    may use every model.

    Raises:
        OSError: the file cannot be read.
        ValueError: a line with more than two fields, naming its line number;
            or no key at all (a server given a keys file must not be open).
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
    if not keys:
        raise ValueError(f"{path} holds no key (only blank lines and comments)")
    return keys


class Admission:
    """API keys and quotas of one server.

    Args:
        keys: configured keys; empty means no authentication.
        quota: the per-key limits (the same for every key).
        clock: monotonic seconds (tests pass a fake).
        submit_limit: engine sequences an idle engine accepts at once
            (``EngineStats.submit_limit``); ``None``: no such bound.
        shared: buckets shared with other replicas, used by ``admit_async``
            and ``probe`` instead of this process's; ``None``: none.
    """

    def __init__(
        self,
        keys: Iterable[ApiKey] = (),
        quota: Quota | None = None,
        clock: Callable[[], float] = time.monotonic,
        submit_limit: int | None = None,
        shared: SharedQuotas | None = None,
    ) -> None:
        self._keys = list(keys)
        self._quota = quota or Quota()
        self._clock = clock
        self._submit_limit = submit_limit
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        limited = self._quota.requests_per_minute or self._quota.tokens_per_minute
        self._shared = shared if limited else None

    def authenticate(self, headers: Mapping[str, str]) -> ApiKey | None:
        """The key of a request from its ``Authorization: Bearer`` header.

        Returns:
            The matching key, or ``None`` when no keys are configured.

        Raises:
            Unauthenticated: no bearer key, or none that matches (401).
        """
        if not self._keys:
            return None
        return bearer_key(headers, self._keys)

    def admit(
        self, key: ApiKey | None, model: str, tokens: int, sequences: int = 1
    ) -> Grant:
        """Check ``key``'s access to ``model`` and take its quota.

        Args:
            key: from ``authenticate``.
            model: the served model id the request resolved to.
            tokens: prompt + ``n * max_tokens`` to reserve (tokens).
            sequences: engine sequences the request submits (``n`` per prompt).

        Raises:
            Forbidden: the key's model list does not include ``model`` (403).
            RequestError: the request can never be admitted, however long it
                waits: more ``sequences`` than ``submit_limit`` (400, param
                ``n``, code ``n_over_capacity``), or more ``tokens`` than the
                tokens/minute quota (400, param ``max_tokens``, code
                ``tokens_over_quota``). Nothing is taken then.
            OverQuota: a bucket is short; ``retry_after_s`` is when it will not be
                (429). Nothing is taken then.
        """
        key_id = self._check(key, model, tokens, sequences)
        now = self._clock()
        requests = self._bucket(key_id, "requests", now)
        token_bucket = self._bucket(key_id, "tokens", now)
        request_wait = requests.wait_s(1, now) if requests is not None else 0.0
        token_wait = (
            token_bucket.wait_s(tokens, now) if token_bucket is not None else 0.0
        )
        if request_wait or token_wait:
            raise _over_quota(request_wait, token_wait)
        if requests is not None:
            requests.take(1)
        if token_bucket is not None:
            token_bucket.take(tokens)
        return Grant(key_id, tokens, token_bucket, requests)

    async def admit_async(
        self, key: ApiKey | None, model: str, tokens: int, sequences: int = 1
    ) -> Grant:
        """``admit``, from the shared buckets when the server has them.

        Raises:
            Unavailable: the shared buckets cannot be reached (503); and what
                ``admit`` raises.
        """
        shared = self._shared
        if shared is None:
            return self.admit(key, model, tokens, sequences)
        key_id = self._check(key, model, tokens, sequences)
        request_wait, token_wait = await shared.take(key_id, tokens, dry_run=False)
        if request_wait or token_wait:
            raise _over_quota(request_wait, token_wait)
        quota = self._quota
        return Grant(
            key_id,
            tokens,
            SharedBucket(shared, key_id, False) if quota.tokens_per_minute else None,
            SharedBucket(shared, key_id, True) if quota.requests_per_minute else None,
        )

    async def probe(
        self, key: ApiKey | None, model: str, tokens: int, sequences: int = 1
    ) -> None:
        """Raise what ``admit_async`` would raise now; take nothing."""
        shared = self._shared
        if shared is None:
            self.admit(key, model, tokens, sequences).refund()
            return
        key_id = self._check(key, model, tokens, sequences)
        request_wait, token_wait = await shared.take(key_id, tokens, dry_run=True)
        if request_wait or token_wait:
            raise _over_quota(request_wait, token_wait)

    def _check(
        self, key: ApiKey | None, model: str, tokens: int, sequences: int
    ) -> str:
        """The key id, once the checks that no wait would change have passed."""
        if key is not None and key.models and model not in key.models:
            raise Forbidden(
                f"This API key has no access to the model {model!r}",
                "model_access_denied",
            )
        limit = self._submit_limit
        if limit is not None and sequences > limit:
            raise RequestError(
                f"This request asks for {sequences} choices (n for each prompt); "
                f"the server queues at most {limit} at once, so it can never run: "
                "lower n",
                param="n",
                code="n_over_capacity",
            )
        capacity = self._quota.tokens_per_minute
        if capacity is not None and tokens > capacity:
            raise RequestError(
                f"This request reserves {tokens} tokens (prompt + n * max_tokens); "
                f"the quota is {capacity:g} tokens per minute, so it "
                "can never run: lower max_tokens or n",
                param="max_tokens",
                code="tokens_over_quota",
            )
        return key.key_id if key is not None else ANONYMOUS

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


def _over_quota(request_wait_s: float, token_wait_s: float) -> OverQuota:
    error = OverQuota(
        "Rate limit reached for requests or tokens per minute",
        "rate_limit_exceeded",
        max(1, math.ceil(max(request_wait_s, token_wait_s))),
    )
    error.tokens_only = not request_wait_s
    return error
