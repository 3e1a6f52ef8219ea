"""The chain walker (shared.llm.walk) on scripted model servers: every fault has its one
outcome, a cut answer is continued (prefill) or cleanly restarted (a reset before the
replacement's first token, never the abandoned part run into a second answer), the
conditions of a chain's steps, and the circuit every replica shares."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from shared.llm.circuit import CircuitBoard, MemoryCircuits, State
from shared.llm.faults import Fault, ModelError
from shared.llm.fleet import BackendKind, BackendSpec, Fleet, ModelSpec
from shared.llm.ports import ChatMessage, Ended, Started, StreamEvent, TokenCounts
from shared.llm.walk import Timing, Walked, Walker
from shared.policy.chain import Condition, Step, build_chain, parse_step

MESSAGES = [ChatMessage("user", "how do I loop?")]
WORDS = [f"w{i} " for i in range(6)]
FAST = Timing(first_byte=0.5, ttft=0.5, stall=0.3)


@dataclass
class Script:
    """What a model does: `fail` a fault raised before any token (`times` times, then it
    answers), `cut_after` tokens then CUT, `stall_after` tokens then silence, `slow` a
    first token that takes that long, `no_end` no end marker, `refuse_prefill`."""

    fail: Fault | None = None
    times: int = 1_000_000
    retry_after: float | None = None
    cut_after: int | None = None
    stall_after: int | None = None
    slow: float = 0.0
    no_end: bool = False
    refuse_prefill: bool = False


@dataclass
class Server:
    name: str
    scripts: dict[str, Script] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)  # (model, prefill)

    async def stream(self, model: str, messages: list[ChatMessage], *,
                     prefill: str = "") -> AsyncIterator[StreamEvent]:
        self.calls.append((model, prefill))
        script = self.scripts.get(model, Script())
        if prefill and script.refuse_prefill:
            raise ModelError(Fault.PREFILL_REFUSED, "no prefill here", status=400)
        if script.fail is not None and script.times > 0:
            script.times -= 1
            raise ModelError(script.fail, f"scripted {script.fail}",
                             retry_after=script.retry_after)
        yield Started()
        if script.slow:
            await asyncio.sleep(script.slow)
        done = len(prefill.split())
        for n, word in enumerate(WORDS[done:]):
            if script.cut_after is not None and n == script.cut_after:
                raise ModelError(Fault.CUT, "connection dropped")
            if script.stall_after is not None and n == script.stall_after:
                await asyncio.sleep(60)
            yield f"{self.name}:{word}"
        yield TokenCounts(10, len(WORDS) - done)
        if not script.no_end:
            yield Ended(marked=True, finish_reason="stop")


def fleet(*servers: Server, prefill: dict[str, bool] | None = None,
          context: dict[str, int] | None = None) -> Fleet:
    prefill, context = prefill or {}, context or {}
    backends = {}
    for server in servers:
        models = {m: ModelSpec(prefill=prefill.get(f"{server.name}/{m}", False),
                               context=context.get(f"{server.name}/{m}", 0))
                  for m in ("m", "n")}
        backends[server.name] = BackendSpec(kind=BackendKind.OPENAI,
                                            url=f"http://{server.name}/v1", models=models)
    return Fleet(backends=backends)


class Caller:
    """What a caller receives: text pieces and resets, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def sink(self, text: str) -> None:
        self.events.append(text)

    async def restart(self) -> None:
        self.events.append("<reset>")

    def text(self) -> str:
        after = self.events[len(self.events) - self.events[::-1].index("<reset>"):] \
            if "<reset>" in self.events else self.events
        return "".join(after)


async def walk(walker: Walker, chain: str, *, timing: Timing = FAST,
               caller: Caller | None = None, accepted_at: float | None = None) -> Walked:
    caller = caller if caller is not None else Caller()
    steps = [parse_step(s) for s in chain.split(",")]
    return await walker.stream_answer(
        steps, MESSAGES, sink=caller.sink, on_restart=caller.restart,
        extractive=lambda why: "extractive answer", timing=timing,
        accepted_at=time.time() if accepted_at is None else accepted_at)


