"""`labkit serve`: the engine behind an OpenAI-compatible HTTP API on 127.0.0.1.

- `server`: `Server` (uvicorn on a thread, the engine thread behind it) and `kv_pool_blocks`.
- `app`: `create_app`, the FastAPI routes (`/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`,
  `/metrics`).
- `openai_api`: request bodies checked field by field (`parse_chat`, `parse_completion`, `ApiError`).
- `reply_text`: `ReplyText`, token ids to the text a client sees (UTF-8 safe, cut at stop strings).
- `metrics`: `ServerMetrics`, the `/metrics` page in the Prometheus text format.
- `client`: `chat`, `stream_chat` and `load_test` (standard library only).

Imported on its own (`from labkit.serving.http import Server`): it needs FastAPI and uvicorn.
"""
from labkit.serving.http.app import create_app
from labkit.serving.http.client import chat, load_test, stream_chat
from labkit.serving.http.metrics import ServerMetrics
from labkit.serving.http.openai_api import ApiError, parse_chat, parse_completion
from labkit.serving.http.reply_text import ReplyText
from labkit.serving.http.server import DEFAULT_KV_MEMORY, Server, kv_pool_blocks

__all__ = ["Server", "kv_pool_blocks", "DEFAULT_KV_MEMORY", "create_app", "ApiError", "parse_chat",
           "parse_completion", "ReplyText", "ServerMetrics", "chat", "stream_chat", "load_test"]
