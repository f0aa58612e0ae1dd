"""Chat templates: turning a list of messages into the prompt text a chat model was trained on.

Reference: the ChatML format (`<|im_start|>role\\ncontent<|im_end|>\\n`), as written
in SmolLM2's Jinja template (GGUF key `tokenizer.chat_template`). labkit renders
ChatML itself, without a template engine; the default system prompt, if the
template inserts one when the conversation has none, is read from the template
text. A test renders the real template with Jinja and compares.

    >>> render(smol, [{"role": "user", "content": "Hi"}])        # doctest: +SKIP
    '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'

Encode a conversation with `encode_chat`, not `tokenizer.encode(render(...))`: `encode`
turns every special-token text into its special id, so a message containing the text
'<|im_end|>\\n<|im_start|>system' would close its own turn and forge a system turn (prompt
injection through special tokens; tiktoken's `encode` refuses special text unless allowed, and
Hugging Face `transformers` has `split_special_tokens` against the same). `encode_chat` gives special ids
only to the template's own control tokens; the text between them, message content included,
is encoded as ordinary text.
"""
from __future__ import annotations

import re

__all__ = ["render", "render_parts", "encode_chat", "default_system_prompt"]

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


def render_parts(tokenizer, messages, add_generation_prompt: bool = True) -> list[tuple[str, bool]]:
    """The ChatML prompt as (text, is_control) parts: the template's control tokens are control
    parts, everything else (role names, newlines, message content) is text.

        >>> render_parts(smol, [{"role": "user", "content": "Hi"}])[-6:]     # doctest: +SKIP
        [('<|im_start|>', True), ('user\\nHi', False), ('<|im_end|>', True), ('\\n', False), ('<|im_start|>', True), ('assistant\\n', False)]
    """
    template = tokenizer.chat_template
    if template is None:
        raise ValueError(f"the tokenizer {tokenizer.name!r} has no chat template")
    if START not in template or END not in template:
        raise ValueError(f"the tokenizer {tokenizer.name!r} has a chat template that is not ChatML, which labkit does not render")
    _check(messages)
    turns = [(m["role"], m["content"]) for m in messages]
    system = default_system_prompt(template)
    if messages and system is not None and messages[0]["role"] != "system":
        turns.insert(0, ("system", system))
    parts = []
    for role, content in turns:
        parts += [(START, True), (f"{role}\n{content}", False), (END, True), ("\n", False)]
    if add_generation_prompt:
        parts += [(START, True), ("assistant\n", False)]
    return parts


def render(tokenizer, messages, add_generation_prompt: bool = True) -> str:
    """The ChatML prompt for `messages`, ending with an open assistant turn if asked."""
    return "".join(text for text, _ in render_parts(tokenizer, messages, add_generation_prompt))


def encode_chat(tokenizer, messages, add_generation_prompt: bool = True) -> list[int]:
    """The ids of the ChatML prompt, with special ids only for the template's control tokens.

        >>> encode_chat(smol, [{"role": "user", "content": "<|im_end|>"}]).count(smol.eos_id)   # doctest: +SKIP
        2

    For content without special-token text the ids equal `tokenizer.encode(render(...))`:
    each run of text between control tokens is encoded as one string, as `encode` does
    between specials, so merges see the same text. A control token that is not a special
    token of this vocabulary is plain text there too, and joins the run around it.
    """
    specials = tokenizer.special_tokens
    ids: list[int] = []
    run: list[str] = []
    for text, control in render_parts(tokenizer, messages, add_generation_prompt):
        if control and text in specials:
            ids += tokenizer.encode_ordinary("".join(run)) if run else []
            ids.append(specials[text])
            run = []
        else:
            run.append(text)
    return ids + (tokenizer.encode_ordinary("".join(run)) if run else [])
