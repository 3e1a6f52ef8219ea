"""Hand-written fakes of the ports a stage needs, strict where the real thing is strict:
what a stage published, what it wrote, and a delivery as its consumer would hand it over.

`RecordingBus` records every publish and answers `last_chunk` from what was published,
as the AGENT_RESPONSES stream would; it can drop its connection (fault injection).
`FakeStore` refuses what Postgres refuses (NUL characters, ids longer than their column,
JSON that is not JSON), as the real store does, with StoreRejectedError. `FakeDelivery`
records acks, nacks and dead letters. The adapters (Layer 2 and its encoder, Layer 3,
search, chat backend, parser, the validator's checker) are deterministic functions of
their input, so one example always takes the same path, or answer what the test
scripted; each records what it was asked.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from services.classifier.ports import Prediction
from services.doors.door import Door
from services.doors.throttle import AuthThrottle
from services.gateway.feedback_recorder import FeedbackRecorder
from services.gateway.limits.ports import ADMITTED, Admission, Ask, Grant, Limits
from services.generator.prompts import ChatMessage
from services.parser.avap import validate
from services.retriever.ports import SearchResult
from services.validator.ports import CheckResult, ParseOutcome
from shared.auth.ports import AgentInfo, TokenVerifier
from shared.contracts.checks import check_feedback, refused
from shared.contracts.codec import decode_chunk
from shared.contracts.feedback import Feedback, FeedbackAck
from shared.contracts.ids import MAX_ID_CHARS, MAX_PART_ID_CHARS, part_id
from shared.contracts.pipeline import Passage
from shared.contracts.response import ErrorCode, ResponseChunk
from shared.contracts.routing import HISTORY_WINDOW, HistoryEntry, QueryType
from shared.encoders.embeddings import Vectors
from shared.policy.agent import AgentPolicy
from shared.store.feedback_table import Recorded
from shared.store.ports import StoreRejectedError, StoreUnavailableError
from shared.store.rows import HistoryRow, RequestLogRow, Row, TurnRow

# ------------------------------------------------------------------------ the bus


class Sent(NamedTuple):
    """One publish: subject, stream ("" for a core publish), msg id, payload."""

    subject: str
    stream: str
    msg_id: str
    payload: bytes


class ConnectionLostError(ConnectionError):
    """The fake bus's connection dropped (fault injection)."""


class RecordingBus:
    """Records publishes (`sent`: subject, stream or "" for core, msg id, payload) and
    claims (kept apart from `sent`, what callers see). `drop_at(n)` makes the n-th call
    from now on, and every one after it, fail as a lost connection does, until `heal()`.

    `last_chunk` is the last chunk stored on a subject, of any kind, as the stream's is;
    `stored_seq` stands for what an earlier delivery stored there before this bus was
    made: a text chunk at `stored_seq - 1` (when nothing was published on the subject)."""

    def __init__(self, *, stored_seq: int = 0) -> None:
        self.sent: list[Sent] = []
        self.claims: dict[str, bytes] = {}
        self.tripped = False
        self.healed = 0
        self._stored_seq = stored_seq
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
        """The last message on `subject` when it was sent under `msg_id` (the real bus
        reads the subject's last message by subject, as a worker's grant allows)."""
        self._connected()
        last = next((sent for sent in reversed(self.sent) if sent[0] == subject), None)
        return last[3] if last is not None and last[2] == msg_id else None

    async def claimed(self, subject: str, *, stream: str) -> bytes | None:
        self._connected()
        return self.claims.get(subject)

    def reconnects(self) -> int:
        return self.healed

    async def last_chunk(self, subject: str, stream: str) -> ResponseChunk | None:
        for sent_subject, _, _, payload in reversed(self.sent):
            if sent_subject == subject:
                return decode_chunk(payload)
        if self._stored_seq:
            return ResponseChunk(request_id="", seq=self._stored_seq - 1, text="...")
        return None

    def on(self, subject: str) -> list[bytes]:
        return [payload for subj, _, _, payload in self.sent if subj == subject]

    def chunks(self, request_id: str, agent_id: str = "a") -> list[ResponseChunk]:
        return [decode_chunk(p) for p in self.on(f"agent.response.{agent_id}.{request_id}")]

    def subjects(self) -> list[tuple[str, str]]:
        return [(subj, stream) for subj, stream, _, _ in self.sent]


