"""Wrong credentials at a real gateway, as a hostile caller tries them: once one address
has presented too many (at any door: HTTP feedback, gRPC, the dashboard), its wrong
ones are answered 429 / RESOURCE_EXHAUSTED, while the right ones from the same address
are let in at every door. An agent added before token digests is upgraded by its first
right token. An anonymous flood of gRPC bodies that do not decode, or of malformed HTTP
requests (refused by aiohttp's parser before any handler, or bodies a handler cannot
read), is refused and writes a bounded number of log lines, no tracebacks."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

import aiohttp
import asyncpg
import grpc
import pytest

from services.doors.http import split_listen
from shared.grpc import agent_pb2, agent_pb2_grpc
from shared.store import asyncpg_dsn
from shared.store.agents import AgentStore
from tests.helpers.pipeline import gateway

pytestmark = pytest.mark.integration

DASHBOARD_TOKEN = "operator-token-for-the-throttle-test"
FEEDBACK_METHOD = "/intentroute.agent.v1.AssistanceEngine/Feedback"


async def test_the_right_credentials_get_in_at_every_door_from_a_throttled_address(
    agent_tokens: dict[str, str], nats_url: str, database_url: str, tmp_path: Path
) -> None:
    good_token = agent_tokens["agent-a"]
    good = {"Authorization": f"Bearer {good_token}"}
    wrong = {"Authorization": f"Bearer {good_token}x"}
    body = b'{"request_id": "r-unknown", "outcome": "success"}'
    async with gateway(nats_url, database_url, tmp_path,
                       GATEWAY_AUTH_FAILURES="3 per minute",
                       GATEWAY_DASHBOARD_TOKEN=DASHBOARD_TOKEN) as (grpc_addr, url), \
            aiohttp.ClientSession() as http, \
            grpc.aio.insecure_channel(grpc_addr) as channel:
        feedback = f"{url}/agents/agent-a/feedback"
        stub = agent_pb2_grpc.AssistanceEngineStub(channel)
        message = agent_pb2.FeedbackRequest(request_id="r-unknown", outcome="success")

        async def post(headers: dict[str, str]) -> tuple[int, str]:
            async with http.post(feedback, data=body, headers=headers) as resp:
                return resp.status, resp.headers.get("Retry-After", "")

        async def grpc_feedback(token: str) -> grpc.aio.AioRpcError:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Feedback(message, metadata=(("authorization", f"Bearer {token}"),))
            return refused.value

        async def login(token: str) -> int:
            async with http.post(f"{url}/dashboard/login", data={"token": token},
                                 allow_redirects=False) as resp:
                return resp.status

        # Three wrong tries, at three doors: each is checked and refused.
        assert (await post(wrong))[0] == 401
        assert (await grpc_feedback("agent-a.nope")).code() == grpc.StatusCode.UNAUTHENTICATED
        assert await login("guess") == 401

        # From now on this address's wrong credentials are throttled at every door ...
        status, retry_after = await post(wrong)
        assert status == 429
        assert 1 <= int(retry_after) <= 60
        throttled = await grpc_feedback("agent-a.nope")
        assert throttled.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert dict(throttled.trailing_metadata() or ())["retry-after"].isdigit()
        assert await login("guess") == 429
        async with http.get(f"{url}/dashboard/api/data",
                            headers={"Authorization": "Bearer guess"}) as resp:
            assert resp.status == 429

        # ... and the right ones from the same address get in at every door, at once
        # (the request id is not agent-a's: 404 / NOT_FOUND, past authentication).
        for _ in range(3):
            assert (await post(good))[0] == 404
            assert (await grpc_feedback(good_token)).code() == grpc.StatusCode.NOT_FOUND
            assert await login(DASHBOARD_TOKEN) == 303
            async with http.get(f"{url}/dashboard/api/data",
                                headers={"Authorization": f"Bearer {DASHBOARD_TOKEN}"}) as resp:
                assert resp.status == 200
        # Still throttled for the wrong ones.
        assert (await post(wrong))[0] == 429


async def test_an_agent_without_a_digest_is_upgraded_by_its_first_right_token(
    nats_url: str, database_url: str, tmp_path: Path
) -> None:
    agent_id = f"legacy-{uuid.uuid4().hex[:8]}"
    store = await AgentStore.connect(database_url)
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        cred = await store.add(agent_id)
        # As an agent added before migration 0008: a bcrypt hash and no digest.
        await conn.execute("UPDATE agents SET secret_digest = '' WHERE agent_id = $1",
                           agent_id)
        async with gateway(nats_url, database_url, tmp_path,
                           GATEWAY_AUTH_FAILURES="2 per minute") as (grpc_addr, _), \
                grpc.aio.insecure_channel(grpc_addr) as channel:
            stub = agent_pb2_grpc.AssistanceEngineStub(channel)
            message = agent_pb2.FeedbackRequest(request_id="r-unknown", outcome="success")

            async def code(token: str) -> grpc.StatusCode:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Feedback(message,
                                        metadata=(("authorization", f"Bearer {token}"),))
                return refused.value.code()

            wrong = f"{agent_id}.{'w' * 43}"
            assert [await code(wrong) for _ in range(3)] == [
                grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.RESOURCE_EXHAUSTED]
            # Throttled, and bcrypt is not spent for it: the right token waits too.
            assert await code(cred.token) == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert await conn.fetchval(
                "SELECT secret_digest FROM agents WHERE agent_id = $1", agent_id) == ""
        # Once its address is not throttled (a fresh gateway: counts are per process) it
        # gets in and its digest is written: from then on it is let in from throttled
        # addresses too.
        async with gateway(nats_url, database_url, tmp_path,
                           GATEWAY_AUTH_FAILURES="2 per minute") as (grpc_addr, _), \
                grpc.aio.insecure_channel(grpc_addr) as channel:
            stub = agent_pb2_grpc.AssistanceEngineStub(channel)
            assert await code(cred.token) == grpc.StatusCode.NOT_FOUND
            assert len(await conn.fetchval(
                "SELECT secret_digest FROM agents WHERE agent_id = $1", agent_id)) == 64
            assert [await code(wrong) for _ in range(3)][-1] == \
                grpc.StatusCode.RESOURCE_EXHAUSTED
            assert await code(cred.token) == grpc.StatusCode.NOT_FOUND
    finally:
        await conn.execute("UPDATE agents SET revoked_at = now() WHERE agent_id = $1",
                           agent_id)
        await conn.close()
        await store.close()


async def test_an_anonymous_flood_of_undecodable_bodies_writes_bounded_lines(
    agent_tokens: dict[str, str], nats_url: str, database_url: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture
) -> None:
    async with gateway(nats_url, database_url, tmp_path,
                       GATEWAY_AUTH_FAILURES="5 per minute") as (grpc_addr, _), \
            grpc.aio.insecure_channel(grpc_addr) as channel:
        raw = channel.unary_unary(FEEDBACK_METHOD)  # bytes in, bytes out
        caplog.clear()
        caplog.set_level(logging.INFO)

        async def code(body: bytes, token: str) -> grpc.StatusCode:
            metadata = (("authorization", f"Bearer {token}"),) if token else ()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await raw(body, metadata=metadata)
            return refused.value.code()

        codes: dict[grpc.StatusCode, int] = {}
        for n in range(600):
            token = ("", f"agent-a.guess{n}", f"nobody-{n}.x")[n % 3]
            status = await code(b"\xff\xff\xff\xff" + bytes([n % 256]), token)
            codes[status] = codes.get(status, 0) + 1
        assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED,
                              grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert codes[grpc.StatusCode.UNAUTHENTICATED] >= 200  # every call without a token
        # With the right token the same bodies are INVALID_ARGUMENT, throttled address
        # or not.
        assert await code(b"\xff\xff\xff\xff", agent_tokens["agent-a"]) == \
            grpc.StatusCode.INVALID_ARGUMENT
        lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) <= 10, [r.getMessage() for r in lines]
    assert all(r.exc_info is None for r in lines)


# Requests aiohttp refuses before any handler runs, and bodies a handler cannot read:
# each used to log an ERROR with a traceback (the 300 below: 350 of them, 7,600 lines).
_HEAD = b"POST /dashboard/login HTTP/1.1\r\nHost: gateway\r\n"
_FORM = b"Content-Type: application/x-www-form-urlencoded"
MALFORMED = {
    "bare CR in a header": b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-A: a\rb\r\n\r\n",
    "100 kB Authorization": b"GET /v1/models HTTP/1.1\r\nHost: gateway\r\n"
                            b"Authorization: Bearer " + b"a" * 100_000 + b"\r\n\r\n",
    "NUL in a header": b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-A: a\x00b\r\n\r\n",
    "obs-folded header": b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-A: a\r\n b\r\n\r\n",
    "form in an unknown charset": _HEAD + _FORM + b"; charset=nope\r\n"
                                  b"Content-Length: 7\r\n\r\ntoken=x",
    "gzip body that does not decode": _HEAD + _FORM + b"\r\nContent-Encoding: gzip\r\n"
                                      b"Content-Length: 9\r\n\r\nnot gzip!",
}


async def raw_status(host: str, port: int, request: bytes) -> bytes:
    """The status line the gateway answers a raw request with (b"" when it closed the
    connection before answering)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.readline(), 10)
    except ConnectionError:
        answer = b""
    finally:
        writer.close()
    return answer.strip()


