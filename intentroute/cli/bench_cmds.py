"""`bench ...` (speed, bench/) and `eval ...` (quality, the services' offline tools).

Each prints one JSON object with --json, a readable listing of the same figures without."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from intentroute.cli.apps import bench_app, emit, eval_app, settings
from shared.policy.clarity import DECIDE_THRESHOLD

JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON object on stdout")]
NatsClusterOption = Annotated[int, typer.Option(
    "--nats-cluster", help="NATS nodes: 1, or a cluster of 3 with streams replicated 3 times")]


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
    no_accounting: Annotated[
        bool, typer.Option("--no-accounting", help="Workers with ACCOUNTING=off, to measure "
                                                   "what per-agent accounting costs")
    ] = False,
    limits: Annotated[
        bool, typer.Option("--limits/--no-limits",
                           help="Every per-agent limit configured far above the load "
                                "(LIMIT_*), to measure what checking them costs; off by "
                                "default, as shipped")
    ] = False,
    nats_cluster: NatsClusterOption = 1,
    door: Annotated[
        str, typer.Option(help="`openai`: also the OpenAI-compatible door against the NATS "
                               "door, same run (door_ms: a door's own time per request)")
    ] = "nats",
) -> None:
    """End-to-end latency and throughput with the echo generator, all workers here, with
    authentication and per-subject permissions on and durable servers (as `intentroute
    up` runs them; NATS_SYNC_INTERVAL applies), per-agent accounting on unless
    --no-accounting, per-agent limits off as shipped unless --limits (configured, not
    reached)."""
    from bench.pipeline import run

    if door not in ("nats", "openai"):
        raise typer.BadParameter("`nats` or `openai`", param_hint="--door")
    emit(run(requests=requests, load=load, models=models, auth=not no_auth,
             accounting=not no_accounting, limits=limits, nats_cluster=nats_cluster,
             sync_interval=settings().nats_sync_interval, door=door), json_out)


@bench_app.command("accounting")
def bench_accounting(
    json_out: JsonFlag = False,
    rows: Annotated[int, typer.Option(help="Request-log rows")] = 1_000_000,
    agents: Annotated[int, typer.Option(help="Agents they belong to")] = 50,
    days: Annotated[int, typer.Option(help="UTC days they span, ending today")] = 30,
) -> None:
    """Daily rollups over the whole request log, one day, the cost and SLO reports and
    a retention pass, on an embedded Postgres."""
    from bench.accounting import run

    emit(run(rows=rows, agents=agents, days=days), json_out)


@bench_app.command("chaos")
def bench_chaos(
    json_out: JsonFlag = False,
    requests: Annotated[int, typer.Option(help="Requests of all four types")] = 1000,
    rate: Annotated[float, typer.Option(help="Requests per second")] = 40.0,
    deadline: Annotated[float, typer.Option(help="Each request's deadline, seconds")] = 60.0,
    nats_cluster: NatsClusterOption = 1,
) -> None:
    """Kill a replica of every worker type, restart nats-server and Postgres under load
    (with `--nats-cluster 3`, also kill -9 one NATS node): lost, duplicated and error
    answers, failover and stall times, missing rows."""
    from bench.chaos import run

    if nats_cluster not in (1, 3):
        raise typer.BadParameter("1 or 3", param_hint="--nats-cluster")
    emit(run(requests=requests, rate=rate, deadline=deadline, nats_cluster=nats_cluster,
             sync_interval=settings().nats_sync_interval), json_out)


@bench_app.command("fairness")
def bench_fairness(
    json_out: JsonFlag = False,
    flood: Annotated[int, typer.Option(help="RETRIEVAL requests agent A publishes at once")
                     ] = 5000,
    quiet: Annotated[float, typer.Option(help="Seconds B and C ask alone first")] = 8.0,
    deadline: Annotated[float, typer.Option(help="Seconds the flood may take")] = 300.0,
    backlog: Annotated[int | None, typer.Option(
        help="GATEWAY_PIPELINE_BACKLOG for the run (default: the setting's)")] = None,
    budget_day: Annotated[float | None, typer.Option(
        help="Agent A's daily budget in cost units, one per millisecond of generation "
             "(default: bench.fairness.BUDGET_DAY); 0: none")] = None,
    injector: Annotated[int, typer.Option(
        help="Messages agent D sends with reply subjects aimed at B and C after the "
             "flood (0: no injector phase)")] = 2000,
) -> None:
    """Two gateway replicas with authentication on: agent A floods RETRIEVAL requests
    while B and C ask one a second; their latency during the flood against before it,
    A's answered / refused requests (by code: its budget refuses the end of the flood),
    lost and duplicated answers, and A's spend past its budget with the bound; then
    agent D aims reply subjects at B and C (`injector`: their latency, and what reached
    their request log and answer subjects that they did not cause)."""
    from bench.fairness import BUDGET_DAY, run

    env = {} if backlog is None else {"GATEWAY_PIPELINE_BACKLOG": str(backlog)}
    budget = BUDGET_DAY if budget_day is None else (budget_day or None)
    emit(run(flood=flood, quiet=quiet, deadline=deadline, env=env, budget_day=budget,
             injector=injector), json_out)


@bench_app.command("failover")
def bench_failover(
    json_out: JsonFlag = False,
    requests: Annotated[int, typer.Option(help="Requests per fault")] = 20,
    concurrency: Annotated[int, typer.Option(help="Requests in flight at once")] = 4,
    deadline: Annotated[float, typer.Option(
        help="Each request's deadline, seconds (no final by then: hung)")] = 30.0,
    outage: Annotated[float, typer.Option(help="Seconds the flapping model is down")] = 10.0,
    fallback_prefill: Annotated[bool, typer.Option(
        "--fallback-prefill/--no-fallback-prefill",
        help="The healthy fallback continues a cut answer (else restarts it)")] = True,
) -> None:
    """Every way a model server fails (the fault-injecting provider), through a real
    stack with two generator replicas: per fault, answers rescued, clean errors,
    truncated successes (must be 0), hung requests (must be 0), attempts on the failing
    model, wall time p95, the widest gap in a stream; for the flapping model, answers
    served during its outage and the seconds until the primary answers again."""
    from bench.failover import run

    emit(run(requests=requests, concurrency=concurrency, deadline=deadline, outage=outage,
             fallback_prefill=fallback_prefill), json_out)


@bench_app.command("scaling")
def bench_scaling(
    json_out: JsonFlag = False,
    stage: Annotated[str, typer.Option(help="classifier | retriever")] = "classifier",
    replicas: Annotated[str, typer.Option(help="Replica counts, comma-separated")] = "1,2,4",
    repeats: Annotated[int, typer.Option(help="Runs per replica count (median quoted)")] = 3,
    window: Annotated[float, typer.Option(help="Seconds measured per run")] = 8.0,
    models: Annotated[
        bool, typer.Option(help="Production models (Layer 2, hybrid) or rules/BM25")] = True,
) -> None:
    """Messages/s through one stage with N replicas each fed a standing backlog (the
    median of `repeats` runs per count), and where the curve flattens."""
    from bench.scaling import run

    counts = tuple(int(n) for n in replicas.split(",") if n.strip())
    emit(run(stage, counts, repeats, window=window, models=models), json_out)


@bench_app.command("fuzz")
def bench_fuzz(
    json_out: JsonFlag = False,
    examples: Annotated[int, typer.Option(help="Generated examples per target")] = 10_000,
    seed: Annotated[int, typer.Option(help="Hypothesis seed (a run is reproducible)")] = 0,
    target: Annotated[list[str] | None, typer.Option(
        help="Only this target (repeatable): decode.request, gateway, classify, ...")] = None,
) -> None:
    """Property-based fuzzing of every subject's decoder and every stage handler (hostile
    bytes and values, dropped connections): per target, examples run and how many
    crashed, went unanswered (or were answered more than once) or got an untyped error.
    What was found is described on stderr."""
    try:
        from bench.fuzzing.runner import run
    except ImportError as exc:  # hypothesis is a dev dependency
        typer.echo(f"bench fuzz needs the dev extra (pip install -e '.[dev]'): {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        report = run(examples=examples, seed=seed, only=target)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--target") from None
    emit(report, json_out)


@bench_app.command("classifier")
def bench_classifier(
    json_out: JsonFlag = False,
    total: Annotated[int, typer.Option(help="Requests through the worker")] = 2000,
    concurrency: Annotated[int, typer.Option(help="Requests in flight")] = 64,
) -> None:
    """Layer 1 decisions/s, Layer 2 p50, worker decisions/s at 64 in flight."""
    from bench.classifier import run

    emit(run(total=total, concurrency=concurrency), json_out)


@bench_app.command("learning")
def bench_learning(
    json_out: JsonFlag = False,
    rows: Annotated[int, typer.Option(help="Logged requests to seed (30 days)")] = 1_000_000,
    agents: Annotated[int, typer.Option(help="Agents they come from")] = 50,
) -> None:
    """The learning job over a month of logged traffic on a fresh embedded Postgres
    (learn_1m_rows_s, per phase); feedback_to_score_s and dashboard_load_ms from their
    parts' hooks (null until wired)."""
    from bench.learning import run

    emit(run(rows=rows, agents=agents), json_out)
