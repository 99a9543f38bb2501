"""Chat templates: chat-message prompts rendered with the model's own template (transformers).

    from sparrow.data.chat import chat_renderer
    chat = chat_renderer("/models/Qwen3-1.7B", "auto", enable_thinking=False)
    text = chat.render((("user", "What is 2+2?"),))
    # '<|im_start|>user\\nWhat is 2+2?<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n'

`data.chat_template` picks the template:
- "auto": the template of the model's tokenizer (tokenizer_config.json's chat_template or
  chat_template.jinja), through transformers' apply_chat_template;
- "none": no template; a dataset of chat-message prompts is then an error;
- "builtin:NAME": a template shipped in sparrow/assets/chat_templates (qwen3: ChatML with
  Qwen3's thinking switch; plain: "role: content" lines any tokenizer encodes);
- a path to a Jinja file: that template, with the model's tokenizer for its special tokens.
The generation prompt is always added (the model answers as the assistant), and
`data.enable_thinking` (true, false, or null for the template's own default) is passed to the
template as `enable_thinking`, Qwen3's switch. As TRL does, only chat-message prompts are
rendered: a plain-text prompt is the model's input as it stands.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from sparrow.errors import SparrowError

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "assets" / "chat_templates"
BUILTIN_PREFIX = "builtin:"


class ChatTemplateError(SparrowError, ValueError):
    """No usable chat template, or one that fails on a prompt; the message says which."""


@dataclass(frozen=True)
class ChatRenderer:
    """Renders chat messages into the prompt text. The model's template is looked up at the
    first render, so a run on plain-text prompts never loads transformers' tokenizer."""

    model_dir: str
    setting: str = "auto"  # data.chat_template
    enable_thinking: bool | None = None

    @functools.cached_property
    def template(self) -> str | None:
        """The Jinja source; None when the model has none or the setting is none."""
        if self.setting == "none":
            return None
        if self.setting == "auto":
            template = _transformers_tokenizer(self.model_dir).chat_template
            return template.get("default") if isinstance(template, dict) else template
        return template_path(self.setting).read_text(encoding="utf-8")

    @property
    def origin(self) -> str:
        if self.setting == "none":
            return "data.chat_template=none"
        if self.setting == "auto":
            return f"the tokenizer of {self.model_dir}" + ("" if self.template else " has none")
        return str(template_path(self.setting))

    def render(self, messages: tuple[tuple[str, str], ...]) -> str:
        if self.template is None:
            raise ChatTemplateError(
                f"the prompt is a list of chat messages but there is no chat template "
                f"({self.origin}); set data.chat_template to a Jinja file or builtin:qwen3"
            )
        options = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        try:
            return _transformers_tokenizer(self.model_dir).apply_chat_template(
                [{"role": role, "content": content} for role, content in messages],
                chat_template=self.template,
                tokenize=False,
                add_generation_prompt=True,
                **options,
            )
        except Exception as err:  # jinja raises many kinds; one clear line names the template
            raise ChatTemplateError(
                f"chat template ({self.origin}) failed: {type(err).__name__}: {err}"
            ) from None


def chat_renderer(
    model_dir: str | Path, setting: str = "auto", enable_thinking: bool | None = None
) -> ChatRenderer:
    """The renderer data.chat_template names for this model (see the module doc); a file or
    built-in name that does not exist fails here."""
    if setting not in ("auto", "none"):
        template_path(setting)
    return ChatRenderer(str(model_dir), setting, enable_thinking)


def template_path(setting: str) -> Path:
    """The file of "builtin:NAME" or a path; ChatTemplateError naming the choices if none."""
    if setting.startswith(BUILTIN_PREFIX):
        name = setting[len(BUILTIN_PREFIX) :]
        path = TEMPLATES_DIR / f"{name}.jinja"
        if not path.is_file():
            names = sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja"))
            raise ChatTemplateError(
                f"data.chat_template: no built-in template {name!r}; valid: "
                + ", ".join(BUILTIN_PREFIX + n for n in names)
            )
        return path
    path = Path(setting).expanduser()
    if not path.is_file():
        raise ChatTemplateError(
            f"data.chat_template: {setting!r} is not auto, none, builtin:NAME or a Jinja file "
            f"that exists"
        )
    return path


@functools.lru_cache(maxsize=4)
def _transformers_tokenizer(model_dir: str):
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception as err:  # transformers raises many kinds here; report one clear line
        raise ChatTemplateError(
            f"chat templates need the model's tokenizer through transformers; loading it "
            f"from {model_dir} failed: {err}"
        ) from None
