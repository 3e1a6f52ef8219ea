"""Wrong credentials at the gateway, as a hostile caller tries them: once one address has
presented too many (at any door: HTTP feedback, gRPC, the dashboard), its credentials
are refused unchecked, the right ones too, until the window moves on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import grpc
import pytest

from shared.grpc import agent_pb2, agent_pb2_grpc
from tests.helpers.pipeline import gateway

pytestmark = pytest.mark.integration

DASHBOARD_TOKEN = "operator-token-for-the-throttle-test"


async def test_wrong_credentials_from_one_address_are_throttled_at_every_door(
    agent_tokens: dict[str, str], nats_url: str, database_url: str, tmp_path: Path
) -> None:
    good = {"Authorization": f"Bearer {agent_tokens['agent-a']}"}
    wrong = {"Authorization": f"Bearer {agent_tokens['agent-a']}x"}
    body = b'{"request_id": "r-unknown", "outcome": "success"}'
    async with gateway(nats_url, database_url, tmp_path,
                       GATEWAY_AUTH_FAILURES="3 per 10 seconds",
                       GATEWAY_DASHBOARD_TOKEN=DASHBOARD_TOKEN) as (grpc_addr, url), \
            aiohttp.ClientSession() as http, \
            grpc.aio.insecure_channel(grpc_addr) as channel:
        feedback = f"{url}/agents/agent-a/feedback"

        async def post(headers: dict[str, str]) -> tuple[int, str]:
            async with http.post(feedback, data=body, headers=headers) as resp:
                return resp.status, resp.headers.get("Retry-After", "")

        # Three wrong tries, at three doors: each is checked and refused.
        assert (await post(wrong))[0] == 401
        stub = agent_pb2_grpc.AssistanceEngineStub(channel)
        message = agent_pb2.FeedbackRequest(request_id="r-unknown", outcome="success")
        with pytest.raises(grpc.aio.AioRpcError) as first:
            await stub.Feedback(message, metadata=(("authorization", "Bearer agent-a.nope"),))
        assert first.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with http.post(f"{url}/dashboard/login", data={"token": "guess"},
                             allow_redirects=False) as resp:
            assert resp.status == 401

        # Now every door refuses this address, the right credentials included.
        status, retry_after = await post(good)
        assert status == 429
        assert 1 <= int(retry_after) <= 10
        with pytest.raises(grpc.aio.AioRpcError) as throttled:
            await stub.Feedback(message, metadata=(("authorization", f"Bearer "
                                                    f"{agent_tokens['agent-a']}"),))
        assert throttled.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert dict(throttled.value.trailing_metadata() or ())["retry-after"].isdigit()
        async with http.post(f"{url}/dashboard/login", data={"token": DASHBOARD_TOKEN},
                             allow_redirects=False) as resp:
            assert resp.status == 429
        async with http.get(f"{url}/dashboard/api/data",
                            headers={"Authorization": "Bearer guess"}) as resp:
            assert resp.status == 429

        # Once the window has moved on, the right token is checked again and let in
        # (this request id is not agent-a's: 404, past authentication).
        await asyncio.sleep(int(retry_after) + 0.5)
        assert (await post(good))[0] == 404
        async with http.post(f"{url}/dashboard/login", data={"token": DASHBOARD_TOKEN},
                             allow_redirects=False) as resp:
            assert resp.status == 303
