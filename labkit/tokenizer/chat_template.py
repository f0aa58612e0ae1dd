"""Chat templates: turning a list of messages into the prompt text a chat model was trained on.

Reference: the ChatML format (`<|im_start|>role\\ncontent<|im_end|>\\n`), as written
in SmolLM2's Jinja template (GGUF key `tokenizer.chat_template`). labkit renders
ChatML itself, without a template engine; the default system prompt, if the
template inserts one when the conversation has none, is read from the template
text. A test renders the real template with Jinja and compares.

    >>> render(smol, [{"role": "user", "content": "Hi"}])        # doctest: +SKIP
    '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
"""
from __future__ import annotations

import re

__all__ = ["render", "default_system_prompt"]

START, END = "<|im_start|>", "<|im_end|>"
# The system turn a template writes when the first message is not a system message.
_DEFAULT_SYSTEM = re.compile(r"messages\[0\]\['role'\] != 'system'.*?<\|im_start\|>system\n(.*?)<\|im_end\|>", re.S)


def default_system_prompt(template: str) -> str | None:
    """The system prompt `template` adds when none is given, or None."""
    match = _DEFAULT_SYSTEM.search(template)
    return match.group(1) if match else None


def _check(messages) -> None:
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] must be a dict with str 'role' and 'content', got {m!r}")


def render(tokenizer, messages, add_generation_prompt: bool = True) -> str:
    """The ChatML prompt for `messages`, ending with an open assistant turn if asked."""
    template = tokenizer.chat_template
    if template is None:
        raise ValueError(f"the tokenizer {tokenizer.name!r} has no chat template")
    if START not in template or END not in template:
        raise ValueError(f"the tokenizer {tokenizer.name!r} has a chat template that is not ChatML, which labkit does not render")
    _check(messages)
    parts = []
    system = default_system_prompt(template)
    if messages and system is not None and messages[0]["role"] != "system":
        parts.append(f"{START}system\n{system}{END}\n")
    for m in messages:
        parts.append(f"{START}{m['role']}\n{m['content']}{END}\n")
    if add_generation_prompt:
        parts.append(f"{START}assistant\n")
    return "".join(parts)