async def test_a_flood_of_malformed_http_requests_writes_bounded_lines(
    nats_url: str, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with gateway(nats_url, database_url, tmp_path,
                       GATEWAY_DASHBOARD_TOKEN=DASHBOARD_TOKEN) as (_, url):
        host, port = split_listen(url.removeprefix("http://"))
        caplog.clear()
        caplog.set_level(logging.INFO)
        answers: dict[str, set[bytes]] = {}
        kinds = list(MALFORMED)
        for n in range(300):
            kind = kinds[n % len(kinds)]
            answers.setdefault(kind, set()).add(await raw_status(host, port, MALFORMED[kind]))
        await asyncio.sleep(0.2)  # a connection's last lines
        lines = [r for r in caplog.records if r.levelno >= logging.INFO]
        # The gateway still answers.
        async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz") as resp:
            assert resp.status == 200
    for kind, statuses in answers.items():
        # Refused as the caller's error (the 100 kB header may be cut off by a reset).
        assert statuses <= {b"HTTP/1.0 400 Bad Request", b"HTTP/1.1 400 Bad Request", b""}, \
            (kind, statuses)
        assert statuses != {b""}, kind
    assert 1 <= len(lines) <= 10, [r.getMessage()[:200] for r in lines]
    assert all(r.exc_info is None and r.exc_text is None for r in lines)
    assert all("\n" not in r.getMessage() and "\r" not in r.getMessage() for r in lines)


async def test_up_upgrades_the_agents_it_holds_credentials_for(database_url: str) -> None:
    """`up` checks its credential files with AgentStore.verify_token: the first right
    one writes the digest, a wrong one does not, and a new secret comes with one."""
    agent_id = f"legacy-{uuid.uuid4().hex[:8]}"
    store = await AgentStore.connect(database_url)
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    digest_sql = "SELECT secret_digest FROM agents WHERE agent_id = $1"
    try:
        cred = await store.add(agent_id)
        assert len(await conn.fetchval(digest_sql, agent_id)) == 64
        await conn.execute("UPDATE agents SET secret_digest = '' WHERE agent_id = $1",
                           agent_id)
        assert await store.verify_token(f"{agent_id}.{'w' * 43}") is None
        assert await conn.fetchval(digest_sql, agent_id) == ""
        assert await store.verify_token(cred.token) is not None
        upgraded = await conn.fetchval(digest_sql, agent_id)
        assert len(upgraded) == 64
        assert await store.verify_token(cred.token) is not None
        assert await store.verify_token(f"{agent_id}.{'w' * 43}") is None
        rotated = await store.rotate(agent_id)
        assert await conn.fetchval(digest_sql, agent_id) not in ("", upgraded)
        assert await store.verify_token(cred.token) is None
        assert await store.verify_token(rotated.token) is not None
    finally:
        await conn.execute("UPDATE agents SET revoked_at = now() WHERE agent_id = $1",
                           agent_id)
        await conn.close()
        await store.close()
