"""The trace-guided retry measured (ADR-0009, RC-08) against a blind retry, on a real local
model and the real parser service.

    intentroute bench codegen [--requests 60] [--model smollm2-135m-instruct] --json

Each CODE_GENERATION request (bench/codegen_prompts.jsonl, written for this bench: 60
requests in English and Spanish, from "return the name parameter" to a sign-up
endpoint, plus fixes and ports of foreign code) goes through the pieces of the real
loop, in process: the demo knowledge base (kb/avap) in an embedded index searched as the
retriever worker searches it (its method, top 8), the generator's prompt
(`services.generator.prompts.render_prompt`) streamed from the local model on llama.cpp's
server (`shared.llm`, as `up --llm` runs it, sampling at the server's defaults as the
generators do), the validator's extraction and the parser gRPC service
(`services.parser`) behind the validator's guard, lenient as shipped. An invalid first
answer is retried twice from the same start, both calls at once:

* trace-guided (RC-08): the first prompt plus the validator's `<parser_feedback>`;
* blind: the first prompt unchanged (a new sample).

Keys: `valid_first`, `fixed_by_trace_retry`, `invalid_unresolved` (what the pipeline
delivers), `fixed_by_blind_retry` (on the same invalid first answers),
`no_program_first` (first answers with no program in them), `parser_unavailable` and
`model_errors` (requests left out because the parser or the model server failed;
0 and 0 unless something broke: the first three keys and these add up to
`requests`), the model, seconds per generation and in all. `--answers FILE` writes
every attempt (answer, program, parser feedback) as it goes.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from intentroute.stack import free_port
from intentroute.stack.llm import LOCAL_MODEL, local_server
from services.generator.prompts import render_prompt
from services.parser.server import serve as serve_parser
from services.retriever.bootstrap import build_retrieval
from services.retriever.ports import Retrieval
from services.retriever.settings import RetrieverSettings
from services.validator.extract import extract_avap_code
from services.validator.handlers import NO_PROGRAM_FEEDBACK
from services.validator.parser_client import GrpcParserClient, GuardedParser
from services.validator.ports import CheckStatus, CodeChecker
from shared.common.settings import CommonSettings
from shared.contracts.pipeline import Routed
from shared.contracts.request import AgentRequest
from shared.contracts.routing import Layer, QueryType, RoutingDecision, slot_for
from shared.llm.openai import OpenAIBackend
from shared.llm.ports import BackendUnavailableError, ChatBackend, ChatMessage
from shared.llm.select import open_backend

REPO = Path(__file__).resolve().parents[2]
PROMPTS = Path(__file__).resolve().parent / "codegen_prompts.jsonl"
KB = REPO / "kb" / "avap"
# Seconds one generation may take (256 tokens at the slowest rate seen here, ~10/s,
# plus the prompt).
GENERATION_TIMEOUT = 120.0


class Prompt(msgspec.Struct):
    id: str
    query: str


@dataclass
class Attempt:
    answer: str
    code: str
    status: CheckStatus | None  # None: no answer from the model server
    feedback: str
    seconds: float

    def row(self) -> dict[str, Any]:
        return {"status": self.status.value if self.status else "MODEL_ERROR",
                "seconds": round(self.seconds, 2),
                "answer": self.answer, "code": self.code, "feedback": self.feedback}


def load_prompts(n: int, path: Path = PROMPTS) -> list[Prompt]:
    """`n` prompts: the file's, in order, again from the start past its end."""
    prompts = [msgspec.json.decode(line, type=Prompt)
               for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [prompts[i % len(prompts)] for i in range(n)]


def envelope(prompt: Prompt, passages: list[Any]) -> Routed:
    decision = RoutingDecision(type=QueryType.CODE_GENERATION, layer=Layer.DECLARED,
                               confidence=1.0, model_slot=slot_for(QueryType.CODE_GENERATION))
    request = AgentRequest(request_id=f"codegen-{prompt.id}", session_id="bench",
                           agent_id="bench", query=prompt.query)
    return Routed(request=request, accepted_at=time.time(), decision=decision,
                  passages=passages)


class Loop:
    """One generate -> validate step, as the generator and the validator take it."""

    def __init__(self, backend: ChatBackend, model: str, checker: CodeChecker) -> None:
        self.backend, self.model, self.checker = backend, model, checker
        self.generation_s: list[float] = []
        self.errors = 0

    async def attempt(self, messages: list[ChatMessage]) -> Attempt:
        started = time.perf_counter()
        pieces = []
        try:
            async with asyncio.timeout(GENERATION_TIMEOUT):
                async for piece in self.backend.stream(self.model, messages):
                    if isinstance(piece, str):
                        pieces.append(piece)
        except (BackendUnavailableError, TimeoutError) as exc:
            # What the generator would answer instead is not generated code: counted
            # apart (`model_errors`), not as the model's failure to write a program.
            self.errors += 1
            return Attempt("", "", None, repr(exc), time.perf_counter() - started)
        seconds = time.perf_counter() - started
        self.generation_s.append(seconds)
        answer = "".join(pieces)
        code = extract_avap_code(answer)
        if not code:  # the validator's verdict on an answer with nothing to parse
            return Attempt(answer, code, CheckStatus.INVALID, NO_PROGRAM_FEEDBACK, seconds)
        verdict = await self.checker.check(code)
        return Attempt(answer, code, verdict.status, verdict.feedback, seconds)


async def _request(loop: Loop, retrieval: Retrieval, top_k: int, prompt: Prompt
                   ) -> tuple[list[str], dict[str, Any]]:
    """One request through the loop: the outcome keys it counts in, and its attempts."""
    found = await retrieval.search(prompt.query, top_k)
    env = envelope(prompt, found.passages)
    first_messages = render_prompt(env)
    first = await loop.attempt(first_messages)
    row: dict[str, Any] = {"id": prompt.id, "query": prompt.query, "first": first.row()}
    if first.status is None:
        return ["model_errors"], row
    keys = [] if first.code else ["no_program_first"]
    if first.status is not CheckStatus.INVALID:
        outcome = "valid_first" if first.status is CheckStatus.VALID else "parser_unavailable"
        return [*keys, outcome], row
    env.parser_feedback, env.attempt = first.feedback, 1
    traced, blind = await asyncio.gather(loop.attempt(render_prompt(env)),
                                         loop.attempt(first_messages))
    row |= {"trace_retry": traced.row(), "blind_retry": blind.row()}
    # The two retries are compared on the same requests: one without a verdict leaves
    # the request out.
    if traced.status is None or blind.status is None:
        return ["model_errors"], row
    if CheckStatus.UNAVAILABLE in (traced.status, blind.status):
        return ["parser_unavailable"], row
    keys.append("fixed_by_trace_retry" if traced.status is CheckStatus.VALID
                else "invalid_unresolved")
    if blind.status is CheckStatus.VALID:
        keys.append("fixed_by_blind_retry")
    return keys, row


async def _measure(prompts: list[Prompt], env: dict[str, str], model: str,
                   retrieval_settings: RetrieverSettings,
                   answers_out: Path | None) -> dict[str, Any]:
    backend = open_backend(CommonSettings.from_env(env), "openai", timeout=GENERATION_TIMEOUT)
    assert isinstance(backend, OpenAIBackend)
    port = free_port()
    parser = await serve_parser("127.0.0.1", port)
    client = GrpcParserClient(f"127.0.0.1:{port}")
    retrieval = build_retrieval(retrieval_settings)
    loop = Loop(backend, model, GuardedParser(client, timeout=5.0))
    counts = dict.fromkeys(("valid_first", "fixed_by_trace_retry", "invalid_unresolved",
                            "fixed_by_blind_retry", "no_program_first",
                            "parser_unavailable", "model_errors"), 0)
    try:
        for prompt in prompts:
            keys, row = await _request(loop, retrieval, retrieval_settings.top_k, prompt)
            for key in keys:
                counts[key] += 1
            if answers_out is not None:  # written as it goes: a long run shows progress
                with answers_out.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(row) + "\n")
    finally:
        await retrieval.close()
        await client.close()
        await parser.stop(0)
        await backend.aclose()
    gen = loop.generation_s
    return {**counts, "generations": len(gen),
            "generation_s_p50": round(statistics.median(gen), 2) if gen else None,
            "generation_s_max": round(max(gen), 2) if gen else None}