async def no_sleep(_: float) -> None:
    return None


async def test_a_cut_answer_is_continued_by_a_model_that_takes_a_prefill() -> None:
    bad, good = Server("bad", {"m": Script(cut_after=3)}), Server("good")
    walker = Walker(fleet(bad, good, prefill={"good/m": True}), {"bad": bad, "good": good})
    caller = Caller()
    walked = await walk(walker, "bad/m,good/m,extractive", caller=caller)
    assert walked.answered_by == "good/m"
    assert "<reset>" not in caller.events  # nothing taken back
    assert caller.text() == "bad:w0 bad:w1 bad:w2 good:w3 good:w4 good:w5 "
    assert good.calls == [("m", "bad:w0 bad:w1 bad:w2 ")]  # asked to continue it
    assert [(p.ref, p.tokens_out) for p in walked.parts] == [("bad/m", 3), ("good/m", 3)]
    assert [a.fault for a in walked.attempts] == [Fault.CUT, None]


async def test_a_cut_answer_is_restarted_cleanly_when_the_next_model_takes_no_prefill(
) -> None:
    bad, good = Server("bad", {"m": Script(cut_after=2)}), Server("good")
    walker = Walker(fleet(bad, good), {"bad": bad, "good": good})
    caller = Caller()
    walked = await walk(walker, "bad/m,good/m,extractive", caller=caller)
    # The reset comes right before the replacement's first piece, never after it.
    assert caller.events[:3] == ["bad:w0 ", "bad:w1 ", "<reset>"]
    assert caller.text() == "".join(f"good:{w}" for w in WORDS)
    assert [p.ref for p in walked.parts] == ["good/m"]  # the abandoned part is not billed
    assert good.calls == [("m", "")]


async def test_a_refused_prefill_restarts_on_the_same_model() -> None:
    bad, good = Server("bad", {"m": Script(cut_after=2)}), Server(
        "good", {"m": Script(refuse_prefill=True)})
    walker = Walker(fleet(bad, good, prefill={"good/m": True}), {"bad": bad, "good": good})
    caller = Caller()
    walked = await walk(walker, "bad/m,good/m,error", caller=caller)
    assert walked.answered_by == "good/m"
    assert good.calls == [("m", "bad:w0 bad:w1 "), ("m", "")]
    assert "<reset>" in caller.events
    assert caller.text() == "".join(f"good:{w}" for w in WORDS)


async def test_a_stalled_stream_is_handed_over_within_its_stall_time() -> None:
    bad, good = Server("bad", {"m": Script(stall_after=2)}), Server("good")
    walker = Walker(fleet(bad, good, prefill={"good/m": True}), {"bad": bad, "good": good})
    started = time.monotonic()
    walked = await walk(walker, "bad/m,good/m,extractive")
    assert time.monotonic() - started < FAST.stall + 1.0
    assert walked.answered_by == "good/m"
    assert walked.attempts[0].fault is Fault.STALLED


async def test_a_slow_first_token_hands_over_and_if_unavailable_is_not_for_slowness() -> None:
    slow = Server("slow", {"m": Script(slow=5.0)})
    spare, good = Server("spare"), Server("good")
    walker = Walker(fleet(slow, spare, good), {"slow": slow, "spare": spare, "good": good})
    walked = await walk(walker, "slow/m,spare/m@if_unavailable,good/m,extractive")
    assert walked.attempts[0].fault is Fault.SLOW
    assert spare.calls == []  # the first step was slow, not down
    assert walked.answered_by == "good/m"