@bench_app.command("feedback")
def bench_feedback(
    json_out: JsonFlag = False,
    samples: Annotated[int, typer.Option(help="Feedback messages timed")] = 10,
    score_refresh: Annotated[
        float | None, typer.Option(help="The gateway's SCORE_REFRESH (default: its own)")
    ] = None,
) -> None:
    """Seconds from an agent's HTTP feedback to its updated row in agent_scores."""
    from bench.feedback import run

    emit(run(samples=samples, score_refresh=score_refresh), json_out)


@bench_app.command("validator")
def bench_validator(json_out: JsonFlag = False) -> None:
    """Parser p50 on a 50-line program and the OPEN-breaker path."""
    from bench.validator import run

    emit(run(), json_out)


@bench_app.command("dashboard")
def bench_dashboard(
    json_out: JsonFlag = False,
    agents: Annotated[int, typer.Option(help="Agents with data")] = 50,
    days: Annotated[int, typer.Option(help="Days shown (the page's window)")] = 30,
    loads: Annotated[int, typer.Option(help="Page loads timed (median)")] = 7,
    today_rows: Annotated[int, typer.Option(
        help="Request-log rows of today, read live by every load (0: none)")] = 33_000,
) -> None:
    """Dashboard page load (headless Chromium when found, else HTTP) with a month of
    rollups and feedback for 50 agents, and today's request log, on an embedded
    Postgres."""
    from bench.dashboard import run

    emit(run(agents=agents, days=days, loads=loads, today_rows=today_rows), json_out)


