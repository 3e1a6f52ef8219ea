"""Hand-written fakes of the ports a stage needs, strict where the real thing is strict.

`RecordingBus` records every publish and answers `last_chunk` from what was published,
as the AGENT_RESPONSES stream would; `StrictStore` refuses what Postgres refuses (NUL
characters, ids longer than their column, JSON that is not JSON), as the real store
does, with StoreRejectedError; `FuzzDelivery` records acks, nacks and dead letters.
The adapters (Layer 2, search, chat backend, parser) are deterministic functions of
their input, so one example always takes the same path.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from services.classifier.cascade import Prediction
from services.generator.prompts import ChatMessage
from services.parser.avap import validate
from services.retriever.port import SearchResult
from services.validator.parser_client import ParseOutcome
from shared.auth.ports import AgentInfo
from shared.contracts.codec import decode_chunk
from shared.contracts.ids import MAX_ID_CHARS
from shared.contracts.pipeline import Passage
from shared.contracts.response import ResponseChunk
from shared.contracts.routing import HISTORY_WINDOW, HistoryEntry, QueryType
from shared.store.rows import HistoryRow, RequestLogRow, Row, TurnRow
from shared.store.writer import StoreRejectedError


@dataclass(frozen=True)
class Sent:
    """One publish: subject, stream ("" for a core publish), msg id, payload."""

    subject: str
    stream: str
    msg_id: str
    payload: bytes


class ConnectionLostError(ConnectionError):
    """The fake bus's connection dropped (fault injection)."""


class RecordingBus:
    """Records publishes; `drop_at(n)` makes the n-th publish from now on, and every one
    after it, fail as a lost connection does, until `heal()`."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.claims: dict[str, bytes] = {}
        self.tripped = False
        self.healed = 0
        self._fail_at = 0
        self._count = 0

    def drop_at(self, n: int) -> None:
        self._fail_at, self._count = n, 0

    def heal(self) -> None:
        self._fail_at, self._count, self.tripped = 0, 0, False
        self.healed += 1

    def _connected(self) -> None:
        self._count += 1
        if self.tripped or (self._fail_at and self._count >= self._fail_at):
            self.tripped = True
            raise ConnectionLostError("connection to the server lost")

    async def publish(self, subject: str, payload: bytes) -> None:
        self._connected()
        self.sent.append(Sent(subject, "", "", payload))

    async def publish_durable(self, subject: str, payload: bytes, *, stream: str,
                              msg_id: str) -> None:
        self._connected()
        self.sent.append(Sent(subject, stream, msg_id, payload))

    async def publish_first(self, subject: str, payload: bytes, *, stream: str,
                            msg_id: str) -> bytes:
        self._connected()
        return self.claims.setdefault(subject, payload)

    async def stored(self, subject: str, *, stream: str, msg_id: str) -> bytes | None:
        self._connected()
        return next((s.payload for s in self.sent
                     if s.subject == subject and s.msg_id == msg_id), None)

    async def claimed(self, subject: str, *, stream: str) -> bytes | None:
        self._connected()
        return self.claims.get(subject)

    def reconnects(self) -> int:
        return self.healed

    async def last_chunk(self, subject: str, stream: str) -> ResponseChunk | None:
        for sent in reversed(self.sent):
            if sent.subject == subject:
                return decode_chunk(sent.payload)
        return None


def _text_problem(value: str) -> str:
    if "\x00" in value:
        return "NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "not UTF-8"
    return ""


def row_problem(row: Row) -> str:
    """Why Postgres would refuse `row` ("" if it would not)."""
    ids = (row.agent_id, row.session_id, row.request_id)
    if any(len(i) > MAX_ID_CHARS for i in ids):
        return "id longer than its column"
    texts: list[str] = list(ids)
    if isinstance(row, TurnRow):
        texts += [row.query, row.answer, row.query_type]
    elif isinstance(row, HistoryRow):
        texts += [row.type, row.topic, row.layer]
        if not math.isfinite(row.confidence):
            return "confidence not finite"
    elif isinstance(row, RequestLogRow):
        texts += [row.outcome, row.query_type, row.layer, row.model_slot, row.answered_by,
                  row.validation_status, *row.stage_ms]
        numbers = [*row.stage_ms.values(), row.confidence or 0.0, row.total_ms or 0.0]
        if not all(math.isfinite(n) for n in numbers):
            return "number not finite (jsonb / float8 refuse it)"
        try:
            json.dumps(row.stage_ms, allow_nan=False)
        except ValueError:
            return "stage_ms not JSON"
    for text in texts:
        problem = _text_problem(text)
        if problem:
            return problem
    return ""


class StrictStore:
    """The turn store with the database's refusals; reads return what it was given."""

    def __init__(self, *, history: list[HistoryEntry] | None = None, previous: str = "",
                 turns: list[tuple[str, str]] | None = None) -> None:
        self.rows: list[Row] = []
        self.refused: list[tuple[Row, str]] = []
        self._history = history or []
        self._previous = previous
        self._turns = turns or []

    async def last_history(self, agent_id: str, session_id: str, n: int = HISTORY_WINDOW
                           ) -> list[HistoryEntry]:
        return self._history[-n:]

    async def previous_answer(self, agent_id: str, session_id: str) -> str | None:
        return self._previous or None

    async def last_turns(self, agent_id: str, session_id: str, n: int = 4
                         ) -> list[tuple[str, str]]:
        return self._turns[-n:]

    async def write(self, *rows: Row, deadline: float | None = None) -> None:
        # One statement: one bad row refuses them all (the writer's caller-by-caller
        # retry isolates callers, not rows of one caller).
        for row in rows:
            problem = row_problem(row)
            if problem:
                self.refused.extend((r, problem) for r in rows)
                raise StoreRejectedError(f"refused: {problem}")
        self.rows.extend(rows)


