"""The OpenAI API as labkit's server speaks it: request bodies checked field by field, replies shaped as the SDK reads them.

Request bodies are validated with pydantic in strict mode: a number must be a JSON number
(`"0.7"` and `true` are refused), every range is checked, and a field labkit does not
implement (`tools`, `logit_bias`, image parts...) is refused with a 400
that names it, never accepted and ignored. What is implemented follows the API reference:

- chat: `messages` (roles system, developer, user, assistant; content a string or text
  parts), `max_tokens`/`max_completion_tokens`, `temperature`, `top_p`, `n`, `stop`, `seed`,
  `stream` with `stream_options.include_usage`, `logprobs`/`top_logprobs`,
  `presence_penalty`/`frequency_penalty` (OpenAI's definitions: they count the reply's own
  tokens, not the prompt's);
- completions: `prompt` (a string or token ids) and the same knobs, `logprobs` as an integer.

    >>> parse_chat({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "temperature": "0.7"}, "m")
    Traceback (most recent call last):
    ...
    labkit.serving.http.openai_api.ApiError: temperature: Input should be a valid number (got '0.7')
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from labkit.sampling.pipeline import SamplingParams
from labkit.sampling.stopping import StopStrings

__all__ = ["ApiError", "Job", "parse_chat", "parse_completion", "UNSUPPORTED"]

# fields of the API that labkit refuses, with why (a client sending them gets this, not a silent no-op)
UNSUPPORTED = {
    "tools": "labkit's server does not call tools", "tool_choice": "labkit's server does not call tools",
    "functions": "labkit's server does not call functions", "function_call": "labkit's server does not call functions",
    "parallel_tool_calls": "labkit's server does not call tools",
    "logit_bias": "logit_bias is not implemented", "audio": "labkit serves text only",
    "modalities": "labkit serves text only", "prediction": "predicted outputs are not implemented",
    "web_search_options": "labkit does not search the web", "reasoning_effort": "labkit's models do not reason",
    "service_tier": "labkit has one tier", "store": "labkit stores nothing", "metadata": "labkit stores nothing",
    "echo": "echo is not implemented", "best_of": "best_of is not implemented", "suffix": "suffix is not implemented",
}


class ApiError(Exception):
    """An error reply: HTTP `status`, a message, and the offending `param` (OpenAI's error object)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.param, self.code, self.headers = status, param, code, headers or {}

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextPart]]


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    name: str
    schema_: dict = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Strict):
    include_usage: bool = False


class _Common(_Strict):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(None, ge=1, le=8)
    stop: Union[str, list[str], None] = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    user: str | None = None  # an end-user id for the operator's logs: it changes no output in the API either
    response_format: ResponseFormat | None = None


class ChatBody(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)


class CompletionBody(_Common):
    prompt: Union[str, list[int], list[str]]
    logprobs: int | None = Field(None, ge=0, le=5)


@dataclass
class Job:
    """A validated request: what to encode, how many replies, and how to sample and end them."""

    kind: str                     # "chat" or "completion"
    prompt: object                # chat messages [{"role", "content": str}], a str, or token ids
    max_tokens: int | None
    params: SamplingParams
    n: int
    stop: StopStrings
    seed: int | None
    stream: bool
    include_usage: bool
    logprobs: int | None          # None: no log-probabilities; k: the chosen token's and the top k
    json_schema: object = None    # the reply's format: a JSON Schema dict, "json_object", or None (free text)


_TYPE_TAGS = {"str", "int", "float", "bool", "none"}


def _first_error(exc: ValidationError) -> ApiError:
    """pydantic's first complaint as an API error naming the field (`messages.0.content`), without union tags."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]
                   if not (isinstance(p, str) and (p in _TYPE_TAGS or "[" in p or p[:1].isupper())))
    got = err.get("input")
    detail = err["msg"] if isinstance(got, (dict, list)) else f"{err['msg']} (got {got!r:.60})"
    return ApiError(400, f"{loc}: {detail}", param=loc.split(".")[0] or None, code="invalid_value")


def _validate(model_cls, data, model_name: str):
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_request")
    for key in data:
        if key not in model_cls.model_fields:
            why = UNSUPPORTED.get(key, "labkit's server does not know this field")
            raise ApiError(400, f"{key!r} is not supported: {why}", param=key, code="unsupported_parameter")
    if "messages" in data and isinstance(data["messages"], list):
        for i, m in enumerate(data["messages"]):
            parts = m.get("content") if isinstance(m, dict) else None
            for part in parts if isinstance(parts, list) else []:
                if isinstance(part, dict) and part.get("type") != "text":
                    raise ApiError(400, f"messages.{i}.content: a {part.get('type')!r} part is not supported: labkit "
                                   "serves text-only models (send text parts)", param="messages", code="unsupported_content")
    try:
        body = model_cls.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc) from None
    if body.model is not None and body.model != model_name:
        raise ApiError(404, f"the model {body.model!r} does not exist; this server runs {model_name!r}",
                       param="model", code="model_not_found")
    return body


def _job(kind: str, body, prompt, max_tokens, logprobs) -> Job:
    stop = body.stop
    if isinstance(stop, list) and len(stop) > 4:
        raise ApiError(400, f"stop: at most 4 stop strings, got {len(stop)}", param="stop")
    try:
        stops = StopStrings(stop)
        params = SamplingParams(temperature=0.0 if body.temperature is None else body.temperature,
                                top_p=1.0 if body.top_p is None else body.top_p,
                                presence_penalty=body.presence_penalty or 0.0,
                                frequency_penalty=body.frequency_penalty or 0.0)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, str(exc), param="stop" if "stop" in str(exc) else None) from None
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if body.stream_options is not None and not body.stream:
        raise ApiError(400, "stream_options is only allowed with stream=true", param="stream_options")
    fmt, schema = body.response_format, None
    if fmt is not None and fmt.type == "json_object":
        schema = "json_object"
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise ApiError(400, "response_format: type 'json_schema' needs a json_schema object", param="response_format")
        schema = fmt.json_schema.schema_
    return Job(kind, prompt, max_tokens, params, body.n or 1, stops, body.seed, bool(body.stream), include_usage,
               logprobs, schema)


def parse_chat(data, model_name: str) -> Job:
    """Validate a chat-completions body (ApiError on bad input)."""
    body = _validate(ChatBody, data, model_name)
    if body.max_tokens is not None and body.max_completion_tokens is not None and body.max_tokens != body.max_completion_tokens:
        raise ApiError(400, "max_tokens and max_completion_tokens disagree; send one", param="max_tokens")
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
    messages = [{"role": "system" if m.role == "developer" else m.role,  # developer: the newer name of system
                 "content": m.content if isinstance(m.content, str) else "".join(p.text for p in m.content)}
                for m in body.messages]
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    return _job("chat", body, messages, body.max_completion_tokens or body.max_tokens, logprobs)


def parse_completion(data, model_name: str) -> Job:
    """Validate a (legacy) completions body: one prompt, a string or token ids."""
    body = _validate(CompletionBody, data, model_name)
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise ApiError(400, f"prompt: labkit serves one prompt per request, got {len(prompt)}", param="prompt")
        prompt = prompt[0]
    if not prompt:
        raise ApiError(400, "prompt must not be empty", param="prompt")
    return _job("completion", body, prompt, body.max_tokens, body.logprobs)
