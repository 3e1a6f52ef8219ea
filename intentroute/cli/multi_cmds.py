"""`eval multi`: messages carrying several requests, split and routed part by part
(issue 34), on a labelled set of the project's and on the public MixATIS test set."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from intentroute.cli.apps import emit, eval_app
from intentroute.cli.bench_cmds import JsonFlag, _input_errors
from shared.policy.clarity import DECIDE_THRESHOLD


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
            from services.classifier.offline.multi_eval import run_eval_multi
            from services.classifier.settings import ClassifierSettings

            report = run_eval_multi(file, ClassifierSettings.from_env(), threshold=threshold,
                                    predictions_out=predictions, controls=controls)
        if mixatis is not None:
            from services.classifier.offline.mixatis import run_mixatis

            report["mixatis"] = run_mixatis(
                mixatis, atis_train=atis_train,
                predictions_out=predictions.with_suffix(".mixatis.jsonl")
                if predictions is not None else None)
    emit(report, json_out)