async def test_if_unavailable_is_used_when_the_earlier_steps_are_down() -> None:
    down, spare = Server("down", {"m": Script(fail=Fault.UNREACHABLE)}), Server("spare")
    walker = Walker(fleet(down, spare), {"down": down, "spare": spare})
    walked = await walk(walker, "down/m,spare/m@if_unavailable,extractive")
    assert walked.answered_by == "spare/m"
    assert down.calls == [("m", "")]  # unreachable: not asked again by the request


async def test_within_is_skipped_past_its_latency_and_bounds_the_first_token() -> None:
    down, late, good = (Server("down", {"m": Script(fail=Fault.REFUSED)}),
                        Server("late", {"m": Script(slow=2.0)}), Server("good"))
    walker = Walker(fleet(down, late, good), {"down": down, "late": late, "good": good})
    # Accepted 1 s ago: a step within 0.5 s is skipped; one within 1.3 s gets 0.3 s.
    walked = await walk(walker, "down/m,good/n@within=500ms,late/m@within=1300ms,"
                        "extractive", accepted_at=time.time() - 1.0)
    assert good.calls == []
    assert walked.attempts[-1].fault is Fault.SLOW
    assert walked.answered_by == "extractive"


async def test_a_500_is_retried_once_and_a_reset_before_any_byte_once() -> None:
    for fault in (Fault.SERVER_ERROR, Fault.RESET):
        flaky = Server("flaky", {"m": Script(fail=fault, times=1)})
        walker = Walker(fleet(flaky), {"flaky": flaky})
        walked = await walk(walker, "flaky/m,error")
        assert walked.answered_by == "flaky/m"
        assert len(flaky.calls) == 2
    broken = Server("broken", {"m": Script(fail=Fault.SERVER_ERROR)})
    walked = await walk(Walker(fleet(broken), {"broken": broken}), "broken/m,extractive")
    assert len(broken.calls) == 2  # once, and once more: then the next step
    assert walked.answered_by == "extractive"


async def test_429_waits_for_retry_after_when_it_fits_and_backs_off_without_it() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    limited = Server("limited", {"m": Script(fail=Fault.RATE_LIMITED, times=1,
                                             retry_after=2.0)})
    walker = Walker(fleet(limited), {"limited": limited}, sleep=sleep)
    assert (await walk(walker, "limited/m,error")).answered_by == "limited/m"
    assert waits == [2.0]
    waits.clear()
    busy, good = Server("busy", {"m": Script(fail=Fault.OVERLOADED)}), Server("good")
    walker = Walker(fleet(busy, good), {"busy": busy, "good": good}, sleep=sleep)
    assert (await walk(walker, "busy/m,good/m,error")).answered_by == "good/m"
    assert len(busy.calls) == 3  # bounded attempts
    assert len(waits) == 2
    # Never more than a few attempts a second, backing off: jittered in [b, 2b), b
    # doubling from 0.3 s.
    assert 0.3 <= waits[0] < 0.6
    assert 0.6 <= waits[1] < 1.2


async def test_a_retry_after_past_the_deadline_moves_on_at_once() -> None:
    limited, good = (Server("limited", {"m": Script(fail=Fault.RATE_LIMITED,
                                                    retry_after=30.0)}), Server("good"))
    walker = Walker(fleet(limited, good), {"limited": limited, "good": good}, sleep=no_sleep)
    walked = await walk(walker, "limited/m,good/m,error")
    assert walked.answered_by == "good/m"
    assert len(limited.calls) == 1


async def test_a_context_length_refusal_goes_to_a_larger_context_only() -> None:
    small, same, big = (Server("small", {"m": Script(fail=Fault.CONTEXT_LENGTH)}),
                        Server("same"), Server("big"))
    walker = Walker(fleet(small, same, big, context={"small/m": 4096, "same/m": 4096,
                                                     "big/m": 32768}),
                    {"small": small, "same": same, "big": big})
    walked = await walk(walker, "small/m,same/m,big/m,error")
    assert len(small.calls) == 1  # not retried
    assert same.calls == []  # no larger context
    assert walked.answered_by == "big/m"