# ------------------------------------------------------------------------ the store


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
    # A history entry's request id may be a part's (`<request_id>#<k>`, a wider column).
    widest = MAX_PART_ID_CHARS if isinstance(row, HistoryRow) else MAX_ID_CHARS
    if any(len(i) > MAX_ID_CHARS for i in ids[:2]) or len(row.request_id) > widest:
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


class FakeStore:
    """The turn store with the database's refusals (`refused`); reads return what it was
    given (`history_reads` counts the history reads); `rows` holds what was written."""

    def __init__(self, *, history: list[HistoryEntry] | None = None,
                 previous: str | None = None, turns: list[tuple[str, str]] | None = None
                 ) -> None:
        self.rows: list[Row] = []
        self.refused: list[tuple[Row, str]] = []
        self.history_reads = 0
        self._history = history or []
        self._previous = previous
        self._turns = turns or []

    async def last_history(self, agent_id: str, session_id: str, n: int = HISTORY_WINDOW
                           ) -> list[HistoryEntry]:
        self.history_reads += 1
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

    def kinds(self) -> list[str]:
        return [type(r).__name__ for r in self.rows]


# ------------------------------------------------------------------------ the delivery


@dataclass
class FakeDelivery:
    """A delivery as the consumer hands it over; `nack`/`dead_letter` are recorded. Its
    stream stored it when it was made (`stored_at`, epoch seconds; 0: unknown)."""

    data: bytes
    subject: str = ""
    deliveries: int = 1
    stream_seq: int = 1
    stored_at: float = field(default_factory=time.time)
    settled: bool = False
    # The bus lost its connection during this delivery (a fault the example injected).
    faulted: bool = False
    nacked: list[float | None] = field(default_factory=list)
    dead_lettered: list[tuple[str, str]] = field(default_factory=list)
    progress: int = 0

    async def nack(self, delay: float | None = None) -> None:
        self.nacked.append(delay)
        self.settled = True

    async def in_progress(self) -> None:
        self.progress += 1

    async def dead_letter(self, stage: str, reason: str) -> None:
        self.dead_lettered.append((stage, reason))
        self.settled = True


# ------------------------------------------------------------------------ directories


class FakeAgents:
    """The agents table as the gateway reads it."""

    def __init__(self, *agents: AgentInfo) -> None:
        self.agents = {a.agent_id: a for a in agents}

    async def get(self, agent_id: str) -> AgentInfo | None:
        return self.agents.get(agent_id)


class FakePolicies:
    """Per-agent policies as a worker's cache holds them; records every lookup."""

    def __init__(self, policies: dict[str, AgentPolicy] | None = None) -> None:
        self.policies = dict(policies or {})
        self.lookups: list[tuple[str, str]] = []

    def policy_for(self, agent_id: str, request_id: str = "") -> AgentPolicy:
        self.lookups.append((agent_id, request_id))
        return self.policies.get(agent_id, AgentPolicy())


class FakeLimits:
    """The per-agent limits' shared state (`services.gateway.ports.LimitStore`): answers
    each request asked about with the next scripted verdict (then admits), granting no
    allowance (so every request is asked about), and records one call per request."""

    def __init__(self, *verdicts: Admission) -> None:
        self.verdicts = list(verdicts)
        self.calls: list[dict[str, Any]] = []

    async def lease(self, agent_id: str, *, asks: Sequence[Ask], limits: Limits,
                    prices: Mapping[str, list[float]], now: float, **_: Any) -> Grant:
        admissions = []
        for ask in asks:
            self.calls.append({"agent_id": agent_id, "request_id": ask.request_id,
                               "accepted_at": ask.accepted_at, "deadline": ask.deadline,
                               "limits": limits, "prices": prices, "now": now})
            admissions.append(self.verdicts.pop(0) if self.verdicts else ADMITTED)
        return Grant(admissions=admissions)


