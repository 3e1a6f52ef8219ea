from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentRequest(_message.Message):
    __slots__ = ("query", "session_id", "agent_id", "extra_context", "user_info", "editor_context", "query_type", "request_id", "timeout_ms")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    EXTRA_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    USER_INFO_FIELD_NUMBER: _ClassVar[int]
    EDITOR_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    QUERY_TYPE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    query: str
    session_id: str
    agent_id: str
    extra_context: str
    user_info: str
    editor_context: str
    query_type: str
    request_id: str
    timeout_ms: int
    def __init__(self, query: _Optional[str] = ..., session_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., extra_context: _Optional[str] = ..., user_info: _Optional[str] = ..., editor_context: _Optional[str] = ..., query_type: _Optional[str] = ..., request_id: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class AgentResponse(_message.Message):
    __slots__ = ("text", "avap_code", "is_final", "validation_status", "query_type", "request_id", "kind", "error_code", "error_message", "decision_json", "decision")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    AVAP_CODE_FIELD_NUMBER: _ClassVar[int]
    IS_FINAL_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_STATUS_FIELD_NUMBER: _ClassVar[int]
    QUERY_TYPE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DECISION_JSON_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    text: str
    avap_code: str
    is_final: bool
    validation_status: str
    query_type: str
    request_id: str
    kind: str
    error_code: str
    error_message: str
    decision_json: str
    decision: RoutingDecision
    def __init__(self, text: _Optional[str] = ..., avap_code: _Optional[str] = ..., is_final: _Optional[bool] = ..., validation_status: _Optional[str] = ..., query_type: _Optional[str] = ..., request_id: _Optional[str] = ..., kind: _Optional[str] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., decision_json: _Optional[str] = ..., decision: _Optional[_Union[RoutingDecision, _Mapping]] = ...) -> None: ...

class RoutingDecision(_message.Message):
    __slots__ = ("type", "layer", "confidence", "model_slot", "clarity", "alternatives", "resolved_reference", "declared_ignored", "history_unavailable")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    MODEL_SLOT_FIELD_NUMBER: _ClassVar[int]
    CLARITY_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    DECLARED_IGNORED_FIELD_NUMBER: _ClassVar[int]
    HISTORY_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    type: str
    layer: str
    confidence: float
    model_slot: str
    clarity: str
    alternatives: _containers.RepeatedCompositeFieldContainer[Alternative]
    resolved_reference: bool
    declared_ignored: bool
    history_unavailable: bool
    def __init__(self, type: _Optional[str] = ..., layer: _Optional[str] = ..., confidence: _Optional[float] = ..., model_slot: _Optional[str] = ..., clarity: _Optional[str] = ..., alternatives: _Optional[_Iterable[_Union[Alternative, _Mapping]]] = ..., resolved_reference: _Optional[bool] = ..., declared_ignored: _Optional[bool] = ..., history_unavailable: _Optional[bool] = ...) -> None: ...

class Alternative(_message.Message):
    __slots__ = ("type", "confidence")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    type: str
    confidence: float
    def __init__(self, type: _Optional[str] = ..., confidence: _Optional[float] = ...) -> None: ...

class FeedbackMetadata(_message.Message):
    __slots__ = ("completion_quality", "latency_ms", "token_count")
    COMPLETION_QUALITY_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    completion_quality: float
    latency_ms: float
    token_count: int
    def __init__(self, completion_quality: _Optional[float] = ..., latency_ms: _Optional[float] = ..., token_count: _Optional[int] = ...) -> None: ...

class FeedbackRequest(_message.Message):
    __slots__ = ("request_id", "outcome", "metadata", "agent_id", "part")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    outcome: str
    metadata: FeedbackMetadata
    agent_id: str
    part: int
    def __init__(self, request_id: _Optional[str] = ..., outcome: _Optional[str] = ..., metadata: _Optional[_Union[FeedbackMetadata, _Mapping]] = ..., agent_id: _Optional[str] = ..., part: _Optional[int] = ...) -> None: ...

class FeedbackReply(_message.Message):
    __slots__ = ("request_id", "accepted", "repeat")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REPEAT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    accepted: bool
    repeat: bool
    def __init__(self, request_id: _Optional[str] = ..., accepted: _Optional[bool] = ..., repeat: _Optional[bool] = ...) -> None: ...
