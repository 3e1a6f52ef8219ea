"""`bench pipeline --fleet N`'s configuration: the fleet file it writes is one the
workers load (checked), both slots on the first backend's no-fault model, and the
chain its agents' policies set walks the first backend, then the second, then the
extractive answerer."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.pipeline_fleet import chain_assignments, fleet_toml
from shared.llm.fleet import load_fleet
from shared.policy.agent import AgentPolicy, apply_assignment
from shared.policy.chain import build_chain

URLS = ["http://127.0.0.1:4001/v1", "http://127.0.0.1:4002/v1"]


@pytest.mark.parametrize(("backends", "walked"), [
    (1, ["first/ok", "extractive"]),
    (2, ["first/ok", "second/ok", "extractive"]),
])
def test_the_fleet_loads_and_each_slot_walks_the_backends_in_order(
    tmp_path: Path, backends: int, walked: list[str]
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(fleet_toml(URLS[:backends]), encoding="utf-8")
    fleet = load_fleet(path)
    assert list(fleet.backends) == ["first", "second"][:backends]
    assert [b.url for b in fleet.backends.values()] == URLS[:backends]
    policy = AgentPolicy()
    for assignment in chain_assignments(backends):
        policy = apply_assignment(policy, assignment)
    for slot in ("main", "conversational"):
        slot_model = fleet.slot_model(slot)
        assert slot_model == "first/ok"
        steps = build_chain(slot_model, policy.fallback.get(slot))
        assert [s.ref for s in steps] == walked
        assert all(fleet.has(s.ref) for s in steps if not s.is_end)


@pytest.mark.parametrize("backends", [0, 3])
def test_only_one_or_two_backends_are_declared(backends: int) -> None:
    with pytest.raises(ValueError, match=f"declares backends, not {backends}"):
        chain_assignments(backends)
    with pytest.raises(ValueError, match=f"backends, not {backends}"):
        fleet_toml(["http://127.0.0.1:4001/v1"] * backends)
