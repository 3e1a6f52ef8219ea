"""`intentroute eval ...` (quality: the cascade, the rules, Layer 2 on intent sets,
retrieval on BEIR sets, the answer cache's matching on question pairs) and `intentroute
train-classifier`, added to the CLI by the `intentroute.commands` entry point `offline`
(tools/pyproject.toml; the CLI never imports this module).

Each evaluation prints one JSON object with --json, a readable listing without. Each
command imports its tool when run, so loading the commands costs nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from intentroute.cli.apps import emit, settings, stack_errors
from shared.policy.clarity import DECIDE_THRESHOLD

eval_app = typer.Typer(no_args_is_help=True, help="Evaluations (JSON with --json).")

JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON object on stdout")]


def register(app: typer.Typer) -> None:
    """The `intentroute.commands` entry point: `eval` and its commands, and
    `train-classifier`, on `app`."""
    app.add_typer(eval_app, name="eval")
    app.command("train-classifier")(train_classifier)


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
    from offline.classifier.routing_eval import run_eval_routing
    from services.classifier.settings import ClassifierSettings

    if llm not in (None, "local"):
        raise typer.BadParameter("only `local` (the environment's model server: omit it)",
                                 param_hint="--llm")
    with _input_errors(), stack_errors():
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
    from offline.classifier.rules_eval import run_eval_rules

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
    from offline.classifier.inputs import InputError
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
    from offline.classifier.intents_eval import INTENT_ENCODERS
    from offline.classifier.intents_eval import eval_intents as run_eval
    from offline.classifier.mixture import TUNE_EPOCHS

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
    from offline.retriever.evaluation import evaluate
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


@eval_app.command("cache")
def eval_cache(
    pairs: Annotated[Path, typer.Argument(help="JSONL of {id, a, b, same, kind, type, lang}")],
    json_out: JsonFlag = False,
    predictions: Annotated[Path | None, typer.Option(
        help="Write one line per pair: id, hit, similarity, reason")] = None,
) -> None:
    """The answer cache's live matching decision on question pairs: hit_rate on the
    `same` pairs, false_hit_rate on the others, by kind, language and type, with the
    classifier's own vectors (CLASSIFIER_HEADS_DIR's current head)."""
    from offline.classifier.cache_eval import evaluate, load_pairs, write_predictions
    from services.classifier.adapters import build_classifier
    from services.classifier.settings import ClassifierSettings

    try:
        rows = load_pairs(pairs)
    except (OSError, ValueError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    classifier = build_classifier(ClassifierSettings.from_env())
    if classifier is None:
        typer.echo("CLASSIFIER_HEADS_DIR is empty (Layer 2 off): the cache has no vectors",
                   err=True)
        raise typer.Exit(2)
    encoder = classifier.first_encoder
    report, lines = evaluate(rows, encoder, layers=getattr(encoder, "layers", None))
    if predictions is not None:
        write_predictions(predictions, lines)
    emit(report, json_out)


def train_classifier(
    data: Annotated[list[Path], typer.Option(help="Labelled JSONL/CSV files (repeatable)")],
    heads_dir: Annotated[Path | None, typer.Option(
        help="Head registry, used as it is (default: the worker's, CLASSIFIER_HEADS_DIR or "
             "<state dir>/heads, seeded with the shipped head when it has none)")] = None,
    holdout: Annotated[float, typer.Option(help="Held-out share for shadow evaluation")] = 0.2,
    seed: Annotated[int, typer.Option()] = 0,
    early_exit_layers: Annotated[int | None, typer.Option(
        help="Also train an early-exit head on the encoder's first N layers "
             "(0: the embedding module alone; -1: no early exit; default: as the "
             "current head)")] = None,
) -> None:
    """Train a new head, shadow-evaluate it against the current one, promote if not worse.

    The candidate uses the current head's encoder precision and early exit unless told,
    and the encoders CLASSIFIER_ENCODER and CLASSIFIER_EARLY_EXIT_ENCODER name.
    """
    import msgspec

    from offline.classifier.promote import HeadWriter, train_and_promote
    from services.classifier.layer2.registry import seed_registry
    from services.classifier.settings import ClassifierSettings
    from shared.encoders.fast import shared_fast_encoder

    classifier = ClassifierSettings.from_env()
    common = classifier.common
    root = heads_dir
    if root is None:
        root = classifier.heads_root
        if root is None:
            typer.echo("CLASSIFIER_HEADS_DIR is empty (Layer 2 off): pass --heads-dir", err=True)
            raise typer.Exit(2)
        seed_registry(root)
    registry = HeadWriter(root, default_precision=common.encoder_precision,
                          onnx_cache_dir=common.onnx_cache_dir)
    current = registry.current()
    if early_exit_layers is None and current is not None and current.early is not None:
        early_exit_layers = current.early.layers
    from shared.encoders.packaged import ModelAssemblyError

    try:
        encoder = shared_fast_encoder(
            classifier.encoder,
            precision=(current.precision if current else None) or common.encoder_precision,
            onnx_cache_dir=common.onnx_cache_dir)
        result = train_and_promote(data, registry, encoder, holdout=holdout, seed=seed,
                                   early_exit_layers=None if early_exit_layers is None
                                   or early_exit_layers < 0 else early_exit_layers,
                                   early_exit_model=classifier.early_exit_encoder)
    except ModelAssemblyError as exc:  # CLASSIFIER_ENCODER names a model not installed
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    typer.echo(msgspec.json.encode(result).decode())


@eval_app.command("multi")
def eval_multi(
    file: Annotated[Path | None, typer.Argument(
        help="JSONL: query, parts [{text, expected}], lang, kind, history, ...")] = None,
    json_out: JsonFlag = False,
    predictions: Annotated[Path | None, typer.Option(
        help="Write one line per input (its parts, their spans and types)")] = None,
    threshold: Annotated[
        float, typer.Option(help="Layer 2 decision threshold")] = DECIDE_THRESHOLD,
    mixatis: Annotated[Path | None, typer.Option(
        help="A MixATIS folder of the AGIF repository's data (test.txt; MixATIS_clean "
             "is the cleaned one): the splitter with an ATIS intent classifier")] = None,
    controls: Annotated[list[Path] | None, typer.Option(
        "--controls", help="A routing set (`eval routing`'s lines; repeatable): each line "
                           "is one request, so any cut is wrong")] = None,
    atis_train: Annotated[Path | None, typer.Option(
        help="ATIS training file the intent classifier learns from (default: "
             "ATIS/train.txt beside the MixATIS folder)")] = None,
) -> None:
    """Each message split into its requests and each part routed by the real cascade
    (rules, embedding head, LLM when configured); changes nothing."""
    if file is None and mixatis is None and not controls:
        raise typer.BadParameter("a FILE, --controls FILE or --mixatis DIR",
                                 param_hint="FILE")
    report: dict[str, Any] = {}
    with _input_errors():
        if file is not None or controls:
            from offline.classifier.multi_eval import run_eval_multi
            from services.classifier.settings import ClassifierSettings

            report = run_eval_multi(file, ClassifierSettings.from_env(), threshold=threshold,
                                    predictions_out=predictions, controls=controls)
        if mixatis is not None:
            from offline.classifier.mixatis import run_mixatis

            report["mixatis"] = run_mixatis(
                mixatis, atis_train=atis_train,
                predictions_out=predictions.with_suffix(".mixatis.jsonl")
                if predictions is not None else None)
    emit(report, json_out)
