"""Where hypothesis keeps what it learns, for the test tier and `intentroute bench fuzz`."""

from __future__ import annotations

from hypothesis.configuration import set_hypothesis_home_dir

from shared.common.settings import CommonSettings


def keep_caches_out_of_the_repo() -> None:
    """Hypothesis caches what it learns (constants of the code under test, unicode
    tables) under ./.hypothesis even without an example database: in the user's cache
    directory instead, next to the encoder graphs."""
    set_hypothesis_home_dir(CommonSettings.from_env().onnx_cache_dir.parent / "hypothesis")
