"""`intentroute` command line: run the stack, one worker, ask, ingest, benchmarks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated

import typer

from intentroute.stack import StackInfo, embedded_stack, read_state, write_state
from intentroute.workers import WORKERS, wait_for_consumers

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks (JSON on stdout).")
app.add_typer(bench_app, name="bench")
eval_app = typer.Typer(no_args_is_help=True, help="Evaluations (JSON on stdout).")
app.add_typer(eval_app, name="eval")

STATE_DIR = Path(os.environ.get("INTENTROUTE_HOME", ".intentroute"))
DEMO_KB = Path(__file__).resolve().parent.parent / "kb" / "avap"

SAMPLE_QUESTIONS: list[dict[str, str]] = [
    {"query": "What does addParam do in AVAP and in which order does it search the request?"},
    {"query": "Write an AVAP endpoint that reads userId from the request and returns it"},
    {"query": "en menos palabras"},
    {
        "query": "You have a project usage percentage of 20%. Provide an insight in 2 sentences.",
        "extra_context": "project=demo usage_percentage=20 plan=starter monthly_calls=2000 "
        "calls_used=400",
    },
]


def _urls() -> tuple[str, str]:
    """NATS / Postgres URLs from the environment, else from a running `intentroute up`."""
    nats_url = os.environ.get("NATS_URL", "")
    db_url = os.environ.get("DATABASE_URL", "")
    if not (nats_url and db_url):
        state = read_state(STATE_DIR)
        if state:
            nats_url = nats_url or state.nats_url
            db_url = db_url or state.database_url
    return nats_url, db_url


def _parse_replicas(spec: list[str]) -> dict[str, int]:
    counts = {name: 1 for name in WORKERS}
    for item in spec:
        for part in item.split(","):
            if not part.strip():
                continue
            name, _, value = part.partition("=")
            if name.strip() not in counts:
                raise typer.BadParameter(f"unknown worker {name!r}; known: {', '.join(WORKERS)}")
            counts[name.strip()] = int(value)
    return counts


@app.command()
def up(
    replicas: Annotated[
        list[str],
        typer.Option(help="Replicas per worker, e.g. --replicas classifier=2,generator-main=2"),
    ] = [],  # noqa: B006
    ingest_path: Annotated[
        Path | None, typer.Option("--ingest", help="Knowledge base to ingest before starting")
    ] = None,
    demo: Annotated[bool, typer.Option(help="Ask one sample question per type")] = False,
    exit_after_demo: Annotated[bool, typer.Option(help="Stop after the demo")] = False,
) -> None:
    """Start the embedded stack if needed, migrate, and run every worker."""
    counts = _parse_replicas(replicas)
    nats_env, db_env = os.environ.get("NATS_URL", ""), os.environ.get("DATABASE_URL", "")
    with embedded_stack(STATE_DIR, nats_url=nats_env, database_url=db_env) as (nats_url, db_url):
        from shared.store import migrate

        migrate(db_url)
        asyncio.run(_declare_streams(nats_url))
        env = dict(os.environ, NATS_URL=nats_url, DATABASE_URL=db_url)
        index_dir = Path(env.setdefault("INDEX_DIR", str(STATE_DIR / "index")))
        kb = ingest_path or (DEMO_KB if not (index_dir / "CURRENT").exists() else None)
        if kb is not None:
            _ingest(kb, index_dir)
        extra_procs = _start_parser(env)
        procs: list[subprocess.Popen[bytes]] = list(extra_procs)
        for name, count in counts.items():
            for _ in range(count):
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "intentroute.cli", "worker", name], env=env
                ))
        write_state(STATE_DIR, StackInfo(nats_url=nats_url, database_url=db_url,
                                         parser_url=env.get("AVAP_PARSER_URL", ""),
                                         pid=os.getpid()))
        typer.echo(f"intentroute up: NATS {nats_url}  Postgres {db_url}  "
                   f"workers {', '.join(f'{n}x{c}' for n, c in counts.items())}", err=True)
        stop = {"flag": False}

        def _stop(*_: object) -> None:
            stop["flag"] = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        try:
            if demo:
                asyncio.run(_demo(nats_url))
                if exit_after_demo:
                    stop["flag"] = True
            while not stop["flag"]:
                dead = [p for p in procs if p.poll() is not None]
                if dead:
                    typer.echo(f"a worker exited with {dead[0].returncode}; stopping", err=True)
                    raise typer.Exit(1)
                time.sleep(0.5)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
            (STATE_DIR / "stack.json").unlink(missing_ok=True)


def _start_parser(env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    """The reference AVAP parser service, unless AVAP_PARSER_URL points elsewhere."""
    if env.get("AVAP_PARSER_URL") or env.get("AVAP_PARSER_TIMEOUT", "").strip() in ("0", "0.0"):
        return []
    try:
        import services.parser.server  # noqa: F401
    except ImportError:
        return []
    from intentroute.stack import free_port

    port = free_port()
    env["AVAP_PARSER_URL"] = f"127.0.0.1:{port}"
    return [subprocess.Popen(
        [sys.executable, "-m", "intentroute.cli", "parser", "--port", str(port)], env=env
    )]


async def _declare_streams(nats_url: str) -> None:
    import nats

    from shared.bus import ensure_streams
    from shared.settings import CommonSettings

    nc = await nats.connect(nats_url)
    try:
        await ensure_streams(nc.jetstream(), CommonSettings.from_env().response_ttl)
    finally:
        await nc.drain()


async def _demo(nats_url: str) -> None:
    import nats

    nc = await nats.connect(nats_url)
    session = f"demo-{uuid.uuid4().hex[:8]}"
    try:
        typer.echo("waiting for the workers...", err=True)
        await wait_for_consumers(nc, list(WORKERS))
        for sample in SAMPLE_QUESTIONS:
            typer.secho(f"\n> {sample['query']}", bold=True)
            await _ask(nc, agent="demo", session=session, json_lines=False,
                       extra_context=sample.get("extra_context", ""), query=sample["query"])
    finally:
        await nc.drain()


@app.command()
def worker(name: Annotated[str, typer.Argument(help=f"One of: {', '.join(WORKERS)}")]) -> None:
    """Run one worker (for ops: scale a stage by running more of these)."""
    nats_url, db_url = _urls()
    if nats_url:
        os.environ["NATS_URL"] = nats_url
    if db_url:
        os.environ["DATABASE_URL"] = db_url
    from intentroute.workers import create_worker

    worker_app = create_worker(name)
    import uvloop

    uvloop.run(worker_app.run())


@app.command()
def ask(
    query: Annotated[str, typer.Argument(help="The question")],
    session: Annotated[str, typer.Option(help="Session id")] = "cli",
    agent: Annotated[str, typer.Option(help="Agent (caller) id")] = "cli",
    extra_context: Annotated[str, typer.Option(help="Platform data for PLATFORM")] = "",
    editor: Annotated[Path | None, typer.Option(help="File whose text is editor_context")] = None,
    query_type: Annotated[str, typer.Option(help="Caller-declared type")] = "",
    json_lines: Annotated[bool, typer.Option("--json", help="One JSON line per chunk")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the answer")] = 120.0,
) -> None:
    """Publish a question on NATS and print the answer as it streams."""
    nats_url, _ = _urls()
    if not nats_url:
        typer.echo("no NATS_URL and no running `intentroute up`", err=True)
        raise typer.Exit(2)

    async def run() -> int:
        import nats

        nc = await nats.connect(nats_url)
        try:
            return await _ask(
                nc, agent=agent, session=session, query=query, json_lines=json_lines,
                extra_context=extra_context, query_type=query_type or None, timeout=timeout,
                editor_context=editor.read_text(encoding="utf-8") if editor else "",
            )
        finally:
            await nc.drain()

    raise typer.Exit(asyncio.run(run()))


async def _ask(
    nc: object,
    *,
    agent: str,
    session: str,
    query: str,
    json_lines: bool,
    extra_context: str = "",
    editor_context: str = "",
    query_type: str | None = None,
    timeout: float = 120.0,
) -> int:
    import msgspec

    from shared.client import ask as ask_stream
    from shared.contracts.request import AgentRequest
    from shared.contracts.response import ChunkKind

    req = AgentRequest(
        request_id=uuid.uuid4().hex, session_id=session, agent_id=agent, query=query,
        query_type=query_type, extra_context=extra_context, editor_context=editor_context,
    )
    code = 0
    async for chunk in ask_stream(nc, req, timeout=timeout):  # type: ignore[arg-type]
        if json_lines:
            typer.echo(msgspec.json.encode(chunk).decode())
            continue
        if chunk.kind == ChunkKind.STATUS:
            typer.secho(f"[{chunk.text}]", dim=True, err=True)
        elif chunk.kind == ChunkKind.RESET:
            typer.secho("\n[answer restarted]", dim=True, err=True)
        elif chunk.text:
            typer.echo(chunk.text, nl=False)
        if chunk.is_final:
            typer.echo("")
            if chunk.error:
                typer.secho(f"error {chunk.error.code}: {chunk.error.message}", fg="red",
                            err=True)
                code = 1
            dec = chunk.decision
            info = f"type={chunk.query_type}"
            if dec:
                info += f" layer={dec.layer} confidence={dec.confidence:.2f} slot={dec.model_slot}"
            if chunk.answered_by:
                info += f" by={chunk.answered_by}"
            if chunk.avap_code or chunk.validation_status:
                info += f" validation={chunk.validation_status or 'VALID'}"
            typer.secho(f"[{info}]", dim=True, err=True)
    return code


@app.command()
def ingest(
    path: Annotated[Path, typer.Argument(help="Markdown/text file or folder, or corpus.jsonl")],
    index_dir: Annotated[Path | None, typer.Option(help="Index directory")] = None,
) -> None:
    """Ingest documents into the embedded index (idempotent)."""
    target = index_dir or Path(os.environ.get("INDEX_DIR", str(STATE_DIR / "index")))
    _ingest(path, target)


def _ingest(path: Path, index_dir: Path) -> None:
    from services.retriever.index import ingest as run_ingest
    from shared.embeddings import pin_threads
    from shared.fast_encoder import batch_fast_encoder

    pin_threads(2)
    # Same vectors as sentence-transformers (cosine >= 0.9999), ~2x the chunks/s.
    encoder = batch_fast_encoder(os.environ.get("EMBEDDING_MODEL", "all-MiniLM-L6-v2"))
    es_url = os.environ.get("ES_URL", "")
    if es_url:
        # The retriever reads Elasticsearch when ES_URL is set: fill that index instead.
        asyncio.run(_ingest_es(path, es_url, encoder))
        return
    # Length-sorted batches; the encoder runs them in chunks of <= 8 (fastest here).
    report = run_ingest(path, index_dir, encoder, progress=True, batch_size=16)
    typer.echo(json.dumps({"index_dir": str(index_dir), **_as_dict(report)}), err=True)


async def _ingest_es(path: Path, es_url: str, encoder: object) -> None:
    from services.retriever.es_backend import ElasticsearchBackend

    backend = ElasticsearchBackend.from_url(
        es_url, encoder, index=os.environ.get("ES_INDEX", "intentroute-kb")  # type: ignore[arg-type]
    )
    try:
        report = await backend.ingest(path, progress=True, batch_size=16)
        typer.echo(json.dumps({"es_url": es_url, **_as_dict(report)}), err=True)
    finally:
        await backend.close()


def _as_dict(obj: object) -> dict[str, object]:
    import msgspec

    return msgspec.to_builtins(obj) if not isinstance(obj, dict) else obj  # type: ignore[no-any-return]


@app.command()
def migrate() -> None:
    """Apply the Alembic migrations to DATABASE_URL."""
    _, db_url = _urls()
    if not db_url:
        typer.echo("DATABASE_URL is not set", err=True)
        raise typer.Exit(2)
    from shared.store import migrate as run_migrate

    run_migrate(db_url)


@bench_app.command("pipeline")
def bench_pipeline(
    json_out: Annotated[bool, typer.Option("--json")] = True,
    requests: Annotated[int, typer.Option(help="Sequential requests for latency")] = 400,
    load: Annotated[int, typer.Option(help="Requests for the throughput run")] = 3000,
    models: Annotated[
        bool, typer.Option(help="Layer-2 classifier and hybrid retrieval instead of rules/BM25")
    ] = False,
) -> None:
    """End-to-end latency and throughput with the echo generator, all workers here."""
    from bench.pipeline import run

    typer.echo(json.dumps(run(requests=requests, load=load, models=models)))


@bench_app.command("classifier")
def bench_classifier(
    json_out: Annotated[bool, typer.Option("--json")] = True,
    total: Annotated[int, typer.Option(help="Requests through the worker")] = 2000,
    concurrency: Annotated[int, typer.Option(help="Requests in flight")] = 64,
) -> None:
    """Layer 1 decisions/s, Layer 2 p50, worker decisions/s at 64 in flight."""
    from bench.classifier import run

    typer.echo(json.dumps(run(total=total, concurrency=concurrency)))


@bench_app.command("validator")
def bench_validator(json_out: Annotated[bool, typer.Option("--json")] = True) -> None:
    """Parser p50 on a 50-line program and the OPEN-breaker path."""
    from bench.validator import run

    typer.echo(json.dumps(run()))


@eval_app.command("routing")
def eval_routing(
    file: Annotated[Path, typer.Argument(help="JSONL: query, expected, history, ...")],
    json_out: Annotated[bool, typer.Option("--json")] = True,
    predictions: Annotated[Path | None, typer.Option(help="Write one line per input")] = None,
    threshold: Annotated[float, typer.Option(help="Layer 2 decision threshold")] = 0.85,
) -> None:
    """Each line through the real cascade (rules, embedding head, LLM when configured)."""
    from services.classifier.routing_eval import run_eval_routing
    from services.classifier.settings import ClassifierSettings

    settings = ClassifierSettings.from_env()
    report = run_eval_routing(
        file, heads_dir=Path(settings.heads_dir), threshold=threshold,
        ollama_host=settings.ollama_host, llm_model=settings.llm_model,
        predictions_out=predictions,
    )
    typer.echo(json.dumps(report))


@eval_app.command("intents")
def eval_intents(
    train: Annotated[Path, typer.Option(help="CSV text,category or JSONL text,label")],
    test: Annotated[Path, typer.Option(help="Same formats; `oos` lines count as out-of-scope")],
    json_out: Annotated[bool, typer.Option("--json")] = True,
    threshold: Annotated[float, typer.Option(help="Clarity threshold = OOS decision")] = 0.85,
    finetune_epochs: Annotated[int, typer.Option(help="Fine-tune the encoder first")] = 0,
) -> None:
    """Train the Layer-2 classifier on any intent dataset and score it."""
    from services.classifier.evaluation import eval_intents as run_eval

    typer.echo(json.dumps(run_eval(train, test, threshold=threshold,
                                   finetune_epochs=finetune_epochs)))


@eval_app.command("retrieval")
def eval_retrieval(
    corpus: Annotated[Path, typer.Option(help="BEIR corpus.jsonl")],
    queries: Annotated[Path, typer.Option(help="BEIR queries.jsonl")],
    qrels: Annotated[Path, typer.Option(help="qrels TSV with header")],
    method: Annotated[str, typer.Option(help="bm25 | dense | hybrid | all")] = "all",
    json_out: Annotated[bool, typer.Option("--json")] = True,
    index_dir: Annotated[Path | None, typer.Option(help="Reuse/keep the index here")] = None,
) -> None:
    """nDCG@10, Recall@10, MRR@10 per method, ingest speed and hybrid query latency."""
    from bench.retrieval import evaluate

    methods = ["bm25", "dense", "hybrid"] if method == "all" else [method]
    typer.echo(json.dumps(evaluate(corpus, queries, qrels, methods, index_dir=index_dir)))


@app.command("export-history")
def export_history(
    out: Annotated[Path, typer.Option(help="JSONL file to write")] = Path("history.jsonl"),
    include_fallback: Annotated[
        bool, typer.Option(help="Also export guesses made without a confident layer")
    ] = False,
    min_confidence: Annotated[float, typer.Option(help="Skip decisions below this")] = 0.0,
) -> None:
    """classify_history -> labelled lines (topic, type, layer, confidence) for training."""
    _, db_url = _urls()
    if not db_url:
        typer.echo("DATABASE_URL is not set", err=True)
        raise typer.Exit(2)
    from shared.store.export import export_history as run_export

    count = asyncio.run(run_export(db_url, out, include_fallback=include_fallback,
                                   min_confidence=min_confidence))
    typer.echo(json.dumps({"written": count, "file": str(out)}))


@app.command("train-classifier")
def train_classifier(
    data: Annotated[list[Path], typer.Option(help="Labelled JSONL/CSV files (repeatable)")],
    heads_dir: Annotated[Path | None, typer.Option(help="Head registry")] = None,
    holdout: Annotated[float, typer.Option(help="Held-out share for shadow evaluation")] = 0.2,
    seed: Annotated[int, typer.Option()] = 0,
    early_exit_layers: Annotated[int | None, typer.Option(
        help="Also train an early-exit head on the encoder's first N layers "
             "(0: the embedding module alone; -1: no early exit; default: as the "
             "current head)")] = None,
) -> None:
    """Train a new head, shadow-evaluate it against the current one, promote if not worse.

    The candidate uses the current head's encoder precision and early exit unless told.
    """
    import msgspec

    from services.classifier.embedding import HeadRegistry
    from services.classifier.settings import ClassifierSettings
    from services.classifier.training import train_and_promote
    from shared.fast_encoder import shared_fast_encoder

    root = heads_dir or Path(ClassifierSettings.from_env().heads_dir)
    registry = HeadRegistry(root)
    current = registry.current()
    if early_exit_layers is None and current is not None and current.early is not None:
        early_exit_layers = current.early.layers
    encoder = shared_fast_encoder(precision=current.precision if current else None)
    result = train_and_promote(data, registry, encoder, holdout=holdout, seed=seed,
                               early_exit_layers=None if early_exit_layers is None
                               or early_exit_layers < 0 else early_exit_layers)
    typer.echo(msgspec.json.encode(result).decode())


@app.command()
def parser(
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 50051,
    strict: Annotated[bool, typer.Option(help="Strict (spec) mode by default")] = False,
) -> None:
    """Run the AVAP parser gRPC service."""
    from services.parser.server import run

    asyncio.run(run(host, port, default_strict=strict))


@app.command()
def parse(
    file: Annotated[Path, typer.Argument(help="AVAP source file")],
    strict: Annotated[bool, typer.Option(help="Spec mode instead of the lenient dialect")] = False,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Validate one AVAP file with the reference parser (a linter for people too)."""
    import msgspec

    from services.parser.avap import validate

    result = validate(file.read_text(encoding="utf-8"), strict=strict)
    if json_out:
        typer.echo(msgspec.json.encode(result).decode())
    else:
        for line in result.trace:
            hint = f" (did you mean {line.suggestion}?)" if line.suggestion else ""
            typer.echo(f"{file}:{line.line}:{line.column}: {line.code} {line.message}{hint}")
        typer.echo("valid" if result.valid else "invalid", err=True)
    raise typer.Exit(0 if result.valid else 1)


if __name__ == "__main__":
    app()