async def test_a_content_filter_ends_the_chain_with_its_typed_error() -> None:
    filtered, good = Server("filtered", {"m": Script(fail=Fault.CONTENT_FILTER)}), Server("good")
    walker = Walker(fleet(filtered, good), {"filtered": filtered, "good": good})
    walked = await walk(walker, "filtered/m,good/m,extractive")
    assert walked.error_code == "CONTENT_FILTERED"
    assert "filtered/m" in walked.error
    assert good.calls == []
    assert len(filtered.calls) == 1


async def test_a_stream_without_its_end_marker_is_finalised_with_what_came() -> None:
    open_ended = Server("open", {"m": Script(no_end=True)})
    caller = Caller()
    walked = await walk(Walker(fleet(open_ended), {"open": open_ended}), "open/m,error",
                        caller=caller)
    assert walked.answered_by == "open/m"
    assert walked.unmarked
    assert len(caller.events) == len(WORDS)


async def test_a_failing_backend_opens_its_circuit_for_every_replica_and_is_probed_back(
) -> None:
    store = MemoryCircuits()
    now = [1000.0]
    down, good = Server("down", {"m": Script(fail=Fault.UNREACHABLE)}), Server("good")
    shared = fleet(down, good)

    def replica() -> Walker:
        board = CircuitBoard(store, threshold=3, cooldown=5.0, fresh=0.0,
                             clock=lambda: now[0])
        return Walker(shared, {"down": down, "good": good}, board)

    one, two = replica(), replica()
    for _ in range(3):
        assert (await walk(one, "down/m,good/m,error")).answered_by == "good/m"
    assert len(down.calls) == 3
    assert (await store.read("down"))[0].state is State.OPEN
    # The other replica goes straight to the next step: the backend is not called.
    walked = await walk(two, "down/m,good/m,error")
    assert walked.attempts[0].fault is Fault.CIRCUIT_OPEN
    assert len(down.calls) == 3
    # After the cooldown one call probes it; the backend is back: the circuit closes.
    now[0] += 6.0
    down.scripts["m"] = Script()
    walked = await walk(two, "down/m,good/m,error")
    assert walked.answered_by == "down/m"
    assert (await store.read("down"))[0].state is State.CLOSED
    assert (await walk(one, "down/m,good/m,error")).answered_by == "down/m"


async def test_only_one_replica_probes_an_open_circuit() -> None:
    store = MemoryCircuits()
    now = [0.0]
    boards = [CircuitBoard(store, threshold=1, cooldown=1.0, fresh=0.0, clock=lambda: now[0])
              for _ in range(3)]
    ticket = await boards[0].allow("x")
    assert ticket is not None
    await boards[0].failure(ticket, "refused")
    assert await boards[1].allow("x") is None
    now[0] = 2.0
    tickets = [await board.allow("x") for board in boards]
    assert [t is not None and t.probe for t in tickets].count(True) == 1
    assert tickets.count(None) == 2


def test_a_chain_parses_its_conditions_and_starts_with_the_slot_model() -> None:
    steps = build_chain("ollama/small", ["ollama/small", "cloud/big@if_unavailable",
                                         "cloud/fast@within=2s", "m2", "error"])
    assert [s.ref for s in steps] == ["ollama/small", "cloud/big", "cloud/fast",
                                      "ollama/m2", "error"]
    assert steps[1].condition is Condition.IF_UNAVAILABLE
    assert (steps[2].condition, steps[2].within_s) == (Condition.WITHIN, 2.0)
    assert build_chain("", ["cloud/big", "error"]) == [Step("extractive")]
    assert parse_step("x/y@within=250ms").within_s == 0.25
    for bad in ("x/y@sometimes", "x/y@within=0s", "/y", "x/"):
        with pytest.raises(ValueError, match=r"\S"):
            parse_step(bad)
