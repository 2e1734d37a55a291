from dataclasses import replace

import pytest

from engine.catalog.chat_format import chat_format_for
from engine.errors import InvalidRequest
from engine.catalog.gguf_file import GGUFInfo

BASE = GGUFInfo(path="x.gguf", size_bytes=1, architecture="gemma3", name="x", block_count=1,
                context_length=1, chat_template=None, bos_token="<bos>", eos_token="<eos>",
                add_bos_token=True, tensor_count=1, tokenizer="llama", vocab_size=3,
                vocab_hash="x")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_model_template_is_rendered_with_its_own_tokens():
    fmt = chat_format_for(replace(BASE, chat_template=CHATML, architecture="llama"))
    text = fmt.render([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert not fmt.fallback and fmt.turn_ends == ("<|im_end|>",)


def test_gemma_without_template_gets_gemma_format_and_says_so():
    fmt = chat_format_for(BASE)
    text = fmt.render([{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "hi"},
                       {"role": "assistant", "content": "hello"},
                       {"role": "user", "content": "bye"}])
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n"
                    "<start_of_turn>model\nhello<end_of_turn>\n"
                    "<start_of_turn>user\nbye<end_of_turn>\n<start_of_turn>model\n")
    assert fmt.fallback and "fallback" in fmt.describe()
    assert fmt.turn_ends == ("<end_of_turn>",)


def test_unknown_architecture_without_template_falls_back_to_chatml_visibly():
    fmt = chat_format_for(replace(BASE, architecture="mystery"))
    assert fmt.fallback and fmt.name == "chatml"


def test_template_raise_exception_becomes_a_request_error():
    template = "{{ raise_exception('roles must alternate') }}"
    fmt = chat_format_for(replace(BASE, chat_template=template))
    with pytest.raises(InvalidRequest, match="roles must alternate"):
        fmt.render([{"role": "user", "content": "x"}])


# Hermes 2 Pro's and Command-R+'s way with tools (they raised TypeError on tools=None: a 500)
LOOPS_OVER_TOOLS = ("{% if tools is defined %}{% for t in tools %}{{ t.function.name }}{% endfor %}"
                    "{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}")


@pytest.mark.parametrize("template, complaint", [
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{{ messages[0].content + 1 }}", "TypeError"),
    ("{{ '%d' % messages[0].content }}", "TypeError"),
    ("{% if %}", "rejected"),  # does not compile
])
def test_whatever_a_template_raises_is_a_request_error_in_its_words(template, complaint):
    fmt = chat_format_for(replace(BASE, chat_template=template))
    with pytest.raises(InvalidRequest, match=complaint) as refused:
        fmt.render([{"role": "user", "content": "x"}])
    assert refused.value.status == 400 and refused.value.param == "messages"


def test_a_template_that_loops_over_tools_renders_without_them_and_with_them():
    fmt = chat_format_for(replace(BASE, chat_template=LOOPS_OVER_TOOLS))
    assert fmt.render([{"role": "user", "content": "hi"}]) == "hi"
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert fmt.render([{"role": "user", "content": "hi"}], tools) == "fhi"
