"""The one way an upstream's URL, headers or error text reach a message: redacted.

What an upstream sends back is untrusted, and upstreams echo what they were
given: OpenAI's own 401 quotes the key it refused, a proxy's error page quotes
the URL it was asked for (with its userinfo and query), a malformed status line
or header line carries whatever the peer put there. So every text that came
from an upstream, or names one, goes through a ``Redactor`` before it reaches a
client's message, a log line, a metric label or the ledger:

- ``redact(text)`` replaces every known secret (an upstream's API key, its URL's
  user, password and query values) in each form it may be echoed in (as is,
  percent-encoded, JSON-escaped, base64 of ``user:password``), and the token of
  any ``Bearer`` or ``Basic`` credential, with ``REDACTED``; it drops control
  characters and cuts the text to a bound, after redacting, so a cut cannot
  leave half a secret behind;
- ``redact_url(url)`` is a URL without its userinfo, query and fragment (the
  query's presence is shown as ``?REDACTED``), for naming an upstream;
- ``safe_token(value)`` passes a short identifier (an error ``code`` or
  ``param``) and nothing else.

Invariants:
    - ``redact`` never returns a secret it knows, nor one cut in half by its
      bound (property-tested with arbitrary secrets and texts).
    - A secret shorter than ``MIN_SECRET_CHARS`` is still redacted; only its
      encoded forms are skipped (they could not be told from ordinary text).

Deliberate divergences: no pattern guesses secrets it was not told of
(LiteLLM's ``sk-...`` patterns): the gateway knows each secret it sends, and
text that was never a secret stays readable. The one exception is the token of
an ``Authorization``-style credential, which is never worth showing.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import quote, quote_plus, unquote, urlsplit, urlunsplit

__all__ = [
    "MAX_TEXT_CHARS",
    "MIN_SECRET_CHARS",
    "REDACTED",
    "Redactor",
    "redact_url",
    "safe_token",
    "url_secrets",
]

REDACTED: Final = "[redacted]"
"""What stands where a secret was."""

MAX_TEXT_CHARS: Final = 500
"""Most characters of an upstream's text a redacted message keeps."""

MIN_SECRET_CHARS: Final = 4
"""Secrets shorter than this are redacted as they are, not in encoded forms."""

_CREDENTIAL = re.compile(r"\b(Bearer|Basic)(\s+)[^\s\"',;]+", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_TOKEN = re.compile(r"[A-Za-z0-9_.:\[\]-]{1,64}")


def url_secrets(url: str) -> list[str]:
    """The secrets a URL carries: its user, its password and each query value.

    Args:
        url: any URL (an unparsable one carries none).

    Returns:
        Non-empty strings, each as written and percent-decoded.
    """
    try:
        parts = urlsplit(url)
        username, password = parts.username, parts.password
    except ValueError:
        return []
    found = [username or "", password or ""]
    for pair in parts.query.split("&"):
        found.append(pair.partition("=")[2])
    if username is not None and password is not None:
        found.append(f"{username}:{password}")
    return [s for value in found for s in {value, unquote(value)} if s]


def redact_url(url: str) -> str:
    """``url`` without userinfo, query and fragment: what may name an upstream.

    Example: ``http://u:p@10.0.0.5:8000/v1?key=k`` is
    ``http://10.0.0.5:8000/v1?[redacted]``. A URL that cannot be parsed is
    ``REDACTED`` whole.
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        return REDACTED
    if host is None:
        return REDACTED
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    query = REDACTED if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def safe_token(value: object) -> str | None:
    """``value`` when it is a short identifier (at most 64 letters, digits and
    ``_.:[]-``; an ``int`` of up to 18 digits as its digits), else ``None``:
    how an upstream's error ``code``, ``type`` or ``param`` may reach a client
    (a secret could hide in any longer text)."""
    if type(value) is int and abs(value) < 10**18:
        value = str(value)
    if isinstance(value, str) and _TOKEN.fullmatch(value):
        return value
    return None


class Redactor:
    """Replaces known secrets, and any credential token, in text.

    Args:
        secrets: the strings never to show (API keys, URL secrets); empty ones
            are ignored.
    """

    __slots__ = ("_pattern", "secrets")

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets: tuple[str, ...] = tuple(dict.fromkeys(s for s in secrets if s))
        forms: set[str] = set()
        for secret in self.secrets:
            forms.add(secret)
            if len(secret) >= MIN_SECRET_CHARS:
                forms.update(_encodings(secret))
        ordered = sorted(forms, key=len, reverse=True)  # longest form first
        self._pattern = (
            re.compile("|".join(map(re.escape, ordered))) if ordered else None
        )

    def with_secrets(self, secrets: Iterable[str]) -> Redactor:
        """A redactor of this one's secrets and ``secrets``."""
        return Redactor((*self.secrets, *secrets))

    def token(self, value: object) -> str | None:
        """``safe_token(value)``, unless it holds a secret: ``None`` then."""
        token = safe_token(value)
        if token is None or self.redact(token) != token:
            return None
        return token

    def redact(self, text: str, max_chars: int = MAX_TEXT_CHARS) -> str:
        """``text`` with control characters dropped, every secret (in each of
        its forms) and credential token replaced by ``REDACTED``, then cut to
        ``max_chars`` (``...`` ending a cut text).

        Args:
            text: anything an upstream sent, or a message quoting it.
            max_chars: the longest result (characters, >= 3).

        Returns:
            The text; ``REDACTED`` alone in the odd case where replacing a
            secret keeps making it anew (a secret that overlaps ``REDACTED``).
        """
        text = _CREDENTIAL.sub(lambda m: m[1] + m[2] + REDACTED, _CONTROL.sub("", text))
        pattern = self._pattern
        if pattern is None:
            return _cut(text, max_chars)
        for _ in range(_PASSES):
            text, count = pattern.subn(REDACTED, text)
            if not count:
                break
        text = _cut(text, max_chars)
        return REDACTED if pattern.search(text) else text


def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


_PASSES = 3
"""Replacements of the secrets in one text at most (a replacement can only
make a secret anew when it overlaps ``REDACTED`` itself)."""


def _encodings(secret: str) -> set[str]:
    """The forms a secret may be echoed in besides itself."""
    forms = {
        quote(secret, safe=""),
        quote_plus(secret, safe=""),
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        base64.b64encode(secret.encode("utf-8", "replace")).decode("ascii"),
    }
    return {form for form in forms if form}
