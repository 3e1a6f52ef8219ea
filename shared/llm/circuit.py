"""One circuit per backend, shared by every request and every replica.

A backend that fails again and again (faults.COUNTS_AGAINST_BACKEND, `threshold` in a
row) opens its circuit for everyone: requests go straight to their chain's next step
instead of each finding out again. After `cooldown` seconds one request, on one replica
(whichever claims the probe first), tries it: a success closes the circuit and traffic
returns to the backend; a failure opens it for another cooldown. A probe that never
reports (its replica died) is taken over after `probe_timeout`.

The state lives in a store all replicas share (`CircuitStore`: the JetStream key-value
bucket LLM_CIRCUITS in production, `MemoryCircuits` in tests), written with compare-and-
set so two replicas never both take the probe; each replica reads it at most every
`fresh` seconds (a read is a direct get, ~0.2 ms; a model call takes seconds). When the
store itself cannot be reached the circuit is taken as closed: a model server is never
refused for want of its circuit's state.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from shared.contracts import circuits

log = logging.getLogger("intentroute.llm")

BUCKET = circuits.BUCKET


class State(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    PROBING = "probing"


class Circuit(msgspec.Struct, frozen=True):
    state: State = State.CLOSED
    # Epoch seconds of the last change (opened at, probe started at).
    since: float = 0.0
    failures: int = 0
    error: str = ""
    prober: str = ""


class CircuitStore(Protocol):
    """The shared state: (circuit, revision) of a backend, and a compare-and-set write
    (False when someone wrote since `revision`; revision 0: none stored yet)."""

    async def read(self, backend: str) -> tuple[Circuit, int]: ...

    async def write(self, backend: str, circuit: Circuit, revision: int) -> bool: ...


class MemoryCircuits:
    """A store in one process (tests, and a single-process embedding)."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[Circuit, int]] = {}

    async def read(self, backend: str) -> tuple[Circuit, int]:
        return self._data.get(backend, (Circuit(), 0))

    async def write(self, backend: str, circuit: Circuit, revision: int) -> bool:
        if self._data.get(backend, (None, 0))[1] != revision:
            return False
        self._data[backend] = (circuit, revision + 1)
        return True


class KvCircuits:
    """The JetStream key-value bucket LLM_CIRCUITS (declared with the streams)."""

    _decoder = msgspec.json.Decoder(Circuit)

    def __init__(self, js: object) -> None:
        self._js = js
        self._kv: object | None = None

    async def _bucket(self) -> object:
        if self._kv is None:
            self._kv = await self._js.key_value(BUCKET)  # type: ignore[attr-defined]
        return self._kv

    async def read(self, backend: str) -> tuple[Circuit, int]:
        from nats.js.errors import KeyNotFoundError

        kv = await self._bucket()
        try:
            entry = await kv.get(backend)  # type: ignore[attr-defined]
        except KeyNotFoundError:
            return Circuit(), 0
        return self._decoder.decode(entry.value or b"{}"), int(entry.revision or 0)

    async def write(self, backend: str, circuit: Circuit, revision: int) -> bool:
        from nats.js.errors import KeyWrongLastSequenceError

        kv = await self._bucket()
        payload = msgspec.json.encode(circuit)
        try:
            if revision == 0:
                await kv.create(backend, payload)  # type: ignore[attr-defined]
            else:
                await kv.update(backend, payload, last=revision)  # type: ignore[attr-defined]
        except KeyWrongLastSequenceError:
            return False
        except Exception as exc:
            if "wrong last sequence" in str(exc).lower():
                return False
            raise
        return True


@dataclass(frozen=True)
class Ticket:
    """Leave to call a backend; `probe` when this call decides its circuit."""

    backend: str
    probe: bool = False


class CircuitBoard:
    def __init__(self, store: CircuitStore, *, threshold: int = 3, cooldown: float = 5.0,
                 probe_timeout: float = 30.0, fresh: float = 0.25,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self.threshold = threshold
        self.cooldown = cooldown
        self.probe_timeout = probe_timeout
        self._fresh = fresh
        self._clock = clock
        self._me = uuid.uuid4().hex[:12]
        self._seen: dict[str, tuple[float, Circuit, int]] = {}
        self._lock = asyncio.Lock()

    async def _read(self, backend: str, *, fresh: bool = False) -> tuple[Circuit, int]:
        now = time.monotonic()
        seen = self._seen.get(backend)
        if not fresh and seen is not None and now - seen[0] < self._fresh:
            return seen[1], seen[2]
        circuit, revision = await self._store.read(backend)
        self._seen[backend] = (now, circuit, revision)
        return circuit, revision

    async def _write(self, backend: str, circuit: Circuit, revision: int) -> bool:
        done = await self._store.write(backend, circuit, revision)
        self._seen.pop(backend, None)
        return done

    async def allow(self, backend: str) -> Ticket | None:
        """A ticket to call `backend`, or None while its circuit is open (or another
        call is probing it)."""
        try:
            circuit, revision = await self._read(backend)
            if circuit.state is State.CLOSED:
                return Ticket(backend)
            now = self._clock()
            waited = now - circuit.since
            if circuit.state is State.OPEN and waited < self.cooldown:
                return None
            if circuit.state is State.PROBING and waited < self.probe_timeout:
                return None
            # Cooled down (or its probe was lost): this call probes, if it claims it first.
            circuit, revision = await self._read(backend, fresh=True)
            if circuit.state is State.CLOSED:
                return Ticket(backend)
            probing = msgspec.structs.replace(circuit, state=State.PROBING, since=now,
                                              prober=self._me)
            if await self._write(backend, probing, revision):
                log.info("circuit of %s: probing", backend)
                return Ticket(backend, probe=True)
            return None
        except Exception as exc:
            log.warning("circuit of %s unreadable (%r): called as closed", backend, exc)
            return Ticket(backend)

    async def success(self, ticket: Ticket) -> None:
        await self._settle(ticket, failed=False, error="")

    async def failure(self, ticket: Ticket, error: str) -> None:
        await self._settle(ticket, failed=True, error=error)

    async def _settle(self, ticket: Ticket, *, failed: bool, error: str) -> None:
        backend = ticket.backend
        try:
            for _ in range(5):  # compare-and-set: read again when someone wrote first
                circuit, revision = await self._read(backend, fresh=failed or ticket.probe)
                if not failed:
                    if circuit.state is State.CLOSED and not circuit.failures:
                        return
                    if circuit.state is not State.CLOSED and not ticket.probe:
                        return  # a call let through before it opened: the probe decides
                    new = Circuit(State.CLOSED, self._clock())
                else:
                    failures = circuit.failures + 1
                    opens = ticket.probe or failures >= self.threshold
                    if circuit.state is State.OPEN and not ticket.probe:
                        return  # already open: nothing to add
                    new = Circuit(State.OPEN if opens else State.CLOSED,
                                  self._clock() if opens else circuit.since, failures,
                                  error[:300])
                if await self._write(backend, new, revision):
                    if new.state is not circuit.state:
                        log.warning("circuit of %s: %s%s", backend, new.state,
                                    f" after {new.failures} failures: {error[:200]}"
                                    if failed else "")
                    return
        except Exception as exc:
            log.warning("circuit of %s not updated (%r)", backend, exc)

    async def snapshot(self, backends: list[str]) -> dict[str, Circuit]:
        """Each backend's circuit as the store has it now (status, metrics)."""
        out = {}
        for backend in backends:
            try:
                out[backend] = (await self._read(backend, fresh=True))[0]
            except Exception:
                out[backend] = Circuit(error="circuit state unreadable")
        return out
