"""Hand-written fakes of the stage ports (`shared.ports`): what a stage published, what
it wrote, and a delivery as its consumer would hand it over."""

from __future__ import annotations

from shared.admission import Admission
from shared.codec import decode_chunk, encode
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
from shared.ports import AgentInfo
from shared.settings import CommonSettings
from shared.store.rows import Row

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
        self._stored_seq = stored_seq

    async def publish(self, subject: str, payload: bytes) -> None:
        self.sent.append((subject, "", "", payload))

    async def publish_durable(self, subject: str, payload: bytes, *, stream: str,
                              msg_id: str) -> None:
        self.sent.append((subject, stream, msg_id, payload))

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
    def __init__(self, data: bytes, deliveries: int = 1, subject: str = "") -> None:
        self.data = data
        self.subject = subject
        self.deliveries = deliveries
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