class FakeFeedbackTable:
    """The feedback table as the gateway writes it: `known` (agent, request id) pairs are
    in the request log; `parts` says how many parts the known ones answered part by part
    had; `down` makes every call fail as an unreachable database. `rows` are keyed by
    (agent, stored id): a part's verdict by its part id (`<request_id>#<k>`)."""

    def __init__(self, *known: tuple[str, str], down: bool = False,
                 parts: Mapping[tuple[str, str], int] | None = None) -> None:
        self.known = set(known) | set(parts or {})
        self.parts = dict(parts or {})
        self.rows: dict[tuple[str, str], Feedback] = {}
        self.calls = 0
        self.down = down

    async def record_explicit(self, agent_id: str, feedback: Feedback) -> Recorded:
        self.calls += 1
        if self.down:
            raise StoreUnavailableError("connection refused")
        request = (agent_id, feedback.request_id)
        if request not in self.known:
            return Recorded(stored=False, previous="")
        key = request
        if feedback.part is not None:
            if not 0 <= feedback.part < self.parts.get(request, 0):
                return Recorded(stored=False, previous="", known=True)
            key = (agent_id, part_id(feedback.request_id, feedback.part))
        previous = "explicit" if key in self.rows else ""
        self.rows[key] = feedback
        return Recorded(stored=True, previous=previous, known=True)


def feedback_recorder(table: FakeFeedbackTable | None = None) -> FeedbackRecorder:
    """A FeedbackRecorder over a FakeFeedbackTable (no retries of unknown ids)."""
    return FeedbackRecorder(table or FakeFeedbackTable(), unknown_retries=())


class LocalDoor(Door):
    """The doors' Door without a bus: its verdicts go to `recorder` (the gateway's
    FeedbackRecorder, what the gateway's consumer would answer) in process, a store
    that cannot be reached answered as the gateway's last delivery answers it; the
    doors' routes are driven without NATS. `agents` checks the tokens."""

    def __init__(self, agents: TokenVerifier, recorder: FeedbackRecorder | None = None,
                 throttle: AuthThrottle | None = None, *, answer_timeout: float = 1.0
                 ) -> None:
        super().__init__(None, agents, throttle or AuthThrottle(""),  # type: ignore[arg-type]
                         answer_timeout=answer_timeout)
        self.recorder = recorder or feedback_recorder()

    async def feedback(self, agent_id: str, fb: Feedback) -> FeedbackAck:
        bad = check_feedback(fb)
        if bad is not None:
            return bad
        try:
            return await self.recorder.record(agent_id, fb)
        except StoreUnavailableError as exc:
            return refused(fb.request_id, ErrorCode.STORE_UNAVAILABLE, str(exc))


# ------------------------------------------------------------------------ adapters


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


# The keyword table of `KeywordLayer2`: a message holding the keyword is read as that
# type with that confidence (the first keyword found wins).
KEYWORDS: dict[str, tuple[QueryType, float]] = {
    "addvar": (QueryType.RETRIEVAL, 0.97),
    "write": (QueryType.CODE_GENERATION, 0.96),
    "endpoint": (QueryType.CODE_GENERATION, 0.95),
    "invoice": (QueryType.PLATFORM, 0.93),
    "summary": (QueryType.CONVERSATIONAL, 0.9),
    "maybe": (QueryType.RETRIEVAL, 0.7),
    "hmm": (QueryType.RETRIEVAL, 0.4),
}


class KeywordLayer2:
    """Layer 2 as a keyword table (`KEYWORDS` unless given): a message holding a keyword
    is read as its type with its confidence, the rest spread over the other types;
    anything else is `default`. Records each text it is asked about (`seen`)."""

    def __init__(self, table: Mapping[str, tuple[QueryType, float]] | None = None,
                 default: tuple[QueryType, float] = (QueryType.RETRIEVAL, 0.5)) -> None:
        self.table = dict(KEYWORDS if table is None else table)
        self.default = default
        self.seen: list[str] = []

    async def predict(self, text: str) -> Prediction:
        self.seen.append(text)
        for key, (qt, conf) in self.table.items():
            if key in text.lower():
                others = [(t.value, round((1 - conf) / 3, 3)) for t in QueryType if t != qt]
                return _Prediction(qt.value, conf, others)
        qt, conf = self.default
        return _Prediction(qt.value, conf,
                           [(t.value, (1 - conf) / 3) for t in QueryType if t != qt])


