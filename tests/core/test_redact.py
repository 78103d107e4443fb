"""``Redactor``, ``redact_url``, ``url_secrets`` and ``safe_token``: no secret
survives, whatever the text around it, the form it is echoed in, or the cut."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote, quote_plus

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.redact import (
    MAX_TEXT_CHARS,
    REDACTED,
    Redactor,
    redact_url,
    safe_token,
    url_secrets,
)

KEY = 'sk-proj-Zq9+/=&?%"\\é'

# Keys as operators set them: printable, no whitespace, 8 characters at least.
keys = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=8, max_size=80
)


def test_a_key_is_redacted_in_every_form_it_may_be_echoed_in() -> None:
    redactor = Redactor([KEY])
    forms = [
        KEY,
        quote(KEY, safe=""),
        quote_plus(KEY, safe=""),
        json.dumps(KEY)[1:-1],
        json.dumps(KEY, ensure_ascii=False)[1:-1],
        base64.b64encode(KEY.encode()).decode(),
    ]
    for form in forms:
        text = redactor.redact(f"Incorrect API key provided: {form}.")
        assert text == f"Incorrect API key provided: {REDACTED}."


def test_credentials_are_redacted_even_when_unknown() -> None:
    redactor = Redactor()
    text = redactor.redact("got Authorization: Bearer abc.def, and basic dXNlcjpw;")
    assert text == f"got Authorization: Bearer {REDACTED}, and basic {REDACTED};"


def test_control_characters_cannot_hide_a_key() -> None:
    redactor = Redactor(["secret-key"])
    assert redactor.redact("a secret\x00-\x1bkey\r\nb") == f"a {REDACTED}\nb"


def test_a_short_secret_is_redacted_as_it_is_only() -> None:
    redactor = Redactor(["ab", ""])
    assert redactor.secrets == ("ab",)
    assert redactor.redact("cab YWI= ab") == f"c{REDACTED} YWI= {REDACTED}"


def test_a_long_text_is_cut_after_redacting() -> None:
    key = "k" * 40
    text = "x" * (MAX_TEXT_CHARS - 5) + key
    redacted = Redactor([key]).redact(text)
    assert key[:5] not in redacted
    assert len(redacted) == MAX_TEXT_CHARS
    assert redacted.endswith("...")
    assert Redactor().redact("abcdef", max_chars=5) == "ab..."


def test_a_secret_made_anew_by_its_replacement_redacts_the_whole_text() -> None:
    # "[redacted]" + "xy" holds the secret "d]xy" again, every time.
    assert Redactor(["d]xy"]).redact("d]xyxyxyxyxy") == REDACTED
    # and one that only the cut's "..." would complete
    assert Redactor(["ab..."]).redact("abcdef", max_chars=5) == REDACTED


def test_with_secrets_adds_to_the_secrets() -> None:
    redactor = Redactor(["first-secret"]).with_secrets(["second-secret"])
    assert redactor.redact("first-secret second-secret") == f"{REDACTED} {REDACTED}"


def test_token_passes_identifiers_without_secrets() -> None:
    redactor = Redactor(["abcd1234"])
    assert redactor.token("rate_limited") == "rate_limited"
    assert redactor.token("xabcd1234") is None
    assert redactor.token("two words") is None


@given(key=keys, before=st.text(max_size=300), after=st.text(max_size=300))
def test_no_key_survives_redaction(key: str, before: str, after: str) -> None:
    redactor = Redactor([key])
    for form in (key, quote(key, safe=""), json.dumps(key)[1:-1]):
        text = redactor.redact(before + form + after)
        assert key not in text
        assert len(text) <= MAX_TEXT_CHARS


@given(key=keys, text=st.text(max_size=50), cut=st.integers(3, 60))
def test_no_cut_leaves_a_key_behind(key: str, text: str, cut: int) -> None:
    assert key not in Redactor([key]).redact(text + key + text, max_chars=cut)


def test_url_secrets_are_userinfo_and_query_values() -> None:
    found = url_secrets("http://us%40er:p%2Fw@host:8000/v1?key=k%3D1&x=&flag")
    assert set(found) == {
        "us%40er",
        "us@er",
        "p%2Fw",
        "p/w",
        "us%40er:p%2Fw",
        "us@er:p/w",
        "k%3D1",
        "k=1",
    }
    assert url_secrets("http://host/v1") == []
    assert url_secrets("http://[::1") == []  # unparsable


def test_redact_url_keeps_scheme_host_port_and_path() -> None:
    assert redact_url("http://u:p@10.0.0.5:8000/v1?key=k#f") == (
        f"http://10.0.0.5:8000/v1?{REDACTED}"
    )
    assert redact_url("https://[::1]:9/v1") == "https://[::1]:9/v1"
    assert redact_url("https://example.com/v1") == "https://example.com/v1"
    assert redact_url("http://[::1") == REDACTED
    assert redact_url("http://host:99999/") == REDACTED  # a port out of range
    assert redact_url("no url at all") == REDACTED


def test_safe_token_is_a_short_identifier_or_none() -> None:
    assert safe_token("context_length_exceeded") == "context_length_exceeded"
    assert safe_token("messages[0].content") == "messages[0].content"
    assert safe_token(400) == "400"
    assert safe_token(10**30) is None
    assert safe_token(True) is None
    assert safe_token("x" * 65) is None
    assert safe_token("a b") is None
    assert safe_token(None) is None
