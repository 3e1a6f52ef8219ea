"""The OpenAI chat-completions wire format, pure: a request body into an `AgentRequest`
(`decode`; what does not map is an InvalidInputError naming the parameter at fault), the
answer's chunks into a `chat.completion` or `chat.completion.chunk` events, an error
into OpenAI's `{"error": {...}}` body with its HTTP status (the one table of codes,
shared.contracts.errors).

Mapping (docs/guides/doors/openai.md):

* the last message, which must be the user's, is the query; `system` / `developer`
  messages and the request's `metadata` (`key: value` lines) are `extra_context`;
* the session: the `X-Session-Id` header, else `intentroute.session_id`, else one
  derived from the `user` field and the conversation's first user message, which
  every later turn of the same conversation repeats (so its turns share one session,
  whose history the pipeline keeps: earlier turns are not sent on again);
* the model: `intentroute` (the classifier decides), `intentroute/<QUERY_TYPE>` (a
  declared type, honoured for trusted agents as on the other doors), or a fleet model
  the agent's policy lets it choose (`AgentRequest.model`; model_names.py); any other name
  is UNKNOWN_MODEL (404 `model_not_found`);
* `intentroute` (request, `extra_body` in the SDK): `session_id`, `request_id`,
  `query_type`, `user_info`, `editor_context`, `timeout_ms`, as in AgentRequest;
* responses carry the routing decision, validation status and `answered_by` in an
  `intentroute` object (the completion; a stream's finishing chunk); their `model` is
  the model that wrote the delivered answer (`answering_model`: `answered_by`, e.g.
  `ollama/qwen3:1.7b`, `extractive`, `cache`), in a stream on the finishing chunk and
  the usage chunk (the chunks before it cannot know it: they carry the name asked);
* `usage`: the tokens the request log counts (0 when no model wrote the answer or
  ACCOUNTING is off), once per answer: the completion's; in a stream the finishing
  chunk's, or, with `stream_options.include_usage`, the extra chunk before `[DONE]`
  whose `choices` is empty, as OpenAI sends it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import msgspec
from msgspec import UNSET, UnsetType

from services.doors.openai_door import model_names
from shared.contracts.checks import validation_code
from shared.contracts.errors import InvalidInputError, door_status
from shared.contracts.request import AgentRequest
from shared.contracts.response import ErrorCode, ResponseChunk
from shared.contracts.routing import RoutingDecision
from shared.policy.agent import AgentPolicy

NO_POLICY = AgentPolicy()


# -- requests ---------------------------------------------------------------------------

class ContentPart(msgspec.Struct, frozen=True):
    type: str
    text: str = ""


class Message(msgspec.Struct, frozen=True):
    role: str
    content: str | list[ContentPart] | None = None


class StreamOptions(msgspec.Struct, frozen=True):
    include_usage: bool | None = None


class Extension(msgspec.Struct, frozen=True):
    """The request's `intentroute` object: AgentRequest fields OpenAI has no place for."""

    session_id: str | None = None
    request_id: str | None = None
    query_type: str | None = None
    user_info: str | None = None
    editor_context: str | None = None
    timeout_ms: int | None = None


class ChatRequest(msgspec.Struct, frozen=True):
    """The fields read; the others (temperature, tools, ...) are accepted and ignored."""

    model: str
    messages: list[Message]
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    n: int | None = None
    intentroute: Extension | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


_decoder = msgspec.json.Decoder(ChatRequest)


def decode(body: bytes, *, session_header: str, request_id: str,
           policy: AgentPolicy = NO_POLICY) -> tuple[ChatRequest, AgentRequest]:
    """The chat request in `body` and the pipeline's request for it, for an agent with
    `policy` (the models it may name; its bounds are checked after, as any door's:
    shared.contracts.checks); InvalidInputError (UnknownModelError for its model)."""
    chat = decode_chat(body)
    return chat, to_agent_request(chat, session_header=session_header,
                                  request_id=request_id, policy=policy)


def decode_chat(body: bytes) -> ChatRequest:
    try:
        return _decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        raise InvalidInputError(validation_code(exc),
                                f"the body is not a chat completion request: {text}",
                                param=_param_of(text)) from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidInputError(ErrorCode.MALFORMED_JSON,
                                f"the body is not valid JSON: {exc}") from None


