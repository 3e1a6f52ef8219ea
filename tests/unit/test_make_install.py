"""`make install` says what it installs (issue 31): six numbered steps, each announced
before it runs, and pip's own progress instead of --quiet (four silent minutes read as a
hang)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_install_announces_each_step_and_shows_pips_progress(tmp_path: Path) -> None:
    done = subprocess.run(["make", "-n", "install", f"VENV={tmp_path / 'venv'}"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=True)
    steps = re.findall(r'echo "make install: step (\d) of 6: ([^"]+)"', done.stdout)
    assert [n for n, _ in steps] == [str(i) for i in range(1, 7)], done.stdout
    installs = [line for line in done.stdout.splitlines() if " -m pip install" in line]
    assert len(installs) == 5
    assert all("--quiet" not in line and "--progress-bar on" in line for line in installs)
    # Each step is announced before its command.
    lines = done.stdout.splitlines()
    for n, _ in steps:
        at = next(i for i, line in enumerate(lines) if f"step {n} of 6" in line)
        assert "venv" in lines[at + 1] or " -m pip install" in lines[at + 1], lines[at + 1]
