"""Failed credential checks per address: past the limit an address's tokens are refused
without being checked (no bcrypt spent); valid ones never count; other addresses and
"off" are unaffected."""

from __future__ import annotations

import pytest

from services.gateway.settings import GatewaySettings
from services.gateway.throttle import AuthThrottle, ThrottledError, grpc_peer_address
from shared.auth.ports import AgentInfo


class CountingAgents:
    """The token `good` belongs to agent-a; counts how many tokens were checked."""

    def __init__(self) -> None:
        self.checked = 0

    async def verify_token(self, token: str) -> AgentInfo | None:
        self.checked += 1
        return AgentInfo(agent_id="agent-a") if token == "good" else None


async def test_an_address_past_its_failures_is_refused_unchecked() -> None:
    agents, throttle = CountingAgents(), AuthThrottle("3/minute")
    for _ in range(3):
        assert await throttle.verify(agents, "wrong", "10.0.0.1") is None
    with pytest.raises(ThrottledError) as refused:
        await throttle.verify(agents, "wrong", "10.0.0.1")
    assert agents.checked == 3
    assert 1 <= refused.value.retry_after <= 60
    # Even the right token waits: the address is not checked at all for now.
    with pytest.raises(ThrottledError):
        await throttle.verify(agents, "good", "10.0.0.1")
    assert agents.checked == 3
    # Another address is unaffected.
    assert await throttle.verify(agents, "good", "10.0.0.2") == AgentInfo(agent_id="agent-a")


async def test_valid_tokens_and_missing_ones_never_count() -> None:
    agents, throttle = CountingAgents(), AuthThrottle("2/minute")
    for _ in range(10):
        assert await throttle.verify(agents, "good", "10.0.0.1") is not None
        assert await throttle.verify(agents, "", "10.0.0.1") is None
    assert agents.checked == 10
    assert await throttle.verify(agents, "wrong", "10.0.0.1") is None  # first failure


async def test_off_never_throttles() -> None:
    agents, throttle = CountingAgents(), AuthThrottle("")
    for _ in range(50):
        assert await throttle.verify(agents, "wrong", "10.0.0.1") is None
    assert agents.checked == 50


def test_the_limit_is_a_setting_and_a_bad_one_is_a_clear_error() -> None:
    assert GatewaySettings.from_env({}).auth_failures == "20/minute"
    assert GatewaySettings.from_env({"GATEWAY_AUTH_FAILURES": "off"}).auth_failures == ""
    assert GatewaySettings.from_env(
        {"GATEWAY_AUTH_FAILURES": "5 per 10 seconds"}).auth_failures == "5 per 10 seconds"
    with pytest.raises(ValueError, match="GATEWAY_AUTH_FAILURES"):
        AuthThrottle("often")


@pytest.mark.parametrize(("peer", "address"), [
    ("ipv4:127.0.0.1:50123", "127.0.0.1"),
    ("ipv6:[::1]:50123", "::1"),
    ("unix:/tmp/grpc.sock", "unix:/tmp/grpc.sock"),
])
def test_grpc_peers_are_counted_by_address_not_port(peer: str, address: str) -> None:
    assert grpc_peer_address(peer) == address
