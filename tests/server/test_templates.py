"""Chat templates: the built-in Gemma 3 format, model templates, BOS once, errors."""

from __future__ import annotations

import jinja2
import pytest

from sluicegate.core.errors import RequestError
from sluicegate.engines.scripted.vocab import ScriptedTokenizer
from sluicegate.server.prepare.templates import ChatTemplate, encode_prompt
from sluicegate.server.schemas.messages import ChatMessage

TOKENIZER = ScriptedTokenizer()


def _messages(*pairs: tuple[str, str]) -> list[ChatMessage]:
    return [ChatMessage.model_validate({"role": r, "content": c}) for r, c in pairs]


def test_builtin_gemma_template_renders_turns_and_generation_prompt() -> None:
    text = ChatTemplate(TOKENIZER).render(
        _messages(("user", "Hi"), ("assistant", " Hello! "), ("user", "Bye"))
    )
    assert text == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


@pytest.mark.parametrize("role", ["system", "developer"])
def test_system_prompt_joins_the_first_user_turn(role: str) -> None:
    text = ChatTemplate(TOKENIZER).render(
        _messages((role, "Be brief."), ("user", "Hi"))
    )
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    )


def test_text_parts_are_joined() -> None:
    message = ChatMessage.model_validate(
        {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        }
    )
    assert "user\na\nb<end_of_turn>" in ChatTemplate(TOKENIZER).render([message])


def test_prompt_ids_have_one_bos_and_parsed_special_tokens() -> None:
    ids = ChatTemplate(TOKENIZER).encode(_messages(("user", "Hi")))
    assert ids.count(TOKENIZER.bos_id) == 1
    assert ids[0] == TOKENIZER.bos_id
    assert ids[1] == 2  # <start_of_turn>
    assert TOKENIZER.end_of_turn_id in ids


def test_bos_is_added_when_the_text_lacks_it() -> None:
    assert encode_prompt(TOKENIZER, "Hi")[0] == TOKENIZER.bos_id
    assert encode_prompt(TOKENIZER, "<bos>Hi").count(TOKENIZER.bos_id) == 1


def test_the_models_own_template_wins() -> None:
    own = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
    tokenizer = ScriptedTokenizer(chat_template=own)
    text = ChatTemplate(tokenizer).render(_messages(("user", "Hi")))
    assert text == "[user:Hi]"


def test_a_template_error_is_400_naming_the_failing_message() -> None:
    template = ChatTemplate(TOKENIZER)
    messages = _messages(("user", "Hi"), ("assistant", "Yo"), ("system", "late"))
    with pytest.raises(RequestError, match=r"messages\[2\] \(role 'system'\)") as info:
        template.render(messages)
    assert info.value.param == "messages[2]"
    assert "only allowed as the first message" in info.value.message


def test_model_template_errors_name_the_first_message_that_fails() -> None:
    own = (
        "{% for m in messages %}{% if m.role == 'assistant' and loop.first %}"
        "{{ raise_exception('must start with user') }}{% endif %}"
        "{{ m.content }}{% endfor %}"
    )
    template = ChatTemplate(ScriptedTokenizer(chat_template=own))
    with pytest.raises(RequestError) as info:
        template.render(_messages(("assistant", "x"), ("user", "y")))
    assert info.value.param == "messages[0]"
    assert "must start with user" in info.value.message


def test_templates_run_sandboxed() -> None:
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    template = ChatTemplate(ScriptedTokenizer(chat_template=escape))
    with pytest.raises(
        RequestError, match="attribute '__class__' of 'list' object is unsafe"
    ):
        template.render(_messages(("user", "Hi")))


def test_a_template_that_does_not_compile_fails_at_construction() -> None:
    with pytest.raises(jinja2.TemplateSyntaxError):
        ChatTemplate(ScriptedTokenizer(chat_template="{% for %}"))
