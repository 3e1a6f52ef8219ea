"""The answer cache of workers run in-process (tests/helpers/pipeline.py `running`)."""

from __future__ import annotations

from typing import Any

from faststream import FastStream


def worker_deps(app: FastStream) -> Any:
    """The stage dependencies of a worker app built by shared.runtime.worker.build_app
    (its `Worker.start` is the app's after-startup hook); None for an app that runs no
    stage (the doors)."""
    for hook in app._after_startup_calling:
        worker = getattr(getattr(hook, "__wrapped__", None), "__self__", None)
        if worker is not None and hasattr(worker, "deps"):
            return worker.deps
    return None


def stage_deps(apps: list[FastStream]) -> list[Any]:
    """The stage dependencies of every stage worker among `apps`."""
    return [deps for deps in map(worker_deps, apps) if deps is not None]


def classifier_cache(apps: list[FastStream]) -> Any:
    """The first classifier's answer cache (services.classifier.answer_cache)."""
    for deps in stage_deps(apps):
        if hasattr(deps, "cascade"):
            return deps.answer_cache
    raise LookupError("no classifier")


def cache_writers(apps: list[FastStream]) -> list[Any]:
    """The generators' and validators' cache writers (shared.cache.offer)."""
    return [deps.answer_cache for deps in stage_deps(apps)
            if getattr(deps, "answer_cache", None) is not None and not hasattr(deps, "cascade")]
