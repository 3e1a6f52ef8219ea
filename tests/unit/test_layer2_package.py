"""Layer 2's packaging: the worker never imports the offline tools, the head registry
lives in the state dir and starts from the one head the package ships."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import numpy as np

from services.classifier.adapters import build_classifier
from services.classifier.layer2.head import EmbeddingHead
from services.classifier.layer2.registry import SHIPPED_HEADS, HeadRegistry, seed_registry
from services.classifier.settings import ClassifierSettings
from shared.common.settings import CommonSettings

REPO = Path(__file__).resolve().parents[2]
WORKER_MODULES = [
    "services.classifier.app",
    "services.classifier.handlers",
    "services.classifier.adapters",
    "services.classifier.cascade",
    "services.classifier.layer2.batcher",
    "services.classifier.layer2.classifier",
    "services.classifier.layer2.features",
    "services.classifier.layer2.head",
    "services.classifier.layer2.predict",
    "services.classifier.layer2.registry",
]
# Training and evaluation code the worker must not load just by being imported.
OFFLINE_ONLY = ("offline.classifier", "sklearn.linear_model",
                "sklearn.model_selection", "scipy.optimize", "torch", "transformers",
                "sentence_transformers")


def test_worker_modules_do_not_import_the_offline_tools() -> None:
    script = (
        "import importlib, json, sys\n"
        f"for name in {WORKER_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({OFFLINE_ONLY!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, check=True)
    assert json.loads(out.stdout) == []


def shipped_version() -> str:
    return (SHIPPED_HEADS / "CURRENT").read_text().strip()


def test_the_package_ships_only_the_current_head() -> None:
    version = shipped_version()
    assert sorted(p.name for p in SHIPPED_HEADS.iterdir()) == ["CURRENT", version]
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-data"]["services.classifier"]
    assert {p.split("/")[1] for p in package_data if p.count("/") > 1} == {version}


def test_an_empty_registry_is_seeded_with_the_shipped_head(tmp_path: Path) -> None:
    root = tmp_path / "state" / "heads"
    version = seed_registry(root)
    assert version == shipped_version()
    registry = HeadRegistry(root)
    assert registry.current_version == version
    assert registry.versions() == [version]
    head, shipped = registry.current(), EmbeddingHead.load(SHIPPED_HEADS / version)
    assert head is not None
    assert (head.early is None) == (shipped.early is None)
    x = np.random.default_rng(0).normal(size=(2, shipped.dim)).astype(np.float32)
    texts = ["¿cuánto he gastado?", "write an endpoint"]
    np.testing.assert_array_equal(head.predict_proba(x, texts), shipped.predict_proba(x, texts))
    assert sorted(p.name for p in root.iterdir()) == ["CURRENT", version]  # no leftovers
    assert seed_registry(root) is None  # a registry with a current head is left alone


def test_seeding_never_replaces_a_current_head(tmp_path: Path) -> None:
    (tmp_path / "CURRENT").write_text("v0042\n")
    assert seed_registry(tmp_path) is None
    assert HeadRegistry(tmp_path).current_version == "v0042"
    assert not (tmp_path / shipped_version()).exists()


def test_workers_starting_at_once_seed_one_copy(tmp_path: Path) -> None:
    root = tmp_path / "heads"
    start = threading.Barrier(6)
    seeded: list[str | None] = []

    def worker() -> None:
        start.wait()
        seeded.append(seed_registry(root))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    version = shipped_version()
    assert seeded.count(version) == 1
    assert seeded.count(None) == 5
    assert sorted(p.name for p in root.iterdir()) == ["CURRENT", version]
    assert HeadRegistry(root).current() is not None


def test_the_registry_defaults_to_the_state_dir_and_empty_means_off(tmp_path: Path) -> None:
    common = CommonSettings(state_dir=tmp_path / "home")
    assert ClassifierSettings(common=common).heads_root == tmp_path / "home" / "heads"
    assert ClassifierSettings(common=common, heads_dir="").heads_root is None
    env = {"INTENTROUTE_HOME": str(tmp_path / "other")}
    assert ClassifierSettings.from_env(env).heads_root == tmp_path / "other" / "heads"
    off = ClassifierSettings.from_env({**env, "CLASSIFIER_HEADS_DIR": ""})
    assert off.heads_root is None
    assert build_classifier(off) is None
    assert not (tmp_path / "other").exists()  # Layer 2 off: nothing seeded
