"""The gateway's prompt estimate: learnt from the upstream's final usages, and
not taught by a count that cannot be true of the prompt it was given for."""

from __future__ import annotations

from sluicegate.core.wire.chunks import Endpoint
from sluicegate.engines.upstream.estimate import (
    CHARS_PER_TOKEN,
    TEMPLATE_TOKENS,
    PromptEstimate,
    prompt_chars,
)
from sluicegate.engines.values import TextPrompt


def _chat(text: str) -> TextPrompt:
    return TextPrompt(Endpoint.CHAT, messages=({"role": "user", "content": text},))


def test_an_estimate_learns_the_upstreams_characters_per_token() -> None:
    estimate = PromptEstimate()
    prompt = _chat("Estimate me, please")
    chars = prompt_chars(prompt)
    assert isinstance(chars, int)
    assert estimate.estimate(prompt) == round(chars / CHARS_PER_TOKEN)
    estimate.learn(prompt, 12)
    assert estimate.estimate(prompt) == 12


def test_a_count_no_prompt_of_its_size_could_have_teaches_nothing() -> None:
    """One usage of 10^12 prompt tokens for a 60-byte prompt (a lie, or a
    count of something else) used to teach a ratio that made every later
    estimate of that upstream's prompts billions of tokens: message_start,
    the ledger rows of aborted requests and of answers without a usage."""
    estimate = PromptEstimate()
    honest, other = _chat("Estimate me, please"), _chat("Another prompt " * 20)
    estimate.learn(honest, 12)
    before = estimate.estimate(other)
    chars = prompt_chars(honest)
    assert isinstance(chars, int)
    estimate.learn(honest, 10**12)
    estimate.learn(honest, chars + TEMPLATE_TOKENS + 1)
    assert estimate.estimate(other) == before


def test_an_estimate_is_never_more_than_one_token_a_byte() -> None:
    """Counts each within what a prompt could hold, but all at that bound,
    still leave an estimate no larger than the prompt's bytes."""
    estimate = PromptEstimate()
    small, large = _chat("Hi"), _chat("word " * 1000)
    chars, bound = prompt_chars(small), prompt_chars(large)
    assert isinstance(chars, int)
    assert isinstance(bound, int)
    for _ in range(100):
        estimate.learn(small, chars + TEMPLATE_TOKENS)
    assert estimate.estimate(large) <= bound


def test_a_prompt_of_token_ids_is_counted_and_teaches_nothing() -> None:
    estimate = PromptEstimate()
    ids = TextPrompt(Endpoint.COMPLETION, prompt=(1, 2, 3))
    estimate.learn(ids, 10**6)
    assert estimate.estimate(ids) == 3
    chars = prompt_chars(_chat("Hi"))
    assert isinstance(chars, int)
    assert estimate.estimate(_chat("Hi")) == round(chars / CHARS_PER_TOKEN)


def test_an_honest_count_of_rare_characters_is_learnt() -> None:
    """A tokenizer's byte fallback spends a token on each byte of a rare
    character, so an honest count of such a completion prompt is past its
    characters; the bound is its bytes, and the count is learnt."""
    prompt = TextPrompt(Endpoint.COMPLETION, prompt="\U0001f9ec" * 2000)
    honest = 4 * 2000  # four UTF-8 bytes, four fallback tokens, each
    assert honest > len(prompt.prompt) + TEMPLATE_TOKENS
    estimate = PromptEstimate()
    estimate.learn(prompt, honest)
    assert estimate.estimate(prompt) == honest