@bench_app.command("codegen")
def bench_codegen(
    json_out: JsonFlag = False,
    requests: Annotated[int, typer.Option(help="CODE_GENERATION requests")] = 60,
    model: Annotated[str, typer.Option(
        help="Local model: smollm2-135m-instruct or gemma-3-270m")] = "smollm2-135m-instruct",
    threads: Annotated[int, typer.Option(
        help="CPU threads for the model (2 is faster on an idle machine only)")] = 1,
    answers: Annotated[Path | None, typer.Option(
        help="Write every attempt (answer, program, parser feedback) as JSON lines")] = None,
) -> None:
    """The trace-guided retry (RC-08) against a blind retry: N code requests through
    generate -> validate with the local model and the real parser service."""
    from bench.codegen import run

    if requests < 1:
        raise typer.BadParameter("at least 1", param_hint="--requests")
    with _stack_errors():
        report = run(requests=requests, model=model, threads=threads, answers_out=answers)
    emit(report, json_out)


@eval_app.command("routing")
def eval_routing(
    file: Annotated[Path, typer.Argument(help="JSONL: query, expected, history, ...")],
    json_out: JsonFlag = False,
    predictions: Annotated[Path | None, typer.Option(help="Write one line per input")] = None,
    threshold: Annotated[
        float, typer.Option(help="Layer 2 decision threshold")] = DECIDE_THRESHOLD,
    llm: Annotated[str | None, typer.Option(
        help="`local`: Layer 3 on the local model, served here for the run (default: "
             "the model server the environment names, if any)")] = None,
    llm_model: Annotated[str, typer.Option(
        help="With --llm local: smollm2-135m-instruct or gemma-3-270m")] = "",
) -> None:
    """Each line through the real cascade (rules, embedding head, LLM when configured);
    changes nothing (--predictions writes OUT)."""
    import os

    from intentroute.stack.llm import LOCAL_MODEL, local_server
    from services.classifier.offline.routing_eval import run_eval_routing
    from services.classifier.settings import ClassifierSettings

    if llm not in (None, "local"):
        raise typer.BadParameter("only `local` (the environment's model server: omit it)",
                                 param_hint="--llm")
    with _input_errors(), _stack_errors():
        if llm is None:
            report = run_eval_routing(file, ClassifierSettings.from_env(),
                                      threshold=threshold, predictions_out=predictions)
        else:
            model = llm_model or LOCAL_MODEL
            # One thread: on this 2-core machine under other load, a label took 0.6 s
            # with one and 13-26 s with two (llama.cpp's threads wait by spinning).
            with local_server(model, threads=1) as served:
                # The local server and no other: Ollama off, its model for Layer 3.
                environ = {**{k: v for k, v in os.environ.items() if k != "OLLAMA_HOST"},
                           **served, "CLASSIFIER_LLM_MODEL": model}
                report = run_eval_routing(file, ClassifierSettings.from_env(environ),
                                          threshold=threshold, predictions_out=predictions)
            report["layer3"]["model"] = model
    emit(report, json_out)


