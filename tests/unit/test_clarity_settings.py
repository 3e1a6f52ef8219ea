"""The classifier's global clarity policy from the environment; per-agent policies
live in the policy table, not in the environment."""

from __future__ import annotations

import pytest

from services.classifier.settings import ClassifierSettings
from shared.policy.agent import ClarityPolicy


def test_the_global_clarity_policy_defaults_to_proceed_and_reads_ask() -> None:
    assert ClassifierSettings.from_env({}).clarity_policy is ClarityPolicy.PROCEED
    assert ClassifierSettings.from_env({"CLARITY_POLICY": "ask"}).clarity_policy is (
        ClarityPolicy.ASK)


def test_an_unknown_clarity_policy_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^CLARITY_POLICY: expected .+, got 'maybe'$"):
        ClassifierSettings.from_env({"CLARITY_POLICY": "maybe"})


def test_the_removed_per_agent_variable_says_what_replaced_it() -> None:
    with pytest.raises(ValueError, match="intentroute agent set NAME clarity_policy=ask"):
        ClassifierSettings.from_env({"CLARITY_POLICY_BY_AGENT": "widget:ask"})