def _index(settings: RetrieverSettings, index_dir: Path) -> RetrieverSettings:
    """The demo knowledge base in a fresh embedded index, as `intentroute ingest` builds
    it; the retriever's settings pointed at it."""
    from services.retriever.indexing.embedded_ingest import ingest
    from shared.encoders.fast import batch_fast_encoder

    common = settings.common
    encoder = batch_fast_encoder(settings.embedding_model, precision=common.ingest_precision,
                                 onnx_cache_dir=common.onnx_cache_dir)
    ingest(KB, index_dir, encoder, progress=False, batch_size=16)
    return msgspec.structs.replace(
        settings, common=msgspec.structs.replace(common, index_dir=index_dir))


def run(*, requests: int = 60, model: str = LOCAL_MODEL, threads: int = 1,
        answers_out: Path | None = None) -> dict[str, Any]:
    prompts = load_prompts(requests)
    started = time.perf_counter()
    if answers_out is not None:
        answers_out.write_text("", encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="bench-codegen-") as tmp:
        settings = _index(RetrieverSettings.from_env(), Path(tmp) / "index")
        with local_server(model, threads=threads) as env:
            report = asyncio.run(_measure(prompts, {**os.environ, **env}, model, settings,
                                          answers_out))
    return {"model": model, "requests": len(prompts), **report,
            "retrieval": settings.method, "threads": threads,
            "seconds": round(time.perf_counter() - started, 1)}


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