def _param_of(text: str) -> str | None:
    """The top-level field a msgspec error names: its path's first step (`... - at
    `$.messages[0].content``), else the missing top-level field (`Object missing required
    field `messages``), else None (the body itself is wrong: `Expected `object`, got
    `array``)."""
    _, at, path = text.rpartition(" - at `$.")
    if at:
        return path.rstrip("`").split("[")[0].split(".")[0] or None
    _, missing, field = text.partition("missing required field `")
    return (field.split("`")[0] or None) if missing else None


def text_of(message: Message) -> str:
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.type != "text":
            raise InvalidInputError(ErrorCode.INVALID_FIELD,
                                    f"content parts of type {part.type!r} are not "
                                    f"supported (text only)", param="messages")
        parts.append(part.text)
    return "\n".join(parts)


def _joined(texts: list[str], metadata: Mapping[str, str] | None) -> str:
    lines = [f"{key}: {value}" for key, value in (metadata or {}).items()]
    return "\n\n".join([t for t in texts if t] + (["\n".join(lines)] if lines else []))


def derived_session(user: str, opening: str) -> str:
    """The session of a conversation no id names: the same for every turn of it."""
    digest = hashlib.sha256(f"{user}\x00{opening}".encode()).hexdigest()[:32]
    return f"oai-{digest}"


def _invalid(message: str, param: str, code: ErrorCode = ErrorCode.INVALID_FIELD
             ) -> InvalidInputError:
    return InvalidInputError(code, message, param=param)


def _route(chat: ChatRequest, ext: Extension, policy: AgentPolicy) -> tuple[str | None, str]:
    """(the query type declared, None for none; the fleet model asked, "" for none)."""
    declared, model = model_names.resolve(chat.model, policy)
    if declared and ext.query_type and ext.query_type != declared:
        raise _invalid(f"model {chat.model!r} declares {declared}, intentroute.query_type "
                       f"{ext.query_type}", "model")
    return declared or ext.query_type or None, model


def to_agent_request(chat: ChatRequest, *, session_header: str, request_id: str,
                     policy: AgentPolicy = NO_POLICY) -> AgentRequest:
    """The pipeline's request for `chat` from an agent with `policy` (its bounds are
    checked after, as any door's: shared.contracts.checks); InvalidInputError for what
    does not map."""
    if chat.n not in (None, 1):
        raise _invalid("only n=1 is supported", "n")
    if not chat.messages:
        raise _invalid("messages is empty", "messages", ErrorCode.MISSING_FIELD)
    last = chat.messages[-1]
    if last.role != "user":
        raise _invalid(f"the last message must be the user's question, not {last.role!r}",
                       "messages")
    ext = chat.intentroute or Extension()
    query_type, model = _route(chat, ext, policy)
    texts: dict[str, list[str]] = {"system": [], "user": []}
    for message in chat.messages:
        role = "system" if message.role in ("system", "developer") else message.role
        if role in texts:
            texts[role].append(text_of(message))
    session = (session_header or ext.session_id
               or derived_session(chat.user or "", texts["user"][0]))
    return AgentRequest(
        request_id=ext.request_id or request_id, session_id=session, query=texts["user"][-1],
        query_type=query_type, extra_context=_joined(texts["system"], chat.metadata),
        user_info=ext.user_info or chat.user or "", editor_context=ext.editor_context or "",
        timeout_ms=ext.timeout_ms or 0, model=model)


# -- responses --------------------------------------------------------------------------

class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class RouteInfo(msgspec.Struct, frozen=True):
    """The `intentroute` object of a completion / a stream's finishing chunk."""

    request_id: str
    session_id: str
    query_type: str
    decision: RoutingDecision | None
    validation_status: str
    answered_by: str
    avap_code: str
    retried: bool
    kind: str


