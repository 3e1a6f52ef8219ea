"""`intentroute bench ...`: the speed benchmarks, added to the CLI by the
`intentroute.commands` entry point `bench` (tools/pyproject.toml; the CLI never imports
this module).

Each prints one JSON object with --json, a readable listing of the same figures without.
Each command imports its benchmark when run, so loading the commands costs nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from intentroute.cli.apps import emit, settings, stack_errors

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks (JSON with --json).")

JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON object on stdout")]
NatsClusterOption = Annotated[int, typer.Option(
    "--nats-cluster", help="NATS nodes: 1, or a cluster of 3 with streams replicated 3 times")]


def register(app: typer.Typer) -> None:
    """The `intentroute.commands` entry point: `bench` and its commands on `app`."""
    app.add_typer(bench_app, name="bench")


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
    fleet: Annotated[
        int, typer.Option(help="The generators' model servers: 0 the instant echo "
                               "backend; 1 a declared OpenAI-compatible backend (the fake "
                               "provider, instant answers); 2 two, each agent's chain "
                               "across both, the first answering (fleet_backends)")
    ] = 0,
) -> None:
    """End-to-end latency and throughput with the echo generator (or a declared fleet,
    --fleet), all workers here, with authentication and per-subject permissions on and
    durable servers (as `intentroute up` runs them; NATS_SYNC_INTERVAL applies),
    per-agent accounting on unless --no-accounting, per-agent limits off as shipped
    unless --limits (configured, not reached)."""
    from bench.pipeline import run

    if door not in ("nats", "openai"):
        raise typer.BadParameter("`nats` or `openai`", param_hint="--door")
    if fleet not in (0, 1, 2):
        raise typer.BadParameter("0 (echo), 1 or 2 backends", param_hint="--fleet")
    emit(run(requests=requests, load=load, models=models, auth=not no_auth,
             accounting=not no_accounting, limits=limits, nats_cluster=nats_cluster,
             sync_interval=settings().nats_sync_interval, door=door, fleet=fleet), json_out)


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


@bench_app.command("pg-pause")
def bench_pg_pause(
    json_out: JsonFlag = False,
    sessions: Annotated[int, typer.Option(
        help="Returning sessions 4 agents ask over (1,000 requests in 60 s); 0: RETRIEVAL "
             "questions on new sessions, 10/s")] = 50,
    pause: Annotated[float, typer.Option(help="Seconds Postgres stays SIGSTOPped")] = 20.0,
) -> None:
    """Postgres SIGSTOPped under load on a stack of its own (the `postgres_pause_20s`
    scenario of `bench chaos`): gap_s (the longest time without an answer), stall_s,
    lost and duplicate finals, history_unavailable decisions, rows missing afterwards."""
    from bench.pg_pause import run

    with stack_errors():
        report = run(pause=pause, sessions=sessions)
    emit(report, json_out)


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
    flooders: Annotated[int, typer.Option(
        help="Agents flooding at once after A's flood, up to 5 (0: no five-flooder "
             "phase)")] = 5,
    flooder_requests: Annotated[int, typer.Option(
        help="RETRIEVAL requests each of them publishes at once")] = 1000,
    ask_every: Annotated[float, typer.Option(
        help="Seconds between B's (and C's) questions: 0.25 gives four times the samples "
             "behind each p95")] = 1.0,
) -> None:
    """Two gateway replicas with authentication on: agent A floods RETRIEVAL requests
    while B and C ask one a second; their latency during the flood against before it,
    A's answered / refused requests (by code: its budget refuses the end of the flood),
    lost and duplicated answers, and A's spend past its budget with the bound; then
    agent D aims reply subjects at B and C (`injector`: their latency, and what reached
    their request log and answer subjects that they did not cause); before it five
    agents flood at once (`five_flooders`: B's and C's latency then)."""
    from bench.fairness import BUDGET_DAY, run

    env = {} if backlog is None else {"GATEWAY_PIPELINE_BACKLOG": str(backlog)}
    budget = BUDGET_DAY if budget_day is None else (budget_day or None)
    emit(run(flood=flood, quiet=quiet, deadline=deadline, env=env, budget_day=budget,
             injector=injector, flooders=flooders, flooder_requests=flooder_requests,
             ask_every=ask_every),
         json_out)


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
    with stack_errors():
        report = run(requests=requests, model=model, threads=threads, answers_out=answers)
    emit(report, json_out)


@bench_app.command("cache")
def bench_cache(
    json_out: JsonFlag = False,
    agents: Annotated[int, typer.Option(help="Agents asking (each its own entries)")] = 3,
    rounds: Annotated[int, typer.Option(help="Times each question and its paraphrases "
                                             "are asked per agent")] = 2,
    batch_wait_ms: Annotated[float | None, typer.Option(
        help="The classifier's CLASSIFIER_MICRO_BATCH_WAIT_MS (default: as shipped, 2)")] = None,
) -> None:
    """A replay on a real stack (embedded NATS and Postgres, every stage worker, extractive
    answers): documentation and code questions with their paraphrases and hard
    negatives, asked by several agents, a document changed and ingested mid-run.
    hit_rate (paraphrases), false_hit_rate (hard negatives), cross_agent_hits,
    stale_hits_after_ingest, hit_p50_ms, miss_overhead_ms, tokens_saved."""
    from bench.cache import run

    with stack_errors():
        report = run(agents=agents, rounds=rounds, batch_wait_ms=batch_wait_ms)
    emit(report, json_out)


@bench_app.command("parts")
def bench_parts(
    json_out: JsonFlag = False,
    rounds: Annotated[int, typer.Option(help="Measured rounds (each asks all three "
                                             "messages, in turn first)")] = 30,
    warmup: Annotated[int, typer.Option(help="Rounds before, not counted")] = 3,
    echo_delay: Annotated[float, typer.Option(
        help="Seconds the echo generator spreads an answer's four pieces over")] = 0.04,
) -> None:
    """Issue 34 on a real stack (embedded NATS and Postgres, every stage worker, Layer 2,
    the echo generator streaming): the p50 time to the first answer text of a RETRIEVAL
    question alone and of two- and three-part messages that start with it, interleaved
    round by round; single_first_text_ms_p50, two_/three_first_text_ms_p50, their ratios
    to the single one (bound 1.2), first markers and finals by kind."""
    from bench.parts import run

    with stack_errors():
        report = run(rounds=rounds, warmup=warmup, echo_delay=echo_delay)
    emit(report, json_out)
