"""Data flywheel: classify_history -> export -> train -> shadow-evaluated promotion ->
the running classifier picks the new head up without a restart."""

from __future__ import annotations

import json
import random

import pytest

from offline.classifier.promote import HeadWriter, train_and_promote
from services.classifier.layer2.classifier import Layer2Classifier
from services.classifier.layer2.registry import HeadRegistry
from shared.store.export import export_history
from shared.store.rows import HistoryRow

pytestmark = pytest.mark.integration

LINES = {
    "RETRIEVAL": ["what does {} do", "explain the {} command", "how does {} work",
                  "documentation for {}", "qué hace {}", "para qué sirve {}"],
    "CODE_GENERATION": ["write an endpoint using {}", "generate a script with {}",
                        "escribe un script con {}", "build code that calls {}",
                        "fix my code that uses {}", "crea un endpoint con {}"],
    "PLATFORM": ["how many api calls did I make {}", "my invoice for {}", "mi factura de {}",
                 "quota left this {}", "cuánto consumo llevo en {}", "my plan limits for {}"],
}
FILL = {"RETRIEVAL": ["addVar", "startLoop", "ormDirect", "getDateTime", "replace"],
        "CODE_GENERATION": ["addParam", "RequestGet", "encodeSHA256", "variableToList",
                            "try and exception"],
        "PLATFORM": ["march", "april", "may", "june", "july"]}


async def test_history_export_trains_and_promotes_a_head(store, database_url, tmp_path) -> None:
    rows = []
    for label, templates in LINES.items():
        for i, template in enumerate(templates):
            for word in FILL[label]:
                rows.append(HistoryRow(agent_id="fly", session_id=f"s{i}",
                                       request_id=f"fly-{label}-{i}-{word}", type=label,
                                       topic=template.format(word)[:60], layer="llm",
                                       confidence=0.9))
    rows.append(HistoryRow(agent_id="fly", session_id="s", request_id="fly-guess",
                           type="RETRIEVAL", topic="unsure guess", layer="fallback",
                           confidence=0.4))
    random.Random(0).shuffle(rows)
    await store.write(*rows)

    out = tmp_path / "history.jsonl"
    # Its own agent's rows only: other tests share the database.
    written = await export_history(database_url, out, agent_id="fly")
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert written == len(exported) == len(rows) - 1
    assert all(e["layer"] != "fallback" for e in exported)  # guesses are not labels
    assert {"topic", "type", "layer", "confidence"} <= set(exported[0])

    from shared.encoders.fast import shared_fast_encoder

    enc = shared_fast_encoder()
    registry = HeadWriter(tmp_path / "heads", encoder=enc)
    first = train_and_promote([out], registry, enc, holdout=0.3, seed=0)
    assert first.promoted
    live = Layer2Classifier.from_registry(tmp_path / "heads", encoder=enc)
    version = live.version

    # A head trained on shuffled labels is worse and must not replace the current one.
    shuffled = tmp_path / "shuffled.jsonl"
    labels = [e["type"] for e in exported]
    random.Random(1).shuffle(labels)
    shuffled.write_text("\n".join(json.dumps({**e, "type": lab})
                                  for e, lab in zip(exported, labels, strict=True)))
    worse = train_and_promote([shuffled], registry, enc, holdout=0.3, seed=0)
    assert not worse.promoted
    assert live.maybe_reload() is False
    assert live.version == version

    again = train_and_promote([out], registry, enc, holdout=0.3, seed=1)
    assert again.promoted
    assert live.maybe_reload() is True
    assert live.version != version
    assert live.classify("what does addVar do").label == "RETRIEVAL"



def test_train_classifier_cli_keeps_the_current_heads_early_exit(tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from shared.encoders.fast import FastEncoder

    # A cold ONNX cache: the export's progress output goes to stderr, not into the JSON.
    # (The CLI builds its settings from the environment when the command runs.)
    monkeypatch.setenv("INTENTROUTE_ONNX_CACHE", str(tmp_path / "onnx"))

    from intentroute.cli import app

    data = tmp_path / "lines.jsonl"
    data.write_text("\n".join(json.dumps({"text": t.format(w), "label": label})
                              for label, templates in LINES.items()
                              for t in templates for w in FILL[label]))
    heads = tmp_path / "heads"
    args = ["train-classifier", "--data", str(data), "--heads-dir", str(heads)]

    def train(*extra: str) -> tuple[dict, HeadRegistry]:
        result = CliRunner().invoke(app, [*args, *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout.strip().splitlines()[-1]), HeadRegistry(heads)

    out, registry = train("--early-exit-layers", "3")
    head = registry.current()
    assert out["promoted"]
    assert head is not None
    assert head.early is not None
    assert head.early.layers == 3
    out, registry = train()  # no option: the candidate is built like the current head
    head = registry.current()
    assert out["promoted"]
    assert out["version"] == "v0002"
    assert head is not None
    assert head.early is not None
    assert head.early.layers == 3
    out, registry = train("--early-exit-layers", "0")  # the embedding module alone
    head = registry.current()
    assert out["promoted"]
    assert head is not None
    assert head.early is not None
    lookup = head.early.make_encoder()
    assert head.early.layers == 0
    assert isinstance(lookup, FastEncoder)
    assert lookup.backend == "embeddings"
    out, registry = train("--early-exit-layers", "-1")
    head = registry.current()
    assert out["promoted"]
    assert head is not None
    assert head.early is None
