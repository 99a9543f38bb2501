"""Chat templates: the model's own (auto), none, shipped ones and files; enable_thinking.

python -m pytest tests/data/test_chat.py -q
"""

from __future__ import annotations

import pytest

from sparrow.data.chat import ChatTemplateError, chat_renderer
from sparrow.model import load_tokenizer
from sparrow.model.builtin import resolve_model_path

MESSAGES = (("system", "be brief"), ("user", "what is one"))


def test_auto_uses_the_tokenizers_own_template(qwen3_checkpoint):
    # the random checkpoint's byte-level tokenizer ships a ChatML template
    text = chat_renderer(qwen3_checkpoint, "auto").render(MESSAGES)
    assert text == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nwhat is one<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = load_tokenizer(qwen3_checkpoint).encode(text)
    assert ids.count(258) == 3  # <|im_start|> is one special token, not its characters


@pytest.mark.parametrize(
    "thinking, tail",
    [
        (None, "<|im_start|>assistant\n"),
        (True, "<|im_start|>assistant\n"),
        (False, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ],
)
def test_the_qwen3_template_and_its_thinking_switch(qwen3_checkpoint, thinking, tail):
    text = chat_renderer(qwen3_checkpoint, "builtin:qwen3", thinking).render(MESSAGES)
    assert text.startswith("<|im_start|>system\nbe brief<|im_end|>\n")
    assert text.endswith("<|im_start|>user\nwhat is one<|im_end|>\n" + tail)


def test_a_template_file_and_the_tiny_models_tokenizer(tmp_path):
    tiny = resolve_model_path("builtin:tiny")
    path = tmp_path / "t.jinja"
    path.write_text(
        "{% for m in messages %}{{ m['content'] }}={% endfor %}"
        "{% if add_generation_prompt %}a:{% endif %}"
    )
    text = chat_renderer(tiny, str(path)).render(MESSAGES)
    assert text == "be brief=what is one=a:"
    # every character of the shipped plain template is in the tiny model's 43-character vocab
    plain = chat_renderer(tiny, "builtin:plain", False).render(MESSAGES)
    tokenizer = load_tokenizer(tiny)
    assert tokenizer.decode(tokenizer.encode(plain)) == plain


def test_none_and_bad_settings_are_named(qwen3_checkpoint, tmp_path):
    with pytest.raises(ChatTemplateError, match="data.chat_template=none"):
        chat_renderer(qwen3_checkpoint, "none").render(MESSAGES)
    with pytest.raises(ChatTemplateError, match=r"no built-in template 'qwen9'; valid: .*qwen3"):
        chat_renderer(qwen3_checkpoint, "builtin:qwen9")
    with pytest.raises(ChatTemplateError, match="is not auto, none, builtin:NAME or a Jinja"):
        chat_renderer(qwen3_checkpoint, str(tmp_path / "missing.jinja"))
    broken = tmp_path / "broken.jinja"
    broken.write_text("{{ messages[0]['nope'].upper() }}")
    with pytest.raises(ChatTemplateError, match=r"broken.jinja\) failed"):
        chat_renderer(qwen3_checkpoint, str(broken)).render(MESSAGES)
