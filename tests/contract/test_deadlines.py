"""Every stage drops work past its request's deadline and answers DEADLINE_EXCEEDED
without doing it; the gateway gives every request a deadline (the caller may ask for
a shorter one)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from opentelemetry.trace import NoOpTracer

from services.classifier.handlers import ClassifierDeps
from services.classifier.handlers import build_stage as classifier_stage
from services.classifier.settings import ClassifierSettings
from services.gateway.handlers import GatewayDeps
from services.gateway.handlers import build_stage as gateway_stage
from services.gateway.settings import GatewaySettings
from services.generator.handlers import GeneratorDeps
from services.generator.handlers import build_stage as generator_stage
from services.generator.settings import GeneratorSettings
from services.retriever.handlers import RetrieverDeps
from services.retriever.handlers import build_stage as retriever_stage
from services.retriever.settings import RetrieverSettings
from services.validator.handlers import ValidatorDeps
from services.validator.handlers import build_stage as validator_stage
from services.validator.settings import ValidatorSettings
from shared.auth.ports import AgentInfo
from shared.common.settings import CommonSettings
from shared.contracts.codec import decode_admitted
from shared.contracts.pipeline import Admitted, Routed
from shared.contracts.routing import ModelSlot, QueryType
from testkit.fakes import FakeAgents, FakeStore, RecordingBus, feedback_recorder
from testkit.wire import ADMISSION, COMMON, request, routed_decision, run_on_wire


class Untouchable:
    """Any use of a dependency means the stage did work it should have dropped."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"expired work touched {name}")


def stages(bus: RecordingBus, store: FakeStore) -> dict[str, tuple[Any, Any, QueryType]]:
    base: dict[str, Any] = {"bus": bus, "store": store, "tracer": NoOpTracer(),
                            "admission": ADMISSION}
    return {
        "classify": (classifier_stage(ClassifierSettings(common=COMMON, heads_dir="")),
                     ClassifierDeps(**base, cascade=Untouchable(), policies=Untouchable()),
                     QueryType.RETRIEVAL),
        "retrieve": (retriever_stage(RetrieverSettings(common=COMMON)),
                     RetrieverDeps(**base, retrieval=Untouchable()), QueryType.RETRIEVAL),
        "generate.main": (generator_stage(GeneratorSettings(common=COMMON)),
                          GeneratorDeps(**base, walker=Untouchable(), model="fake/m",
                                        policies=Untouchable()),
                          QueryType.RETRIEVAL),
        "generate.conversational": (
            generator_stage(GeneratorSettings(common=COMMON, slot=ModelSlot.CONVERSATIONAL)),
            GeneratorDeps(**base, walker=Untouchable(), model="fake/m",
                          policies=Untouchable()),
            QueryType.CONVERSATIONAL),
        "validate": (validator_stage(ValidatorSettings(common=COMMON)),
                     ValidatorDeps(**base, checker=Untouchable()), QueryType.CODE_GENERATION),
    }


@pytest.mark.parametrize("name", ["classify", "retrieve", "generate.main",
                                  "generate.conversational", "validate"])
async def test_every_stage_answers_expired_work_without_doing_it(name: str) -> None:
    bus, store = RecordingBus(), FakeStore()
    stage, deps, qt = stages(bus, store)[name]
    rid = "late-" + name.replace(".", "-")
    req = request(rid, "what does addVar do")
    past = time.time() - 0.5
    env: Admitted | Routed = (Admitted(request=req, accepted_at=past - 1, deadline=past)
                              if name == "classify" else
                              Routed(request=req, accepted_at=past - 1, deadline=past,
                                     decision=routed_decision(qt)))
    _, delivery = await run_on_wire(stage, env, deps)
    (chunk,) = bus.chunks(rid)
    assert chunk.is_final
    assert chunk.error is not None
    assert chunk.error.code == "DEADLINE_EXCEEDED"
    assert not delivery.nacked
    assert "RequestLogRow" in store.kinds()


@pytest.mark.parametrize(("timeout_ms", "budget"), [(0, 120.0), (2_000, 2.0),
                                                    (500_000, 120.0)])
async def test_the_gateway_sets_every_requests_deadline(timeout_ms: int, budget: float) -> None:
    bus = RecordingBus()
    deps = GatewayDeps(bus=bus, store=FakeStore(), tracer=NoOpTracer(), admission=ADMISSION,
                       agents=FakeAgents(AgentInfo("a")), feedback=feedback_recorder())
    stage = gateway_stage(GatewaySettings(common=CommonSettings(request_deadline=120.0)))
    body = {"request_id": "d-1", "session_id": "s", "query": "hi", "timeout_ms": timeout_ms}
    before = time.time()
    await run_on_wire(stage, json.dumps(body).encode(), deps, subject="agent.request.a")
    admitted = decode_admitted(bus.on("intentroute.stage.classify")[0])
    assert admitted.deadline - before == pytest.approx(budget, abs=0.5)
