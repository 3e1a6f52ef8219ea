"""Credential checks at the gateway's doors: a right token is checked against its fast
digest and let in from any address, however many wrong ones came from there; wrong ones
are counted per address and answered ThrottledError past the limit; bcrypt (agents
without a digest yet) is never spent for a throttled address and is bounded over all
addresses together; the log lines a flood causes are bounded."""

from __future__ import annotations

import logging
from typing import Any

import bcrypt
import pytest

from services.doors.log_budget import LogBudget
from services.doors.settings import DoorsSettings
from services.doors.throttle import AuthThrottle, ThrottledError, grpc_peer_address
from shared.auth.identity import (
    AgentSecret,
    CachedAgents,
    agent_token,
    hash_secret,
    token_digest,
)
from shared.auth.ports import AgentInfo

SECRET = "s" * 43  # as long as token_urlsafe(32)'s
# Hashed once for the module: bcrypt is the slow part these tests count.
SECRET_HASH = hash_secret(SECRET)
GOOD = agent_token("agent-a", SECRET)
WRONG = agent_token("agent-a", "w" * 43)


@pytest.fixture
def bcrypt_checks(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every bcrypt check made, counted (the secrets checked)."""
    checked: list[bytes] = []
    real = bcrypt.checkpw

    def counting(secret: bytes, hashed: bytes) -> bool:
        checked.append(secret)
        return real(secret, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    return checked


class Table:
    """The agents table: agent-a, with or without its digest; records saved digests."""

    def __init__(self, *, digest: bool, revoked: bool = False) -> None:
        self.row = AgentSecret(AgentInfo("agent-a", revoked=revoked), SECRET_HASH,
                               token_digest(SECRET, SECRET_HASH) if digest else "")
        self.saved: list[tuple[str, str, str]] = []

    async def fetch(self, agent_id: str) -> AgentSecret | None:
        return self.row if agent_id == "agent-a" else None

    async def save(self, agent_id: str, secret_hash: str, digest: str) -> None:
        self.saved.append((agent_id, secret_hash, digest))
        self.row = AgentSecret(self.row.info, secret_hash, digest)


def agents_over(table: Table) -> CachedAgents:
    return CachedAgents(table.fetch, save_digest=table.save, ttl=0.0)


async def test_a_right_token_is_let_in_from_a_throttled_address(
        bcrypt_checks: list[bytes]) -> None:
    agents, throttle = agents_over(Table(digest=True)), AuthThrottle("3/minute")
    for _ in range(3):
        assert await throttle.verify(agents, WRONG, "10.0.0.1") is None
    with pytest.raises(ThrottledError) as refused:
        await throttle.verify(agents, WRONG, "10.0.0.1")
    assert 1 <= refused.value.retry_after <= 60
    assert throttle.throttled("10.0.0.1")
    # Everyone else behind that address still gets in, as often as they ask.
    for _ in range(50):
        assert await throttle.verify(agents, GOOD, "10.0.0.1") == AgentInfo("agent-a")
    with pytest.raises(ThrottledError):
        await throttle.verify(agents, WRONG, "10.0.0.1")
    assert not throttle.throttled("10.0.0.2")
    assert await throttle.verify(agents, WRONG, "10.0.0.2") is None
    assert bcrypt_checks == []  # digests only: no bcrypt at all


async def test_once_throttled_wrong_tokens_cost_no_hashing(bcrypt_checks: list[bytes]) -> None:
    # An agent added before digests: its tokens need bcrypt until one right one is seen.
    agents, throttle = agents_over(Table(digest=False)), AuthThrottle("3/minute", "")
    for _ in range(3):
        assert await throttle.verify(agents, WRONG, "10.0.0.1") is None
    assert len(bcrypt_checks) == 3
    for _ in range(20):
        with pytest.raises(ThrottledError):
            await throttle.verify(agents, WRONG, "10.0.0.1")
    assert len(bcrypt_checks) == 3
    # Unknown agents and malformed tokens never cost bcrypt.
    for n, token in enumerate(("nobody." + SECRET, "no-dot", "agent-a.", ".x")):
        assert await throttle.verify(agents, token, f"10.0.1.{n}") is None
    assert len(bcrypt_checks) == 3


async def test_the_first_right_token_writes_the_digest_and_bcrypt_stops(
        bcrypt_checks: list[bytes]) -> None:
    table = Table(digest=False)
    agents = agents_over(table)
    assert await agents.verify_token(GOOD) == AgentInfo("agent-a")
    assert table.saved == [("agent-a", SECRET_HASH, token_digest(SECRET, SECRET_HASH))]
    assert len(bcrypt_checks) == 1
    for _ in range(10):
        assert await agents.verify_token(GOOD) == AgentInfo("agent-a")
        assert await agents.verify_token(WRONG) is None
    assert len(bcrypt_checks) == 1


async def test_a_digest_is_void_once_the_hash_changes_and_revoked_agents_stay_out(
        bcrypt_checks: list[bytes]) -> None:
    table = Table(digest=True)
    agents = agents_over(table)
    # The hash rotated by hand (SQL), the digest left behind: the old secret is refused.
    other_hash = hash_secret("n" * 43)
    table.row = AgentSecret(table.row.info, other_hash, table.row.secret_digest)
    assert await agents.verify_token(GOOD) is None
    revoked = Table(digest=True, revoked=True)
    assert await agents_over(revoked).verify_token(GOOD) is None
    assert bcrypt_checks == []


def test_short_secrets_get_no_fast_digest() -> None:
    assert token_digest("short-hand-set-secret", SECRET_HASH) == ""
    assert len(token_digest(SECRET, SECRET_HASH)) == 64
    assert token_digest(SECRET, SECRET_HASH) != token_digest(SECRET, hash_secret(SECRET))


async def test_rotating_addresses_gets_no_more_hashing(bcrypt_checks: list[bytes]) -> None:
    agents = agents_over(Table(digest=False))
    throttle = AuthThrottle("3/minute", "5/minute")
    refused: list[int] = []
    for n in range(60):
        try:
            assert await throttle.verify(agents, WRONG, f"10.1.0.{n}") is None
        except ThrottledError as exc:
            refused.append(exc.retry_after)
    assert len(bcrypt_checks) == 5
    assert len(refused) == 55
    assert all(1 <= seconds <= 60 for seconds in refused)
    # The digest path is not bounded by it: agents with digests are checked still.
    assert await throttle.verify(agents_over(Table(digest=True)), GOOD,
                                 "10.1.0.1") == AgentInfo("agent-a")


async def test_valid_tokens_and_missing_ones_never_count() -> None:
    agents, throttle = agents_over(Table(digest=True)), AuthThrottle("2/minute")
    for _ in range(10):
        assert await throttle.verify(agents, GOOD, "10.0.0.1") is not None
        assert await throttle.verify(agents, "", "10.0.0.1") is None
    assert await throttle.verify(agents, WRONG, "10.0.0.1") is None  # first failure


async def test_off_never_throttles() -> None:
    agents, throttle = agents_over(Table(digest=True)), AuthThrottle("")
    for _ in range(50):
        assert await throttle.verify(agents, WRONG, "10.0.0.1") is None


def test_the_limits_are_settings_and_a_bad_one_is_a_clear_error() -> None:
    settings = DoorsSettings.from_env({})
    assert (settings.auth_failures, settings.auth_hashes) == ("20/minute", "8/second")
    off = DoorsSettings.from_env({"GATEWAY_AUTH_FAILURES": "off",
                                    "GATEWAY_AUTH_HASHES": "off"})
    assert (off.auth_failures, off.auth_hashes) == ("", "")
    assert DoorsSettings.from_env(
        {"GATEWAY_AUTH_FAILURES": "5 per 10 seconds"}).auth_failures == "5 per 10 seconds"
    with pytest.raises(ValueError, match="GATEWAY_AUTH_FAILURES"):
        AuthThrottle("often")
    with pytest.raises(ValueError, match="GATEWAY_AUTH_HASHES"):
        AuthThrottle("20/minute", "lots")


async def test_a_flood_from_many_addresses_writes_a_bounded_number_of_lines(
        caplog: pytest.LogCaptureFixture) -> None:
    agents, throttle = agents_over(Table(digest=True)), AuthThrottle("1/minute")
    caplog.set_level(logging.DEBUG)
    refused = 0
    for n in range(2_000):
        try:
            await throttle.verify(agents, WRONG, f"10.2.{n % 200}.1")
        except ThrottledError:
            refused += 1
    assert refused == 1_800
    assert 1 <= len(caplog.records) <= 10
    assert all(r.exc_info is None for r in caplog.records)


def test_log_budget_per_key_and_in_all(caplog: pytest.LogCaptureFixture) -> None:
    budget = LogBudget(logging.getLogger("test.budget"), per_key="1/minute",
                       total="3/minute")
    caplog.set_level(logging.WARNING, logger="test.budget")
    written = [budget.warning(key, "line for %s", key) for key in ("a", "a", "b", "c", "d")]
    assert written == [True, False, True, True, False]
    assert [r.getMessage() for r in caplog.records] == [
        "line for a", "line for b (1 similar lines left out)", "line for c"]
    assert budget.suppressed == 1


def test_aiohttp_server_lines_are_bounded_a_bugs_traceback_kept_a_malformed_one_not(
        caplog: pytest.LogCaptureFixture) -> None:
    from aiohttp.http_exceptions import BadHttpMessage

    from services.doors.http import ServerLog

    logger = logging.getLogger("test.aiohttp.server")
    server = ServerLog(logger)
    caplog.set_level(logging.INFO, logger="test.aiohttp.server")
    bad = BadHttpMessage("Missing expected LF after header value:\n\n    b'X: a\\rb'\n  ^")
    for n in range(100):
        server.exception("Error handling request from %s", f"10.0.0.{n % 3}", exc_info=bad)
        server.exception("Error handling request from %s", "10.0.0.1",
                         exc_info=ZeroDivisionError("a bug"))
    malformed = [r for r in caplog.records if r.exc_info is None]
    bugs = [r for r in caplog.records if r.exc_info is not None]
    # One line per address: three; the bug's one line with its traceback.
    assert [r.getMessage() for r in malformed] == [
        f"Error handling request from 10.0.0.{n} (malformed request): "
        "BadHttpMessage: Missing expected LF after header value" for n in range(3)]
    assert all(r.levelno == logging.WARNING for r in malformed)
    assert [(r.levelno, r.getMessage()) for r in bugs] == [
        (logging.ERROR, "Error handling request from 10.0.0.1")]
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="test.aiohttp.server")
    server.debug("Ignored premature client disconnection")  # DEBUG: as it is
    assert [r.getMessage() for r in caplog.records] == ["Ignored premature client disconnection"]


@pytest.mark.parametrize(("peer", "address"), [
    ("ipv4:127.0.0.1:50123", "127.0.0.1"),
    ("ipv6:[::1]:50123", "::1"),
    ("unix:/tmp/grpc.sock", "unix:/tmp/grpc.sock"),
])
def test_grpc_peers_are_counted_by_address_not_port(peer: str, address: str) -> None:
    assert grpc_peer_address(peer) == address


def test_a_short_dashboard_token_leaves_the_dashboard_off(
        caplog: pytest.LogCaptureFixture) -> None:
    from aiohttp import web

    from services.doors.dashboard.routes import MIN_TOKEN, add_dashboard_routes

    caplog.set_level(logging.ERROR)
    pool: Any = None  # not used until a page is asked for
    assert not add_dashboard_routes(web.Application(), pool, token="x" * (MIN_TOKEN - 1))
    assert "needs 32 or more" in caplog.text
    assert "x" * 8 not in caplog.text  # the token itself is never written
    assert add_dashboard_routes(web.Application(), pool, token="x" * MIN_TOKEN)


async def test_made_up_agent_ids_are_bounded_in_memory_and_malformed_ones_not_looked_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import shared.auth.identity as identity

    monkeypatch.setattr(identity, "MAX_RECORDS", 100)
    fetched: list[str] = []

    async def fetch(agent_id: str) -> AgentSecret | None:
        fetched.append(agent_id)
        return None

    agents = CachedAgents(fetch, ttl=60.0)
    for n in range(1_000):
        assert await agents.verify_token(f"made-up-{n}.{SECRET}") is None
    assert len(fetched) == 1_000
    assert len(agents._records) <= 100
    for token in ("bad id." + SECRET, "a/b." + SECRET, "x" * 65 + "." + SECRET):
        assert await agents.verify_token(token) is None
    assert len(fetched) == 1_000
