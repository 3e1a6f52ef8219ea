"""Waiting messages taken one agent at a time (shared.runtime.turns)."""

from __future__ import annotations

import pytest

from shared.runtime.turns import AgentTurns


def test_agents_take_turns_and_each_agent_keeps_its_order() -> None:
    turns: AgentTurns[str] = AgentTurns()
    for i in range(5):
        turns.push("flood", f"f{i}")
    turns.push("victim", "v0")
    turns.push("victim", "v1")
    assert len(turns) == 7
    taken = [turns.pop() for _ in range(7)]
    # The victim's first waits behind one of the flood's, not all five.
    assert taken == ["f0", "v0", "f1", "v1", "f2", "f3", "f4"]
    assert not turns
    with pytest.raises(IndexError):
        turns.pop()


def test_an_agent_arriving_later_waits_behind_one_message_of_each_other_agent() -> None:
    turns: AgentTurns[str] = AgentTurns()
    for agent in "abcde":  # five flooders, 20 waiting each
        for i in range(20):
            turns.push(agent, f"{agent}{i}")
    turns.pop()  # a slot freed: a0
    turns.push("victim", "v")
    taken = [turns.pop() for _ in range(len(turns))]
    assert taken.index("v") == 5  # b0 c0 d0 e0 a1: one of each, then the victim


def test_stopping_gives_every_waiting_message_back() -> None:
    turns: AgentTurns[int] = AgentTurns()
    for i in range(4):
        turns.push("ab"[i % 2], i)
    assert sorted(turns.take_all()) == [0, 1, 2, 3]
    assert len(turns) == 0
    assert list(turns) == []
    turns.push("a", 9)  # usable again
    assert turns.pop() == 9


def test_the_first_agent_that_may_go_is_taken_and_the_others_keep_their_turns() -> None:
    turns: AgentTurns[str] = AgentTurns()
    for item in ("a0", "a1", "b0", "c0", "c1"):
        turns.push(item[0], item)
    # Only agents with nothing in hand may take a spare slot: "a" has one in hand.
    assert turns.pop_first(lambda agent: agent != "a") == "b0"
    assert turns.pop_first(lambda agent: agent == "x") is None
    assert len(turns) == 4
    # "c" went ahead of its turn once and goes to the back; "a" keeps its turn.
    assert turns.pop_first(lambda agent: agent == "c") == "c0"
    assert [turns.pop() for _ in range(3)] == ["a0", "c1", "a1"]