@dataclass
class FuzzDelivery:
    """A delivery as the consumer hands it over; `nack`/`dead_letter` are recorded."""

    data: bytes
    subject: str
    deliveries: int = 1
    stream_seq: int = 1
    settled: bool = False
    # The bus lost its connection during this delivery (a fault the example injected).
    faulted: bool = False
    nacked: list[float | None] = field(default_factory=list)
    dead_lettered: list[tuple[str, str]] = field(default_factory=list)

    async def nack(self, delay: float | None = None) -> None:
        self.nacked.append(delay)
        self.settled = True

    async def in_progress(self) -> None:
        pass

    async def dead_letter(self, stage: str, reason: str) -> None:
        self.dead_lettered.append((stage, reason))
        self.settled = True


class FakeAgents:
    def __init__(self, *agents: AgentInfo) -> None:
        self.agents = {a.agent_id: a for a in agents}

    async def get(self, agent_id: str) -> AgentInfo | None:
        return self.agents.get(agent_id)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()


@dataclass(frozen=True)
class _Prediction:
    label: str
    confidence: float
    alternatives: list[tuple[str, float]]


class HashedLayer2:
    """Layer 2 as a hash of the text: any label, any confidence, some unsure."""

    async def predict(self, text: str) -> Prediction:
        d = _digest(text)
        labels = [t.value for t in QueryType]
        label = labels[d[0] % len(labels)]
        confidence = d[1] / 255
        other = labels[d[2] % len(labels)]
        return _Prediction(label, confidence, [(label, confidence), (other, 1 - confidence)])


class ScriptedRetrieval:
    """Passages made from the query (hostile text travels on) and from `extra`."""

    def __init__(self, extra: list[Passage] | None = None) -> None:
        self.extra = extra or []

    async def search(self, query: str, k: int) -> SearchResult:
        d = _digest(query)
        passages = [Passage(f"doc-{d[0]}", query[:80], f"About {query}.", 1.0, "kb"),
                    *self.extra][: max(k, 0)]
        return SearchResult(passages=passages, method="bm25", dense_top1=d[1] / 255,
                            bm25_top1=float(d[2]), bm25_scores=[float(d[2])] * len(passages))

    async def maybe_reload(self) -> bool:
        return False

    async def close(self) -> None:
        pass


class EchoBackend:
    """A chat backend that streams the prompt back in pieces (the prompt is rendered)."""

    name = "echo"

    async def stream(self, model: str, messages: list[ChatMessage]) -> AsyncIterator[str]:
        text = messages[-1].content + " | " + messages[0].content[:200]
        for start in range(0, len(text), 64):
            yield text[start:start + 64]


class InProcessParser:
    """The reference AVAP parser, called in process instead of over gRPC."""

    async def validate(self, code: str, *, strict: bool = False) -> ParseOutcome:
        result = validate(code, strict=strict)
        return ParseOutcome(valid=result.valid, trace=tuple(result.trace))

