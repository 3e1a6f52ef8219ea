"""`up`'s stop order (intentroute.drain) on recorded processes: the gateways first, the
pipeline's wait next, then the workers, then the parser; a second signal kills at once."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence

from intentroute.drain import StopSignals, drain
from intentroute.supervisor import Supervisor
from testkit.procs import FakeProc


def _stack(events: list[str], stubborn: Sequence[str] = ()) -> Supervisor:
    def spawn(argv: Sequence[str], env: Mapping[str, str]) -> FakeProc:
        return FakeProc(argv[0], events, stubborn=argv[0] in stubborn)

    sup = Supervisor(spawn=spawn)  # type: ignore[arg-type]
    for name in ("parser", "gateway", "classifier", "generator-main", "gateway"):
        sup.add(name, [name], {})
    return sup


def _idle(events: list[str], left: int = 0,
          during: Callable[[], None] | None = None) -> Callable[[float, Callable[[], bool]], int]:
    def wait_idle(deadline: float, stop_now: Callable[[], bool]) -> int:
        if during is not None:
            during()
        events.append(f"pipeline idle? stop_now={stop_now()}")
        return left
    return wait_idle


def test_gateways_stop_first_then_the_pipeline_drains_then_workers_then_helpers() -> None:
    events: list[str] = []
    sup = _stack(events)
    signals = StopSignals()
    signals.count = 1
    said: list[str] = []
    report = drain(sup, signals, _idle(events), timeout=5, grace=1, say=said.append)
    assert events == [
        "SIGTERM gateway", "SIGTERM gateway", "pipeline idle? stop_now=False",
        "SIGTERM classifier", "SIGTERM generator-main", "SIGTERM parser"]
    assert report.left == 0
    assert report.killed == 0
    assert not report.forced
    assert sup.stopping  # nothing is restarted during a drain
    assert len(said) == 1
    assert "drained" in said[0]


def test_what_does_not_stop_in_the_grace_is_killed() -> None:
    events: list[str] = []
    sup = _stack(events, stubborn=("classifier",))
    signals = StopSignals()
    signals.count = 1
    report = drain(sup, signals, _idle(events, left=3), timeout=0.2, grace=0.2,
                   say=lambda _: None)
    assert events.index("SIGTERM classifier") < events.index("SIGKILL classifier")
    assert report.killed == 1
    assert report.left == 3


def test_a_second_signal_during_the_drain_kills_everything_at_once() -> None:
    events: list[str] = []
    sup = _stack(events)
    signals = StopSignals()
    signals.count = 1

    def second_ctrl_c() -> None:
        signals.count += 1

    report = drain(sup, signals, _idle(events, during=second_ctrl_c), timeout=30, grace=30,
                   say=lambda _: None)
    assert report.forced
    # The gateways had their SIGTERM; nobody else gets one: SIGKILL straight away.
    assert [e for e in events if e.startswith("SIGTERM")] == ["SIGTERM gateway"] * 2
    assert sorted(e for e in events if e.startswith("SIGKILL")) == [
        "SIGKILL classifier", "SIGKILL generator-main", "SIGKILL parser"]


def test_stop_signals_count_sigint_sigterm_and_sighup() -> None:
    signals = StopSignals()
    previous = {sig: signal.getsignal(sig) for sig in StopSignals.SIGNALS}
    try:
        signals.install()
        assert not signals.requested
        signal.raise_signal(signal.SIGHUP)
        assert signals.requested
        assert not signals.forced
        signal.raise_signal(signal.SIGINT)
        assert signals.forced
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
