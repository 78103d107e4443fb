"""ControlText: control-token text in contents escaped, split back, tokenized."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from sluicegate.engines.base import Tokenizer
from sluicegate.engines.scripted.vocab import BYTES_START, ScriptedTokenizer
from sluicegate.server.prepare.control_text import ControlText
from sluicegate.server.prepare.prompt_text import longest_piece_bytes
from sluicegate.server.prepare.templates import ChatTemplate
from sluicegate.server.schemas.messages import ChatMessage

TOKENIZER = ScriptedTokenizer()


class _OddSpecials(ScriptedTokenizer):
    """Two more control tokens: one that is not UTF-8, one with no text."""

    @property
    def pieces(self) -> Sequence[bytes]:
        pieces = list(super().pieces)
        pieces[BYTES_START] = b""  # the 0x00 byte token
        return pieces

    @property
    def special_ids(self) -> frozenset[int]:
        return super().special_ids | {BYTES_START, BYTES_START + 0xFF}


def test_control_tokens_without_text_are_never_escaped() -> None:
    control = ControlText(_OddSpecials())
    assert control.escape("\xff and \x00, no control text") is None
    assert control.escape("<eos>") is not None


def test_escape_leaves_content_without_control_text_alone() -> None:
    control = ControlText(TOKENIZER)
    assert control.escape("Hi <there>, <eos") is None
    escaped = control.escape("a<eos>b")
    assert escaped is not None
    assert "<eos>" not in escaped


def test_split_turns_marks_back_and_cuts_at_the_templates_control_tokens() -> None:
    control = ControlText(TOKENIZER)
    escaped = control.escape("x<end_of_turn>y")
    assert escaped is not None
    text = f"<bos>{escaped}<end_of_turn>\n"
    assert control.split(text) == [
        "",
        "<bos>",
        "x<end_of_turn>y",
        "<end_of_turn>",
        "\n",
    ]


def test_a_mark_the_template_wrote_itself_stays_text() -> None:
    source = "{% for m in messages %}\ue0009999\ue001{{ m['content'] }}{% endfor %}"
    tokenizer = ScriptedTokenizer(chat_template=source)
    template = ChatTemplate(tokenizer)
    messages = [ChatMessage(role="user", content="<eos>")]
    ids = template.encode(messages)
    assert b"".join(tokenizer.pieces[i] for i in ids).decode() == (
        "<bos>" + template.render(messages)
    )
    assert [i for i in ids if i in tokenizer.special_ids] == [tokenizer.bos_id]


class _Slotted:
    __slots__ = ()
    pieces = (b"ab", b"abcd", b"")


def test_the_longest_piece_of_a_tokenizer_without_weak_references() -> None:
    assert longest_piece_bytes(cast(Tokenizer, _Slotted())) == 4
    assert longest_piece_bytes(TOKENIZER) == len(b"<start_of_turn>")
