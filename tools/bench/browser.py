"""The system's Chromium (Debian's `chromium`, installed by `make browser`) for the
dashboard test and benchmark, driven with Playwright, which downloads no browser here."""

from __future__ import annotations

import os
import shutil

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """INTENTROUTE_CHROMIUM if set, else the first Chromium on PATH; None when absent."""
    explicit = os.environ.get("INTENTROUTE_CHROMIUM", "")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


# Headless in a container, often as root: no sandbox (root cannot have one), no GPU.
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
