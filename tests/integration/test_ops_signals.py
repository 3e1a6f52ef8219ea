"""Ops signals on real servers with authentication on: every worker on the NATS services
API with counts that move, its Prometheus endpoint, and `intentroute status`."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from intentroute.cli import app
from intentroute.stack import free_port
from intentroute.stack.nats_users import admin_kwargs, ops_kwargs
from intentroute.status import gather
from shared.client.caller import publish_request
from shared.contracts import pipeline
from shared.runtime.consumer import ensure_consumer
from tests.helpers.nats_auth import assert_publish_refused, connect_recording
from tests.helpers.pipeline import ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration


def _home() -> Path:
    return Path(os.environ["INTENTROUTE_HOME"])


def _env(nats_url: str, database_url: str, kb_index: Path, **extra: str) -> dict[str, str]:
    return base_env(nats_url, database_url, kb_index, GENERATOR_BACKEND="echo",
                    CLASSIFIER_HEADS_DIR="", **extra)


async def _stats(ops: Any, name: str) -> list[dict[str, Any]]:
    return await gather(ops, f"$SRV.STATS.{name}", timeout=2.0)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_a_worker_answers_the_services_api_and_serves_prometheus_metrics(
    nc: Any, nats_url: str, database_url: str, kb_index: Path
) -> None:
    port = free_port()
    env = _env(nats_url, database_url, kb_index)
    classifier_env = {**env, "METRICS_PORT": str(port), "METRICS_INTERVAL": "0.2"}
    ops = await nats.connect(nats_url, **ops_kwargs(_home()))
    try:
        async with running(env, ("gateway", "generator-conversational")), \
                running(classifier_env, ("classifier",)):
            (ping,) = await gather(ops, "$SRV.PING.intentroute-classifier", timeout=2.0)
            (info,) = await gather(ops, f"$SRV.INFO.intentroute-classifier.{ping['id']}")
            assert info["endpoints"] == [{"name": "classifier",
                                          "subject": "intentroute.stage.classify",
                                          "queue_group": "classifier", "metadata": {
                                              "stream": "INTENTROUTE_PIPELINE",
                                              "max_inflight": "32"}}]
            assert info["metadata"]["metrics"] == f"127.0.0.1:{port}"
            (before,) = await _stats(ops, "intentroute-classifier")
            assert before["endpoints"][0]["num_requests"] == 0

            for i in range(3):
                chunks = await ask_all(nc, make_request(f"say it again {i}",
                                                        query_type="CONVERSATIONAL"))
                assert chunks[-1].is_final
                assert chunks[-1].error is None

            (after,) = await _stats(ops, "intentroute-classifier")
            endpoint = after["endpoints"][0]
            assert after["id"] == ping["id"]
            assert endpoint["num_requests"] == 3
            assert endpoint["num_errors"] == 0
            assert endpoint["processing_time"] > 0
            assert endpoint["data"]["outcomes"]["ok"] == 3
            assert sum(endpoint["data"]["buckets"]) == 3
            # Every worker type answers PING on the services API, under its own name.
            names = {r["name"] for r in await gather(ops, "$SRV.PING", timeout=2.0)}
            assert {"intentroute-gateway", "intentroute-classifier",
                    "intentroute-generator-conversational"} <= names

            async with httpx.AsyncClient() as http:
                for _ in range(50):  # until the lag poller has read the consumer once
                    text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
                    if "intentroute_consumer_pending" in text:
                        break
                    await asyncio.sleep(0.1)
        metrics = _samples(text)
        stage = (("stage", "classifier"),)
        ok = (("outcome", "ok"), ("stage", "classifier"))
        assert metrics[("intentroute_stage_messages_total", ok)] == 3
        assert metrics[("intentroute_stage_duration_seconds_count", ok)] == 3
        assert metrics[("intentroute_stage_redeliveries_total", stage)] == 0
        assert metrics[("intentroute_consumer_pending", stage)] == 0
        assert metrics[("intentroute_consumer_ack_pending", stage)] == 0
        assert ("intentroute_stage_inflight", stage) in metrics
        assert metrics[("intentroute_stage_waiting", stage)] == 0  # all three taken
        assert ("intentroute_dead_letters_stored", stage) in metrics
    finally:
        await ops.drain()


async def test_the_ops_reader_cannot_change_or_consume_anything(nats_url: str) -> None:
    ops = await connect_recording(nats_url, **ops_kwargs(_home()))
    try:
        for subject in ("$JS.API.STREAM.PURGE.INTENTROUTE_PIPELINE",
                        "$JS.API.CONSUMER.DELETE.INTENTROUTE_PIPELINE.classifier",
                        "$JS.API.CONSUMER.MSG.NEXT.INTENTROUTE_PIPELINE.classifier",
                        pipeline.CLASSIFY_SUBJECT, "agent.request.tests"):
            await assert_publish_refused(ops, subject)
    finally:
        await ops.nc.close()


async def test_status_shows_replicas_and_a_backlog(
    nc: Any, nats_url: str, database_url: str, kb_index: Path
) -> None:
    from services.retriever.handlers import build_stage
    from services.retriever.settings import RetrieverSettings

    env = _env(nats_url, database_url, kb_index)
    admin = await nats.connect(nats_url, **admin_kwargs(_home()))
    js = admin.jetstream()
    # The retriever's consumer exists but no retriever runs: what the classifiers hand
    # it is the backlog.
    await ensure_consumer(js, build_stage(RetrieverSettings.from_env(env)).spec)
    await js.purge_stream(pipeline.STREAM, subject=pipeline.RETRIEVE_SUBJECT)
    ops = await nats.connect(nats_url, **ops_kwargs(_home()))
    try:
        async with running(env, ("gateway", "classifier", "classifier")):
            for i in range(6):
                await publish_request(nc, make_request(f"what does addVar do {i}?",
                                                       query_type="RETRIEVAL"))
            for _ in range(100):
                replies = await _stats(ops, "intentroute-classifier")
                if sum(r["endpoints"][0]["num_requests"] for r in replies) >= 6:
                    break
                await asyncio.sleep(0.1)
            ops_cred = ops_kwargs(_home())
            result = await asyncio.to_thread(
                CliRunner().invoke, app, ["status", "--json", "--interval", "0.2"],
                env={"NATS_URL": nats_url, "NATS_USER": ops_cred["user"],
                     "NATS_PASSWORD": ops_cred["password"],
                     "NATS_INBOX_PREFIX": ops_cred["inbox_prefix"]})
        assert result.exit_code == 0, result.output
        rows = {row["stage"]: row for row in json.loads(result.stdout)["stages"]}
        assert list(rows) == ["gateway", "classifier", "retriever", "generator-main",
                              "generator-conversational", "validator", "doors", "learner"]
        classifier, retriever = rows["classifier"], rows["retriever"]
        assert classifier["replicas"] == 2
        assert classifier["handled"] == 6
        assert len(classifier["instances"]) == 2
        assert classifier["pending"] == 0
        assert classifier["p95_ms_all"] is not None
        assert rows["gateway"]["replicas"] == 1
        assert retriever["replicas"] == 0
        assert retriever["pending"] == 6
        assert retriever["ack_pending"] == 0
    finally:
        await js.purge_stream(pipeline.STREAM, subject=pipeline.RETRIEVE_SUBJECT)
        await ops.drain()
        await admin.drain()


async def test_the_doors_answer_the_services_api_and_count_what_they_asked(
    nats_url: str, database_url: str, kb_index: Path, agent_tokens: dict[str, str]
) -> None:
    """The doors read no stage, yet `intentroute status` and `wait_for_consumers` see
    them: a `doors` endpoint on the services API, counting each call handed to the
    pipeline (here a verdict on a request the agent never sent: refused, an error)."""
    from intentroute.workers import wait_for_consumers
    from tests.helpers.pipeline import door_addresses

    _, http_url, listen = door_addresses()
    env = _env(nats_url, database_url, kb_index, **listen)
    ops = await nats.connect(nats_url, **ops_kwargs(_home()))
    try:
        async with running(env, ("gateway", "doors")):
            await wait_for_consumers(ops, ["gateway", "doors"], timeout=30)
            async with httpx.AsyncClient() as http:
                resp = await http.post(
                    f"{http_url}/agents/agent-a/feedback",
                    json={"request_id": "never-sent", "outcome": "success"},
                    headers={"Authorization": f"Bearer {agent_tokens['agent-a']}"})
            assert resp.status_code == 404
            assert resp.json()["error_code"] == "UNKNOWN_REQUEST"
            (stats,) = await _stats(ops, "intentroute-doors")
    finally:
        await ops.drain()
    (endpoint,) = stats["endpoints"]
    assert endpoint["name"] == "doors"
    assert (endpoint["num_requests"], endpoint["num_errors"]) == (1, 1)
