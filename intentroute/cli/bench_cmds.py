"""`bench ...` (speed, bench/) and `eval ...` (quality, the services' offline tools).

Each prints one JSON object with --json, a readable listing of the same figures without."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from intentroute.cli.apps import bench_app, emit, eval_app, settings
from services.classifier.clarity import DECIDE_THRESHOLD

JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON object on stdout")]


@bench_app.command("pipeline")
def bench_pipeline(
    json_out: JsonFlag = False,
    requests: Annotated[int, typer.Option(help="Sequential requests for latency")] = 400,
    load: Annotated[int, typer.Option(help="Requests for the throughput run")] = 3000,
    models: Annotated[
        bool, typer.Option(help="Layer-2 classifier and hybrid retrieval instead of rules/BM25")
    ] = False,
    no_auth: Annotated[
        bool, typer.Option("--no-auth", help="An open server: no credentials, no permissions")
    ] = False,
) -> None:
    """End-to-end latency and throughput with the echo generator, all workers here, with
    authentication and per-subject permissions on (as `intentroute up` runs them)."""
    from bench.pipeline import run

    emit(run(requests=requests, load=load, models=models, auth=not no_auth), json_out)


@bench_app.command("chaos")
def bench_chaos(
    json_out: JsonFlag = False,
    requests: Annotated[int, typer.Option(help="Requests of all four types")] = 1000,
    rate: Annotated[float, typer.Option(help="Requests per second")] = 40.0,
    deadline: Annotated[float, typer.Option(help="Each request's deadline, seconds")] = 60.0,
) -> None:
    """Kill a replica of every worker type, restart nats-server and Postgres under load:
    lost, duplicated and error answers, failover and stall times, missing rows."""
    from bench.chaos import run

    emit(run(requests=requests, rate=rate, deadline=deadline), json_out)


@bench_app.command("classifier")
def bench_classifier(
    json_out: JsonFlag = False,
    total: Annotated[int, typer.Option(help="Requests through the worker")] = 2000,
    concurrency: Annotated[int, typer.Option(help="Requests in flight")] = 64,
) -> None:
    """Layer 1 decisions/s, Layer 2 p50, worker decisions/s at 64 in flight."""
    from bench.classifier import run

    emit(run(total=total, concurrency=concurrency), json_out)


@bench_app.command("validator")
def bench_validator(json_out: JsonFlag = False) -> None:
    """Parser p50 on a 50-line program and the OPEN-breaker path."""
    from bench.validator import run

    emit(run(), json_out)


@eval_app.command("routing")
def eval_routing(
    file: Annotated[Path, typer.Argument(help="JSONL: query, expected, history, ...")],
    json_out: JsonFlag = False,
    predictions: Annotated[Path | None, typer.Option(help="Write one line per input")] = None,
    threshold: Annotated[
        float, typer.Option(help="Layer 2 decision threshold")] = DECIDE_THRESHOLD,
) -> None:
    """Each line through the real cascade (rules, embedding head, LLM when configured)."""
    from services.classifier.offline.routing_eval import run_eval_routing
    from services.classifier.settings import ClassifierSettings

    report = run_eval_routing(file, ClassifierSettings.from_env(), threshold=threshold,
                              predictions_out=predictions)
    emit(report, json_out)


@eval_app.command("intents")
def eval_intents(
    train: Annotated[Path, typer.Option(help="CSV text,category or JSONL text,label")],
    test: Annotated[Path, typer.Option(help="Same formats; `oos` lines count as out-of-scope")],
    json_out: JsonFlag = False,
    threshold: Annotated[
        float, typer.Option(help="Clarity threshold = OOS decision")] = DECIDE_THRESHOLD,
    finetune_epochs: Annotated[int, typer.Option(help="Fine-tune the encoder first")] = 0,
    embed_cache: Annotated[Path | None, typer.Option(
        help="Directory caching the frozen encoder's vectors between runs")] = None,
) -> None:
    """Train the Layer-2 classifier on any intent dataset and score it."""
    from services.classifier.offline.intents_eval import eval_intents as run_eval

    emit(run_eval(train, test, threshold=threshold, finetune_epochs=finetune_epochs,
                  embed_cache=embed_cache, onnx_cache_dir=settings().common.onnx_cache_dir),
         json_out)


@eval_app.command("retrieval")
def eval_retrieval(
    corpus: Annotated[Path, typer.Option(help="BEIR corpus.jsonl")],
    queries: Annotated[Path, typer.Option(help="BEIR queries.jsonl")],
    qrels: Annotated[Path, typer.Option(help="qrels TSV with header")],
    method: Annotated[str, typer.Option(help="bm25 | dense | hybrid | all")] = "all",
    json_out: JsonFlag = False,
    index_dir: Annotated[Path | None, typer.Option(help="Reuse/keep the index here")] = None,
) -> None:
    """nDCG@10, Recall@10, MRR@10 per method, ingest speed and hybrid query latency."""
    from intentroute.cli.apps import settings
    from services.retriever.offline.evaluation import evaluate
    from shared.embeddings import pin_threads
    from shared.fast_encoder import batch_fast_encoder

    common = settings().common
    methods = ["bm25", "dense", "hybrid"] if method == "all" else [method]
    pin_threads(1)  # queries are timed on one thread; pinned before any encoder is built
    ingest_encoder = batch_fast_encoder(precision=common.ingest_precision,
                                        onnx_cache_dir=common.onnx_cache_dir)
    emit(evaluate(corpus, queries, qrels, methods, index_dir=index_dir,
                  ingest_encoder=ingest_encoder), json_out)
