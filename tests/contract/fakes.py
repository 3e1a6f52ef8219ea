"""Hand-written fakes of the stage ports (`shared.ports`): what a stage published, what
it wrote, and a delivery as its consumer would hand it over."""

from __future__ import annotations

from services.gateway.feedback import FeedbackRecorder
from shared.auth.admission import Admission
from shared.auth.ports import AgentInfo
from shared.common.settings import CommonSettings
from shared.contracts.codec import decode_chunk, encode
from shared.contracts.feedback import Feedback
from shared.contracts.pipeline import Admitted, Routed
from shared.contracts.request import AgentRequest
from shared.contracts.response import ResponseChunk
from shared.contracts.routing import (
    HISTORY_WINDOW,
    HistoryEntry,
    Layer,
    QueryType,
    RoutingDecision,
    slot_for,
)
from shared.policy.agent import AgentPolicy
from shared.store.feedback import Recorded
from shared.store.rows import Row
from shared.store.writer import StoreUnavailableError

COMMON = CommonSettings(nats_url="nats://unused:4222")
# The workers' shared key: envelopes a test hands to a stage carry the gateway's stamp.
ADMISSION = Admission(b"contract-tests")


def stamped(env: Admitted | Routed) -> bytes:
    """`env` on the wire as the previous stage hands it over: admitted, encoded."""
    ADMISSION.stamp(env)
    return encode(env)


class FakeStore:
    def __init__(self, *, history: list[HistoryEntry] | None = None,
                 previous: str | None = None, turns: list[tuple[str, str]] | None = None
                 ) -> None:
        self.rows: list[Row] = []
        self.history_reads = 0
        self._history = history or []
        self._previous = previous
        self._turns = turns or []

    async def last_history(self, agent_id: str, session_id: str, n: int = HISTORY_WINDOW
                           ) -> list[HistoryEntry]:
        self.history_reads += 1
        return self._history[-n:]

    async def previous_answer(self, agent_id: str, session_id: str) -> str | None:
        return self._previous

    async def last_turns(self, agent_id: str, session_id: str, n: int = 4
                         ) -> list[tuple[str, str]]:
        return self._turns[-n:]

    async def write(self, *rows: Row, deadline: float | None = None) -> None:
        self.rows.extend(rows)

    def kinds(self) -> list[str]:
        return [type(r).__name__ for r in self.rows]


class RecordingBus:
    """What a stage published: (subject, stream or "" for core, msg id, payload)."""

    def __init__(self, *, stored_seq: int = 0) -> None:
        self.sent: list[tuple[str, str, str, bytes]] = []
        self.claims: dict[str, bytes] = {}
        self._stored_seq = stored_seq

    async def publish(self, subject: str, payload: bytes) -> None:
        self.sent.append((subject, "", "", payload))

    async def publish_durable(self, subject: str, payload: bytes, *, stream: str,
                              msg_id: str) -> None:
        self.sent.append((subject, stream, msg_id, payload))

    async def publish_first(self, subject: str, payload: bytes, *, stream: str,
                            msg_id: str) -> bytes:
        """Claims are kept apart from `sent` (what callers see)."""
        return self.claims.setdefault(subject, payload)

    async def stored(self, subject: str, *, stream: str, msg_id: str) -> bytes | None:
        return next((p for s, st, m, p in self.sent if s == subject and m == msg_id), None)

    async def claimed(self, subject: str, *, stream: str) -> bytes | None:
        return self.claims.get(subject)

    def reconnects(self) -> int:
        return 0

    async def last_chunk(self, subject: str, stream: str) -> ResponseChunk | None:
        """What the response stream holds: a text chunk at `stored_seq - 1` if any, or
        the final chunk this bus published there."""
        finals = [c for c in (decode_chunk(p) for s, _, _, p in self.sent if s == subject)
                  if c.is_final]
        if finals:
            return finals[-1]
        if self._stored_seq:
            return ResponseChunk(request_id="", seq=self._stored_seq - 1, text="...")
        return None

    def on(self, subject: str) -> list[bytes]:
        return [payload for subj, _, _, payload in self.sent if subj == subject]

    def chunks(self, request_id: str, agent_id: str = "a") -> list[ResponseChunk]:
        return [decode_chunk(p) for p in self.on(f"agent.response.{agent_id}.{request_id}")]

    def subjects(self) -> list[tuple[str, str]]:
        return [(subj, stream) for subj, stream, _, _ in self.sent]


class FakeDelivery:
    def __init__(self, data: bytes, deliveries: int = 1, subject: str = "",
                 stream_seq: int = 1) -> None:
        self.data = data
        self.subject = subject
        self.deliveries = deliveries
        self.stream_seq = stream_seq
        self.settled = False
        self.nacked: list[float | None] = []
        self.dead_lettered: list[tuple[str, str]] = []
        self.progress = 0

    async def nack(self, delay: float | None = None) -> None:
        self.nacked.append(delay)
        self.settled = True

    async def in_progress(self) -> None:
        self.progress += 1

    async def dead_letter(self, stage: str, reason: str) -> None:
        self.dead_lettered.append((stage, reason))
        self.settled = True


def request(rid: str, query: str, **fields: str) -> AgentRequest:
    return AgentRequest(request_id=rid, session_id=fields.pop("session_id", "s"),
                        agent_id=fields.pop("agent_id", "a"), query=query, **fields)


def routed_decision(qt: QueryType, layer: Layer = Layer.RULES) -> RoutingDecision:
    return RoutingDecision(type=qt, layer=layer, confidence=1.0, model_slot=slot_for(qt))


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

class FakeFeedbackTable:
    """The feedback table as the gateway writes it: `known` (agent, request id) pairs are
    in the request log; `down` makes every call fail as an unreachable database."""

    def __init__(self, *known: tuple[str, str], down: bool = False) -> None:
        self.known = set(known)
        self.rows: dict[tuple[str, str], Feedback] = {}
        self.calls = 0
        self.down = down

    async def record_explicit(self, agent_id: str, feedback: Feedback) -> Recorded:
        self.calls += 1
        if self.down:
            raise StoreUnavailableError("connection refused")
        key = (agent_id, feedback.request_id)
        if key not in self.known:
            return Recorded(stored=False, previous="")
        previous = "explicit" if key in self.rows else ""
        self.rows[key] = feedback
        return Recorded(stored=True, previous=previous)


def feedback_recorder(table: FakeFeedbackTable | None = None) -> FeedbackRecorder:
    """A FeedbackRecorder over a FakeFeedbackTable (no retries of unknown ids)."""
    return FeedbackRecorder(table or FakeFeedbackTable(), unknown_retries=())
