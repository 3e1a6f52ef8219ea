"""Accounting's pure parts: the anomaly rule, the cost report's arithmetic and naming,
the keyed hash of agent ids."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import pytest

from shared.accounting.costs import MIN_HISTORY_DAYS, anomalies, build_cost_report
from shared.accounting.hashing import HashKeyError, agent_hasher, load_key
from shared.policy.agent import Price

DAY = date(2026, 3, 31)


def history(costs: list[float], *, last: date = DAY) -> dict[date, float]:
    """Costs of consecutive days ending the day before `last`."""
    return {last - timedelta(days=len(costs) - i): c for i, c in enumerate(costs)}


def test_a_day_above_mean_plus_two_sd_of_its_trailing_days_is_an_anomaly() -> None:
    days = history([10.0, 12.0, 11.0, 9.0, 10.0, 11.0, 12.0, 10.0])
    days[DAY] = 30.0
    (found,) = anomalies({"a": days}, DAY, DAY)
    assert (found.agent_id, found.day, found.history_days) == ("a", DAY.isoformat(), 8)
    assert found.threshold == pytest.approx(found.mean + 2 * found.stdev)
    days[DAY] = found.threshold  # at the threshold: not above it
    assert anomalies({"a": days}, DAY, DAY) == []


def test_no_anomaly_without_enough_history_or_outside_the_trailing_window() -> None:
    short = history([1.0] * (MIN_HISTORY_DAYS - 1))
    short[DAY] = 100.0
    assert anomalies({"a": short}, DAY, DAY) == []
    # Days older than the 28-day trailing window do not count as history.
    old = history([1.0] * 10, last=DAY - timedelta(days=29))
    old[DAY] = 100.0
    assert anomalies({"a": old}, DAY, DAY) == []


def test_cost_report_prices_the_saving_at_the_main_models_price() -> None:
    rows = [
        {"agent_id": "a", "model": "big", "requests": 2, "errors": 0, "fallbacks": 0,
         "tokens_in": 1000, "tokens_out": 500, "compute_s": 0.0, "cost": 2.0},
        {"agent_id": "a", "model": "small", "requests": 3, "errors": 1, "fallbacks": 1,
         "tokens_in": 2000, "tokens_out": 1000, "compute_s": 10.0, "cost": 0.5},
        {"agent_id": "b", "model": "small", "requests": 1, "errors": 0, "fallbacks": 0,
         "tokens_in": 10, "tokens_out": 10, "compute_s": 1.0, "cost": 0.1},
    ]
    prices = {"a": {"big": Price(1.0, 2.0), "small": Price(0.1, 0.1, 0.01)},
              "b": {"small": Price(1.0, 1.0)}}
    report = build_cost_report(rows, {}, prices=prices, main_model="big", since=DAY,
                               until=DAY)
    a, b = report.agents
    # Main-slot price of all of a's tokens: 3000/1000 * 1.0 + 1500/1000 * 2.0.
    assert (a.requests, a.cost, a.main_slot_cost) == (5, 2.5, pytest.approx(6.0))
    assert a.saving == pytest.approx(3.5)
    assert (b.main_slot_cost, b.saving) == (None, None)
    assert report.totals.saving == pytest.approx(3.5)
    assert [m.model for m in a.models] == ["big", "small"]


def test_hashed_names_are_keyed_stable_and_hide_the_id() -> None:
    name = agent_hasher(b"0123456789abcdef")
    assert name("ide") == name("ide") != "ide"
    assert len(name("ide")) == 32
    assert name("ide") != agent_hasher(b"fedcba9876543210")("ide")
    report = build_cost_report(
        [{"agent_id": "ide", "model": "m", "requests": 1, "errors": 0, "fallbacks": 0,
          "tokens_in": 1, "tokens_out": 1, "compute_s": 0.0, "cost": 0.0}],
        {}, prices={}, main_model="m", since=DAY, until=DAY, name=name)
    assert [a.agent_id for a in report.agents] == [name("ide")]
    assert report.hashed_agents


def test_hash_keys_come_from_a_file_or_the_environment_and_must_be_long(tmp_path: Path
                                                                       ) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("s" * 20 + "\n")
    assert load_key(key_file=key_file) == b"s" * 20
    assert load_key(env_key="e" * 16) == b"e" * 16
    with pytest.raises(HashKeyError, match="no agent hash key"):
        load_key()
    with pytest.raises(HashKeyError, match="at least 16"):
        load_key(env_key="short")
    with pytest.raises(HashKeyError, match="cannot read"):
        load_key(key_file=tmp_path / "missing")


def test_cost_report_counts_refusals_by_code_and_totals_per_currency() -> None:
    rows = [
        {"agent_id": "a", "model": "big", "requests": 2, "errors": 0, "fallbacks": 0,
         "tokens_in": 1000, "tokens_out": 0, "compute_s": 0.0, "cost": 1.0},
        # refused requests: no model, no tokens, no cost
        {"agent_id": "a", "model": "", "requests": 7, "errors": 7, "fallbacks": 0,
         "tokens_in": 0, "tokens_out": 0, "compute_s": 0.0, "cost": 0.0},
        {"agent_id": "b", "model": "big", "requests": 1, "errors": 0, "fallbacks": 0,
         "tokens_in": 10, "tokens_out": 0, "compute_s": 0.0, "cost": 0.25},
    ]
    report = build_cost_report(
        rows, {}, prices={}, main_model="big", since=DAY, until=DAY,
        refused={"a": {"BUDGET_EXCEEDED": 2, "RATE_LIMITED": 5},
                 "c": {"QUOTA_EXCEEDED": 1}},  # c has only refusals
        currencies={"a": "EUR"})
    a, b, c = report.agents
    assert list(a.refused.items()) == [("RATE_LIMITED", 5), ("BUDGET_EXCEEDED", 2)]
    assert (a.currency, a.cost, a.requests) == ("EUR", 1.0, 9)
    assert (b.refused, b.currency) == ({}, "")
    assert (c.agent_id, c.refused, c.cost, c.models) == ("c", {"QUOTA_EXCEEDED": 1}, 0, [])
    assert report.totals.refused == {"RATE_LIMITED": 5, "QUOTA_EXCEEDED": 1,
                                     "BUDGET_EXCEEDED": 2}
    assert report.totals.cost_by_currency == {"": 0.25, "EUR": 1.0}
