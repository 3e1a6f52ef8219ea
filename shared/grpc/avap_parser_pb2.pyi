from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ValidateRequest(_message.Message):
    __slots__ = ("code", "strict")
    CODE_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    code: str
    strict: bool
    def __init__(self, code: _Optional[str] = ..., strict: _Optional[bool] = ...) -> None: ...

class ValidateResponse(_message.Message):
    __slots__ = ("valid", "trace")
    VALID_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    valid: bool
    trace: _containers.RepeatedCompositeFieldContainer[TraceLine]
    def __init__(self, valid: _Optional[bool] = ..., trace: _Optional[_Iterable[_Union[TraceLine, _Mapping]]] = ...) -> None: ...

class TraceLine(_message.Message):
    __slots__ = ("line", "column", "code", "message", "suggestion")
    LINE_FIELD_NUMBER: _ClassVar[int]
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SUGGESTION_FIELD_NUMBER: _ClassVar[int]
    line: int
    column: int
    code: str
    message: str
    suggestion: str
    def __init__(self, line: _Optional[int] = ..., column: _Optional[int] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., suggestion: _Optional[str] = ...) -> None: ...