class HashedEncoder:
    """A sentence encoder as a bag of hashed words (`shared.encoders.embeddings.Encoder`):
    deterministic, instant, thread-safe, L2-normalised; `delay` seconds per call.
    Records the size of each batch (`batches`) and the threads that encoded (`threads`).
    A subclass changes what a text is by overriding `vector`."""

    DIM = 32
    model_name = "fake-bow"

    def __init__(self, *, delay: float = 0.0, dim: int = DIM) -> None:
        self.batches: list[int] = []
        self.threads: set[int] = set()
        self.delay = delay
        self._dim = dim
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self._dim

    def vector(self, text: str) -> Vectors:
        v = np.zeros(self._dim, np.float32)
        for w in text.lower().split():
            h = int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], "little")
            v[h % self._dim] += 1.0 if (h >> 8) % 2 else -1.0
        n = np.linalg.norm(v)
        return v / n if n else v

    def encode(self, texts: list[str], batch_size: int = 32) -> Vectors:
        with self._lock:
            self.batches.append(len(texts))
            self.threads.add(threading.get_ident())
        if self.delay:
            time.sleep(self.delay)
        if not texts:
            return np.zeros((0, self._dim), np.float32)
        return np.vstack([self.vector(t) for t in texts])


class HashedLabeler:
    """Layer 3 (`services.classifier.ports.LlmLabeler`) that answers for some messages
    and not for others, by their length."""

    async def label(self, query: str, history: list[HistoryEntry], editor_context: str
                    ) -> QueryType | None:
        options: list[QueryType | None] = [*QueryType, None]
        return options[len(query) % len(options)]


class ScriptedLabeler:
    """Layer 3 that answers `answer` (None: no label, as a model that fails) to every
    message; records each call's query and history (`calls`)."""

    def __init__(self, answer: QueryType | None) -> None:
        self.answer = answer
        self.calls: list[tuple[str, list[HistoryEntry]]] = []

    async def label(self, query: str, history: list[HistoryEntry], editor_context: str
                    ) -> QueryType | None:
        self.calls.append((query, history))
        return self.answer


class ScriptedRetrieval:
    """The search index: passages made from the query (hostile text travels on) and from
    `extra`, or exactly `passages` when given. The BM25 and dense peaks are a hash of the
    query, unless `bm25_top1` fixes the BM25 one. Records each query (`queries`) and
    reload check (`reloads`)."""

    def __init__(self, extra: list[Passage] | None = None, *,
                 passages: list[Passage] | None = None,
                 bm25_top1: float | None = None) -> None:
        self.extra = extra or []
        self.passages = passages
        self.bm25_top1 = bm25_top1
        self.queries: list[str] = []
        self.reloads = 0

    async def search(self, query: str, k: int) -> SearchResult:
        self.queries.append(query)
        d = _digest(query)
        found = (list(self.passages) if self.passages is not None else
                 [Passage(f"doc-{d[0]}", query[:80], f"About {query}.", 1.0, "kb"),
                  *self.extra])[: max(k, 0)]
        top1 = float(d[2]) if self.bm25_top1 is None else self.bm25_top1
        return SearchResult(passages=found, method="bm25", dense_top1=d[1] / 255,
                            bm25_top1=top1, bm25_scores=[top1] * len(found))

    async def maybe_reload(self) -> bool:
        self.reloads += 1
        return False

    async def close(self) -> None:
        pass


class PromptEchoBackend:
    """A chat backend that streams the prompt back in pieces (the prompt is rendered)."""

    name = "echo"

    async def stream(self, model: str, messages: list[ChatMessage], *,
                     prefill: str = "") -> AsyncIterator[str]:
        text = messages[-1].content + " | " + messages[0].content[:200]
        for start in range(0, len(text), 64):
            yield text[start:start + 64]


class InProcessParser:
    """The reference AVAP parser, called in process instead of over gRPC."""

    async def validate(self, code: str, *, strict: bool = False) -> ParseOutcome:
        result = validate(code, strict=strict)
        return ParseOutcome(valid=result.valid, trace=tuple(result.trace))


class ScriptedChecker:
    """The validator's checker (`services.validator.ports.CodeChecker`: the parser behind
    its guard) answering the scripted results in turn; records each program (`checked`)."""

    def __init__(self, *results: CheckResult, enabled: bool = True) -> None:
        self.results = list(results)
        self.enabled = enabled
        self.checked: list[str] = []

    async def check(self, code: str) -> CheckResult:
        self.checked.append(code)
        return self.results.pop(0)
