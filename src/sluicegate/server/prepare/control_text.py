"""Control tokens only where the chat template wrote them, never from a message.

A chat prompt is rendered text, and ``<end_of_turn>`` typed into a message reads
exactly like the one the template wrote; tokenized with special tokens parsed, the
typed one would become the control token and forge a turn. ``ControlText`` keeps
the two apart: ``escape`` replaces the text of every control token in a message's
content by a private mark (``U+E000``, an index, ``U+E001``) before the template
runs; ``split`` cuts the rendered text at the template's own control tokens (the
only control-token text left in it) and turns each mark back into its text; and
``encode`` tokenizes the control tokens as such and the text between them as
text.

Invariants:
    - Without marks, ``encode(split(text))`` gives what ``tokenizer.encode(text,
      parse_special=True)`` gives, but for the ``<unk>``-like tokens that are
      neither control nor end-of-generation tokens: the text between control
      tokens is tokenized in the same pieces the tokenizer would cut it into.
    - Content that holds no control-token text (and no ``U+E000``) is left as it
      is: the common case costs one regex scan per message.
    - The text of a control token in a message becomes, after rendering, the same
      text (tokenized as text), whatever the template does around it. A mark the
      template cuts apart (say by slicing the content) stays plain text.

Deliberate divergence: a control token's text that a message and the template
only make together (content ending in ``<end_of_turn`` before a template's ``>``)
is read as the control token; no template in use writes part of a control token.

Spec: docs/DESIGN.md, "Tokens and text".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TypeAlias

from sluicegate.engines.base import Tokenizer

__all__ = ["ControlText"]

_OPEN = "\ue000"  # private use: no vocabulary's control token holds it
_CLOSE = "\ue001"
_NEVER = "(?!)"

_Trie: TypeAlias = dict[str, "_Trie"]  # next character -> the rest; "" ends a text


class ControlText:
    """The text of ``tokenizer``'s control tokens, kept as text in message contents.

    Args:
        tokenizer: the served model's tokenizer; the control tokens are its
            ``special_ids`` whose pieces are non-empty UTF-8 text.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        pieces = tokenizer.pieces
        texts = set()
        for token in tokenizer.special_ids:
            try:
                text = pieces[token].decode("utf-8")
            except UnicodeDecodeError:  # not text, so never in a str to escape
                continue
            if text:
                texts.add(text)
        # Index 0 is the mark itself, so content holding U+E000 comes back intact.
        self._texts = [_OPEN, *sorted(texts)]
        self._index = {text: i for i, text in enumerate(self._texts)}
        self._escapable = re.compile(_alternation(self._texts))
        self._scan = re.compile(
            f"{_OPEN}([0-9]{{1,7}}){_CLOSE}|({_alternation(texts)})"
        )
        self._tokenizer = tokenizer
        self._control_ids: dict[str, list[int]] = {}

    def escape(self, content: str) -> str | None:
        """``content`` with each control token's text replaced by its mark.

        Returns:
            The escaped content, or ``None`` when there is nothing to escape (no
            control-token text and no ``U+E000``).
        """
        escaped, count = self._escapable.subn(self._mark, content)
        return escaped if count else None

    def split(self, text: str) -> list[str]:
        """``text``, rendered from escaped contents, cut at the template's control
        tokens: ``[plain, control, plain, ..., plain]`` (odd indices hold control
        tokens' text), each mark in the plain parts turned back into its text.

        Joined, the parts are the text the template would have written from the
        contents as they came (``"".join(parts)``).
        """
        parts: list[str] = []
        run: list[str] = []
        end = 0
        for match in self._scan.finditer(text):
            run.append(text[end : match.start()])
            end = match.end()
            index = match.group(1)
            if index is None:  # a control token the template wrote
                parts += ("".join(run), match.group())
                run = []
            elif int(index) < len(self._texts):
                run.append(self._texts[int(index)])
            else:  # not a mark of ours: text
                run.append(match.group())
        run.append(text[end:])
        parts.append("".join(run))
        return parts

    def encode(self, parts: list[str], *, add_special: bool) -> list[int]:
        """Token ids of ``split()``'s parts: control tokens, and plain text
        tokenized without parsing special tokens.

        Args:
            parts: from ``split``.
            add_special: prepend what the tokenizer adds to a text (BOS).
        """
        tokenizer = self._tokenizer
        ids = (
            tokenizer.encode("", add_special=True, parse_special=False)
            if add_special
            else []
        )
        for i, part in enumerate(parts):
            if i % 2:
                ids += self._control(part)
            elif part:
                ids += tokenizer.encode(part, add_special=False, parse_special=False)
        return ids

    def _mark(self, match: re.Match[str]) -> str:
        return f"{_OPEN}{self._index[match.group()]}{_CLOSE}"

    def _control(self, text: str) -> list[int]:
        ids = self._control_ids.get(text)
        if ids is None:  # the tokenizer's own reading of it, asked once per text
            ids = self._tokenizer.encode(text, add_special=False, parse_special=True)
            self._control_ids[text] = ids
        return ids


def _alternation(texts: Iterable[str]) -> str:
    """A regex for any of ``texts``, the longest at a position first, as a trie.

    One branch per next character instead of one per text: at each position the
    regex engine follows a path rather than trying every text in turn (Gemma 3
    has thousands of control tokens), and the set of first characters lets it
    skip positions where none starts.
    """
    trie: _Trie = {}
    for text in texts:
        node = trie
        for char in text:
            node = node.setdefault(char, {})
        node[""] = {}
    return _trie_pattern(trie) or _NEVER


def _trie_pattern(node: _Trie) -> str:
    branches = [
        re.escape(char) + _trie_pattern(child)
        for char, child in sorted(node.items())
        if char
    ]
    if not branches:
        return ""
    pattern = branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"
    # A text that ends here and also goes on: the longer one first (greedy ?).
    return f"(?:{pattern})?" if "" in node else pattern
