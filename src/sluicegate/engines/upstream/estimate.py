"""An estimate of a prompt's tokens where the upstream says its count only at the end.

An upstream without a token counter (Ollama, whose OpenAI routes have none,
and any server whose tokenizer routes are closed) says how many tokens a
prompt had only in its last usage chunk. What needs the count before that (a
Messages stream's ``message_start``, the chunks of a
``continuous_usage_stats`` stream, the ledger row of a request its client
left) gets this estimate instead of 0, and so does a prompt whose counter
does not answer within ``COUNT_BEFORE_ESTIMATE_S`` (or its upstream's
``count_timeout_s``, when shorter): the prompt's UTF-8 bytes (the JSON
of its messages and tools as sent, or its text) over the bytes per token
this upstream's own final counts showed so far, ``CHARS_PER_TOKEN`` until one
did. A prompt of token ids is counted exactly. The estimate is never passed
off as a count: the upstream's final usage replaces it, and a ledger row that
keeps it is marked ``usage_estimated``.

A count is learnt only when the prompt could hold it: every token but the
chat template's own covers at least one byte of the prompt, so a count past
the prompt's bytes and ``TEMPLATE_TOKENS`` is a lie or a count of something
else (one usage of 10^12 prompt tokens made every later estimate of that
upstream billions). For the same reason no estimate is past the prompt's
bytes, whatever was learnt.
"""

from __future__ import annotations

import orjson

from sluicegate.engines.values import TextPrompt

__all__ = [
    "CHARS_PER_TOKEN",
    "COUNT_BEFORE_ESTIMATE_S",
    "TEMPLATE_TOKENS",
    "PromptEstimate",
    "most_prompt_tokens",
    "prompt_chars",
]

CHARS_PER_TOKEN = 4.0
"""Bytes per token before an upstream's own counts taught one (about
what English text in JSON takes in common BPE vocabularies)."""
COUNT_BEFORE_ESTIMATE_S = 0.5
"""How long a counter is waited for (seconds) when an estimate may stand in:
a counter slower than that is skipped for the estimate, so the first event
is not held for it. An upstream whose ``count_timeout_s`` is shorter is waited
for that long only."""
TEMPLATE_TOKENS = 4096
"""The most prompt tokens a count may hold past the prompt's bytes (the chat
template's own: special tokens, role names, a default system prompt, images)
to be learnt from."""
MIN_CHARS_PER_TOKEN = 1.0
"""The fewest bytes per token an estimate uses: a token of the prompt
covers at least one byte of it."""
LEARNED_TOKENS = 1 << 20
"""Past this many prompt tokens learned, older counts weigh half as much, so
the ratio follows what the upstream is sent now."""


def prompt_chars(prompt: TextPrompt) -> int | tuple[int, ...]:
    """What the estimate is made from: the UTF-8 bytes of ``prompt`` as it
    goes to the upstream (chat: the JSON of its messages and tools;
    completions: its text), or its token ids, which need no estimate. Bytes,
    not characters: a tokenizer's byte fallback spends up to one token a byte
    on a rare character, so only bytes bound an honest count."""
    if not isinstance(prompt.prompt, str):
        return prompt.prompt
    if not prompt.messages:
        return len(prompt.prompt.encode("utf-8", "surrogatepass"))
    sent = {"messages": prompt.messages, "tools": prompt.extra.get("tools")}
    return len(orjson.dumps(sent, default=str))


def most_prompt_tokens(prompt: TextPrompt) -> int:
    """The most tokens ``prompt`` can be: its bytes (or its token ids) and
    ``TEMPLATE_TOKENS``. A count past it is not learnt here, and the gateway
    rejects an upstream's usage that says more (``core/upstream/limits.py``)."""
    sent = prompt_chars(prompt)
    return (sent if isinstance(sent, int) else len(sent)) + TEMPLATE_TOKENS


class PromptEstimate:
    """Prompt bytes per token, learned from one engine's final usages."""

    __slots__ = ("_chars", "_tokens")

    def __init__(self) -> None:
        self._chars = 0.0
        self._tokens = 0.0

    def learn(self, prompt: TextPrompt, prompt_tokens: int) -> None:
        """Take an upstream's own count of ``prompt`` (tokens, > 0 to count;
        one past the prompt's bytes and ``TEMPLATE_TOKENS`` is not
        taken)."""
        chars = prompt_chars(prompt)
        if isinstance(chars, tuple) or not 0 < prompt_tokens <= chars + TEMPLATE_TOKENS:
            return
        if self._tokens > LEARNED_TOKENS:
            self._chars, self._tokens = self._chars / 2, self._tokens / 2
        self._chars += chars
        self._tokens += prompt_tokens

    def fill(
        self, prompt: TextPrompt | None, counted: int | None, estimate: bool
    ) -> int | None:
        """``counted`` when a counter gave it; else, with ``estimate`` and a
        prompt, the estimate of ``prompt``; else ``None``."""
        if counted is not None or not estimate or prompt is None:
            return counted
        return self.estimate(prompt)

    def estimate(self, prompt: TextPrompt) -> int:
        """``prompt``'s tokens: exact for token ids, else estimated (at least 1,
        at most its bytes)."""
        chars = prompt_chars(prompt)
        if isinstance(chars, tuple):
            return len(chars)
        per_token = self._chars / self._tokens if self._tokens else CHARS_PER_TOKEN
        per_token = max(per_token, MIN_CHARS_PER_TOKEN)
        return max(1, round(chars / per_token))