@contextmanager
def _stack_errors() -> Iterator[None]:
    """A local model that is not installed (or does not start) is one line on stderr
    and exit status 1."""
    from intentroute.stack import StackError

    try:
        yield
    except StackError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None


@eval_app.command("rules")
def eval_rules(
    files: Annotated[list[Path] | None, typer.Argument(
        help="JSONL paraphrase sets (query, expected, family, fires, history, ...); "
             "default: tests/data/rule_paraphrases.jsonl and rule_paraphrases_fresh.jsonl")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Each Layer 1 rule family's precision and coverage on paraphrase sets (no model);
    changes nothing."""
    from services.classifier.offline.rules_eval import run_eval_rules

    with _input_errors():
        report = run_eval_rules(*(files or [Path("tests/data/rule_paraphrases.jsonl"),
                                            Path("tests/data/rule_paraphrases_fresh.jsonl")]))
    if json_out:
        emit(report, json_out)
        return
    typer.echo(f"{'family':<16}{'precision':>10}{'decided':>9}{'coverage':>10}"
               f"{'positives':>11}  decision")
    for name, row in report["families"].items():
        precision = "-" if row["precision"] is None else f"{row['precision']:.4f}"
        coverage = "-" if row["coverage"] is None else f"{row['coverage']:.4f}"
        how = "final (1.0)" if row["final"] else f"prior ({row['confidence']})"
        typer.echo(f"{name:<16}{precision:>10}{row['decided']:>9}{coverage:>10}"
                   f"{row['positives']:>11}  {how}")
    for wrong in report["wrong"]:
        typer.echo(f"  wrong [{wrong['family']}] {wrong['id']}: {wrong['query']!r} -> "
                   f"{wrong['decided']} (expected {wrong['expected']})")


@contextmanager
def _input_errors() -> Iterator[None]:
    """A malformed evaluation input is one line on stderr (file:line: field: problem)
    and exit status 2; so is a packaged model that cannot be assembled (which chunk
    package is missing, and the pip command)."""
    from services.classifier.offline.inputs import InputError
    from shared.encoders.packaged import ModelAssemblyError

    try:
        yield
    except (InputError, ModelAssemblyError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


@eval_app.command("intents")
def eval_intents(
    train: Annotated[Path, typer.Option(help="CSV text,category or JSONL text,label")],
    test: Annotated[Path, typer.Option(help="Same formats; `oos` lines count as out-of-scope")],
    json_out: JsonFlag = False,
    threshold: Annotated[float | None, typer.Option(
        help="Out-of-scope threshold (default: none when the train file has `oos` "
             "lines, their share shifted to 10% of traffic; else the clarity threshold "
             "0.85)")] = None,
    finetune_epochs: Annotated[int, typer.Option(
        min=0, help="Fine-tune the head's own encoder first (no mixture)")] = 0,
    tune_epochs: Annotated[float | None, typer.Option(
        min=0, help="Epochs of the fine-tuned MiniLM mixed in (0: none; default 4)")] = None,
    embed_cache: Annotated[Path | None, typer.Option(
        help="Directory caching the frozen encoder's vectors between runs")] = None,
    encoder: Annotated[list[str] | None, typer.Option(
        help="Encoder (repeatable: side by side; default: all-MiniLM-L6-v2 and "
             "all-mpnet-base-v2)")] = None,
) -> None:
    """Train the Layer-2 classifier on any intent dataset and score it; the head it trains
    is not kept (the running one is unchanged)."""
    from services.classifier.offline.intents_eval import INTENT_ENCODERS
    from services.classifier.offline.intents_eval import eval_intents as run_eval
    from services.classifier.offline.mixture import TUNE_EPOCHS

    with _input_errors():
        report = run_eval(train, test, threshold=threshold, finetune_epochs=finetune_epochs,
                          tune_epochs=TUNE_EPOCHS if tune_epochs is None else tune_epochs,
                          embed_cache=embed_cache, encoders=tuple(encoder or INTENT_ENCODERS),
                          onnx_cache_dir=settings().common.onnx_cache_dir)
    emit(report, json_out)


@eval_app.command("retrieval")
def eval_retrieval(
    corpus: Annotated[Path, typer.Option(help="BEIR corpus.jsonl")],
    queries: Annotated[Path, typer.Option(help="BEIR queries.jsonl")],
    qrels: Annotated[Path, typer.Option(help="qrels TSV with header")],
    method: Annotated[str, typer.Option(
        help="bm25 | dense | hybrid | rrf (the hybrid with plain RRF) | all")] = "all",
    json_out: JsonFlag = False,
    index_dir: Annotated[Path | None, typer.Option(help="Reuse/keep the index here")] = None,
) -> None:
    """nDCG@10, Recall@10, MRR@10 per method, ingest speed and hybrid query latency; the
    corpus is indexed apart (--index-dir, else a cache folder), the stack's index stays.
    The hybrid fuses as the retriever's settings say (RETRIEVER_FUSION, ...)."""
    from intentroute.cli.apps import settings
    from services.retriever.offline.evaluation import evaluate
    from services.retriever.settings import RetrieverSettings
    from shared.encoders.embeddings import pin_threads
    from shared.encoders.fast import batch_fast_encoder

    common = settings().common
    methods = ["bm25", "dense", "hybrid", "rrf"] if method == "all" else [method]
    if not set(methods) <= {"bm25", "dense", "hybrid", "rrf"}:
        raise typer.BadParameter("bm25, dense, hybrid, rrf or all", param_hint="--method")
    fusion = RetrieverSettings.from_env().fusion
    pin_threads(1)  # queries are timed on one thread; pinned before any encoder is built
    ingest_encoder = batch_fast_encoder(precision=common.ingest_precision,
                                        onnx_cache_dir=common.onnx_cache_dir)
    emit(evaluate(corpus, queries, qrels, methods, index_dir=index_dir,
                  ingest_encoder=ingest_encoder, fusion=fusion), json_out)
