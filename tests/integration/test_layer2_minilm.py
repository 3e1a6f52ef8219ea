"""Layer 2 with the real packaged all-MiniLM-L6-v2 (offline): fast encoder agreement,
a small real training set, fine-tune smoke run and a head carrying its own encoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from offline.classifier.promote import HeadWriter
from offline.classifier.train import train_head
from services.classifier.layer2.classifier import Layer2Classifier
from services.classifier.layer2.head import EmbeddingHead
from shared.encoders.embeddings import SentenceTransformerEncoder, pin_threads
from shared.encoders.fast import FastEncoder, onnxruntime_available
from shared.encoders.fast.build import smooth_onnx

SAMPLE = [
    "how do I paginate results from the orders endpoint",
    "write a python function that validates an email address",
    "thanks, that worked perfectly",
    "what is my current API quota?",
    "¿cómo se configura el tiempo de espera de RequestGet?",
    "escribe un script que reintente las peticiones fallidas",
    "hola, buenos días",
    "ok",
    "Summarise the differences between the v1 and v2 authentication flows, including "
    "token lifetimes, refresh behaviour and what happens when a client clock drifts. "
    * 3,
    "",
]

TRAIN = {
    "RETRIEVAL": [
        "what does the timeout parameter of RequestGet do",
        "explain how pagination works in the orders API",
        "where is the documentation for webhooks",
        "what is the difference between addVar and addParam",
        "how are errors reported by the payments endpoint",
        "what does status code 429 mean in this API",
        "describe the authentication flow",
        "which fields does the customer object have",
        "what is the maximum page size",
        "how does the retry policy work",
    ],
    "CODE_GENERATION": [
        "write a function that parses a date string",
        "generate a script that calls the orders endpoint",
        "implement a retry loop in python",
        "create code to upload a file to the API",
        "write an AVAP snippet that reads a query parameter",
        "give me a function to compute a checksum",
        "code a loop that sums the list of prices",
        "write a program that validates json input",
        "implement pagination in a client class",
        "generate a unit test for this function",
    ],
    "CONVERSATIONAL": [
        "hello",
        "thanks a lot",
        "good morning",
        "you are great",
        "bye for now",
        "ok cool",
        "how are you today",
        "nice, thank you",
        "see you later",
        "hi there",
    ],
    "PLATFORM": [
        "show my API usage this month",
        "what is my current plan",
        "how many requests do I have left in my quota",
        "list my projects",
        "what is my billing status",
        "show the invoices of my account",
        "how many API keys does my account have",
        "what is my rate limit",
        "show the consumption of my project",
        "which subscription tier am I on",
    ],
}

HELD_OUT = [
    ("what does the limit parameter in the search endpoint mean", "RETRIEVAL"),
    ("write a function that retries a request three times", "CODE_GENERATION"),
    ("thank you so much", "CONVERSATIONAL"),
    ("how much of my monthly quota did I use", "PLATFORM"),
]


@pytest.fixture(scope="module")
def reference() -> SentenceTransformerEncoder:
    pin_threads(1)
    return SentenceTransformerEncoder()


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> FastEncoder:
    return FastEncoder(onnx_cache_dir=tmp_path_factory.mktemp("onnx"))


def test_fast_encoder_matches_reference(reference: SentenceTransformerEncoder,
                                        fast: FastEncoder) -> None:
    ref = reference.encode(SAMPLE)
    single = np.vstack([fast.encode([t]) for t in SAMPLE])
    batched = fast.encode(SAMPLE, batch_size=4)  # padded batches, length-sorted
    assert fast.dim == reference.dim == 384
    assert single.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(single, axis=1), 1.0, atol=1e-4)
    assert (ref * single).sum(axis=1).min() >= 0.99
    assert (ref * batched).sum(axis=1).min() >= 0.99
    # LRU cache: a repeat is served from the cache, identical vector
    hits = fast.cache_hits
    again = fast.encode([SAMPLE[0]])
    assert fast.cache_hits == hits + 1
    np.testing.assert_array_equal(again[0], single[0])


def test_torch_fallback_matches_reference(reference: SentenceTransformerEncoder) -> None:
    torch_enc = FastEncoder(backend="torch", cache_size=0)
    assert torch_enc.backend == "torch"
    ref = reference.encode(SAMPLE[:5])
    assert (ref * torch_enc.encode(SAMPLE[:5])).sum(axis=1).min() >= 0.99


@pytest.mark.skipif(not onnxruntime_available(), reason="onnxruntime not installed")
def test_onnx_backend_selected_when_available(fast: FastEncoder) -> None:
    assert fast.backend == "onnx"
    assert fast.onnx_path.exists()


@pytest.fixture(scope="module")
def project_head(fast: FastEncoder) -> EmbeddingHead:
    texts = [t for lab in TRAIN for t in TRAIN[lab]]
    labels = [lab for lab in TRAIN for _ in TRAIN[lab]]
    return train_head(texts, labels, fast, seed=0)


def test_small_real_training_set_gives_sensible_predictions(
    project_head: EmbeddingHead, fast: FastEncoder
) -> None:
    clf = Layer2Classifier(project_head, fast)
    preds = clf.classify_batch([t for t, _ in HELD_OUT])
    assert [p.label for p in preds] == [lab for _, lab in HELD_OUT]
    for (text, _), p in zip(HELD_OUT, preds, strict=True):
        single = clf.classify(text)
        assert single.label == p.label
        assert abs(single.confidence - p.confidence) < 1e-4
    assert project_head.metrics["cv_accuracy"] >= 0.8


def test_registry_with_real_encoder(project_head: EmbeddingHead, fast: FastEncoder,
                                    tmp_path: Path) -> None:
    reg = HeadWriter(tmp_path, encoder=fast)
    res = reg.propose(project_head, [t for t, _ in HELD_OUT], [lab for _, lab in HELD_OUT])
    assert res.promoted
    assert res.candidate["accuracy"] == 1.0
    clf = Layer2Classifier.from_registry(tmp_path, encoder=fast)
    assert clf.classify("hello!").label == "CONVERSATIONAL"


def test_finetune_smoke_head_carries_its_encoder(tmp_path: Path) -> None:
    """A few fine-tune steps; the head dir stores the encoder and reloads with it."""
    texts = [t for lab in TRAIN for t in TRAIN[lab]]
    labels = [lab for lab in TRAIN for _ in TRAIN[lab]]
    head = train_head(
        texts, labels, None, seed=0, calibration_folds=2,
        finetune_epochs=1.0, finetune_dir=tmp_path / "ft",
        finetune_options={"batch_size": 16, "threads": 1},
    )
    assert head.has_own_encoder
    assert head.metrics["finetune_seconds"] > 0
    saved = head.save(tmp_path / "head")
    assert (saved / "encoder" / "model.safetensors").exists()
    again = EmbeddingHead.load(saved)
    assert again.has_own_encoder
    assert again.encoder_dir == saved / "encoder"
    clf = Layer2Classifier(again)
    preds = clf.classify_batch([t for t, _ in HELD_OUT])
    assert sum(p.label == lab for p, (_, lab) in zip(preds, HELD_OUT, strict=True)) >= 3


@pytest.mark.skipif(not onnxruntime_available(), reason="onnxruntime not installed")
def test_int8_option_is_close_but_opt_in(reference: SentenceTransformerEncoder,
                                         tmp_path: Path) -> None:
    q = FastEncoder(precision="int8", cache_size=0, onnx_cache_dir=tmp_path)
    assert q.precision == "int8"
    assert "int8" in q.onnx_path.name
    cos = (reference.encode(SAMPLE) * q.encode(SAMPLE)).sum(axis=1)
    assert cos.mean() >= 0.99
    assert cos.min() >= 0.98
    with pytest.raises(ValueError, match="needs the ONNX backend"):
        FastEncoder(precision="int8", backend="torch")


@pytest.mark.skipif(not onnxruntime_available(), reason="onnxruntime not installed")
def test_blockwise_int8_stays_within_a_thousandth_of_the_reference(
        reference: SentenceTransformerEncoder, tmp_path: Path) -> None:
    q = FastEncoder(precision="int8-block", cache_size=0, onnx_cache_dir=tmp_path)
    assert q.onnx_path.name.endswith("-int8block.onnx")
    cos = (reference.encode(SAMPLE) * q.encode(SAMPLE)).sum(axis=1)
    assert cos.mean() >= 0.999
    assert cos.min() >= 0.998


@pytest.mark.skipif(not onnxruntime_available(), reason="onnxruntime not installed")
def test_smoothing_before_int8_leaves_the_fp32_graph_unchanged(tmp_path: Path) -> None:
    import onnxruntime as ort

    enc = FastEncoder(cache_size=0, onnx_cache_dir=tmp_path)
    raw = next(p for p in tmp_path.glob("*.onnx") if not p.stem.endswith("-fused"))
    batches = [e.ids for e in enc._tok.encode_batch(SAMPLE[:6])]
    smoothed = smooth_onnx(raw, tmp_path / "smoothed.onnx", batches)
    ids = np.asarray([batches[4]], dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    before, after = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
                     .run(None, feed)[0] for p in (raw, smoothed))
    np.testing.assert_allclose(after, before, rtol=1e-3, atol=1e-3)


def test_early_exit_on_the_first_three_layers(fast: FastEncoder, tmp_path: Path) -> None:
    shallow = FastEncoder(layers=3, cache_size=0, onnx_cache_dir=tmp_path)
    assert "-L3" in shallow.onnx_path.name
    assert shallow.dim == fast.dim
    texts = SAMPLE[:8]
    cos = (fast.encode(texts) * shallow.encode(texts)).sum(axis=1)
    assert cos.max() < 0.99  # a different, shallower representation ...
    same = FastEncoder(layers=3, backend="torch", cache_size=0)
    assert (same.encode(texts) * shallow.encode(texts)).sum(axis=1).min() > 0.9999  # ... cut alike

    train = [t for lab in TRAIN for t in TRAIN[lab]]
    labels = [lab for lab in TRAIN for _ in TRAIN[lab]]
    head = train_head(train, labels, fast, seed=0, early_exit_layers=3)
    assert head.early is not None
    assert head.early.layers == 3
    assert head.metrics["early_exit"]["cv_accuracy"] >= 0.8
    again = EmbeddingHead.load(head.save(tmp_path / "head"))
    clf = Layer2Classifier(again, fast)  # the early encoder comes from the head
    preds = clf.classify_batch([t for t, _ in HELD_OUT])
    assert [p.label for p in preds] == [lab for _, lab in HELD_OUT]
    assert any(p.early_exit for p in preds)


def test_layer_zero_is_the_embedding_module(fast: FastEncoder, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModel

    lookup = FastEncoder(layers=0, cache_size=0)
    assert lookup.backend == "embeddings"
    assert lookup.dim == fast.dim
    with pytest.raises(ValueError, match="layers"):
        FastEncoder(layers=-1)
    model = AutoModel.from_pretrained(str(lookup.model_dir)).eval()
    texts = SAMPLE  # one long text is truncated like the full encoder's input
    for text, row in zip(texts, lookup.encode(texts), strict=True):
        ids = torch.tensor([lookup._tok.encode(text).ids])
        with torch.inference_mode():
            pooled = model.embeddings(input_ids=ids)[0].mean(dim=0).numpy()
        assert float(row @ (pooled / np.linalg.norm(pooled))) > 0.99999

    train = [t for lab in TRAIN for t in TRAIN[lab]]
    labels = [lab for lab in TRAIN for _ in TRAIN[lab]]
    head = train_head(train, labels, fast, seed=0, early_exit_layers=0)
    assert head.early is not None
    assert head.early.layers == 0
    again = EmbeddingHead.load(head.save(tmp_path / "head"))
    assert again.early is not None
    assert again.early.layers == 0
    preds = Layer2Classifier(again, fast).classify_batch([t for t, _ in HELD_OUT])
    assert [p.label for p in preds] == [lab for _, lab in HELD_OUT]
