"""A multi-turn conversation with a chat model: the history is re-rendered with the
tokenizer's chat template (ChatML for SmolLM2) and the whole prompt is prefilled each turn.

    >>> import labkit
    >>> model, tok = labkit.load("smollm2-135m")
    >>> chat = Chat(model, tok, max_new_tokens=16)
    >>> "Paris" in chat.send("What is the capital of France?").text
    True
    >>> [m["role"] for m in chat.messages]
    ['user', 'assistant']
"""
from __future__ import annotations

from labkit.generation.reply import generate, stream

__all__ = ["Chat"]


class Chat:
    """Conversation state: `messages` (role/content dicts) and the generation options."""

    def __init__(self, model, tok, system: str | None = None, **generate_kwargs):
        if getattr(tok, "chat_template", None) is None:
            raise ValueError(f"{getattr(tok, 'name', 'this tokenizer')} has no chat template (a base model's file): "
                             "labkit.generate(model, tok, prompt, chat=False) continues a plain prompt")
        self.model, self.tok = model, tok
        self.system = system
        self.generate_kwargs = generate_kwargs
        self.messages: list[dict] = []
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (keep the system prompt)."""
        self.messages = [] if self.system is None else [{"role": "system", "content": self.system}]

    def _check(self, text: str) -> None:
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"a chat message must be non-empty text, got {text!r}")

    def send(self, text: str, **kwargs):
        """Add the user's `text`, generate the reply, add it to the history; return the GenerationOutput."""
        self._check(text)
        self.messages.append({"role": "user", "content": text})
        out = generate(self.model, self.tok, self.messages, **{**self.generate_kwargs, **kwargs})
        self.messages.append({"role": "assistant", "content": out.text})
        return out

    def stream(self, text: str, **kwargs):
        """Like `send`, but yield the reply piece by piece; the history is updated at the end."""
        self._check(text)
        self.messages.append({"role": "user", "content": text})
        pieces = []
        for piece in stream(self.model, self.tok, self.messages, **{**self.generate_kwargs, **kwargs}):
            pieces.append(piece)
            yield piece
        self.messages.append({"role": "assistant", "content": "".join(pieces)})