class Delta(msgspec.Struct, frozen=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None


class ChunkChoice(msgspec.Struct, frozen=True):
    index: int
    delta: Delta
    logprobs: None
    finish_reason: str | None


class Chunk(msgspec.Struct, frozen=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | UnsetType | None = UNSET
    intentroute: RouteInfo | UnsetType = UNSET


class AnswerMessage(msgspec.Struct, frozen=True):
    role: str
    content: str
    refusal: None = None


class Choice(msgspec.Struct, frozen=True):
    index: int
    message: AnswerMessage
    logprobs: None
    finish_reason: str


class Completion(msgspec.Struct, frozen=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    intentroute: RouteInfo


class ErrorBody(msgspec.Struct, frozen=True):
    message: str
    type: str
    code: str
    param: str | None = None


class ErrorEnvelope(msgspec.Struct, frozen=True):
    error: ErrorBody


def usage_of(final: ResponseChunk) -> Usage:
    used = final.usage
    tokens_in, tokens_out = (used.tokens_in, used.tokens_out) if used else (0, 0)
    return Usage(tokens_in, tokens_out, tokens_in + tokens_out)


def route_info(final: ResponseChunk, req: AgentRequest) -> RouteInfo:
    return RouteInfo(request_id=req.request_id, session_id=req.session_id,
                     query_type=final.query_type, decision=final.decision,
                     validation_status=final.validation_status,
                     answered_by=final.answered_by, avap_code=final.avap_code,
                     retried=final.retried, kind=final.kind.value)


def answering_model(final: ResponseChunk, asked: str) -> str:
    """The response's `model`: what wrote the delivered answer (`answered_by`: a fleet
    model, `extractive`, `cache`; a split message's parts', joined by `+` as the request
    log joins them), or the name asked when the final chunk names none."""
    if final.parts:
        return "+".join(dict.fromkeys(p.answered_by for p in final.parts if p.answered_by)
                        ) or final.answered_by or asked
    return final.answered_by or asked


def completion(final: ResponseChunk, text: str, *, req: AgentRequest, asked: str,
               created: int) -> Completion:
    return Completion(
        id=completion_id(req.request_id), object="chat.completion", created=created,
        model=answering_model(final, asked),
        choices=[Choice(0, AnswerMessage("assistant", text), None, "stop")],
        usage=usage_of(final), intentroute=route_info(final, req))


def completion_id(request_id: str) -> str:
    return f"chatcmpl-{request_id}"


def chunk(request_id: str, model: str, created: int, delta: Delta,
          finish_reason: str | None = None, *, usage: Usage | UnsetType | None = UNSET,
          info: RouteInfo | UnsetType = UNSET) -> Chunk:
    return Chunk(completion_id(request_id), "chat.completion.chunk", created, model,
                 [ChunkChoice(0, delta, None, finish_reason)], usage=usage, intentroute=info)


def usage_chunk(request_id: str, model: str, created: int, usage: Usage) -> Chunk:
    return Chunk(completion_id(request_id), "chat.completion.chunk", created, model, [],
                 usage=usage)


def headers_of(final: ResponseChunk | None, request_id: str, session_id: str
               ) -> dict[str, str]:
    """The `X-Intentroute-*` headers: the ids, and what is known of the answer (a stream's
    headers go before it: the ids only)."""
    headers = {"x-request-id": request_id, "X-Intentroute-Request-Id": request_id,
               "X-Intentroute-Session-Id": session_id}
    if final is not None and final.error is None:
        headers["X-Intentroute-Query-Type"] = final.query_type
        headers["X-Intentroute-Layer"] = final.decision.layer.value if final.decision else ""
        headers["X-Intentroute-Validation-Status"] = final.validation_status
        headers["X-Intentroute-Answered-By"] = final.answered_by
    return headers


def error_envelope(code: str, message: str, param: str | None = None
                   ) -> tuple[int, ErrorEnvelope]:
    """An error as OpenAI answers it: its code's HTTP status and error type (the one
    table), the code itself in the body, as on the other doors, unless OpenAI has its
    own for it (UNKNOWN_MODEL: `model_not_found`, `param` `model`)."""
    status = door_status(code)
    return status.http, ErrorEnvelope(ErrorBody(
        message=message, type=status.openai, code=status.openai_code or code,
        param=param or status.openai_param))
