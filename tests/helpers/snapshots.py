"""Prompt snapshots (tests/snapshots/*.txt): the messages a role sends, compared with the
committed text; UPDATE_SNAPSHOTS=1 (or a missing file) writes it anew."""

from __future__ import annotations

import os
from pathlib import Path

from shared.llm.ports import ChatMessage

SNAPSHOTS = Path(__file__).resolve().parent.parent / "snapshots"


def snapshot(name: str, messages: list[ChatMessage]) -> tuple[str, str]:
    """The messages as the snapshot writes them, and the snapshot: the test asserts they
    are equal (in the test module, so that pytest shows the difference)."""
    rendered = "\n---\n".join(f"[{m.role}]\n{m.content}" for m in messages)
    path = SNAPSHOTS / f"{name}.txt"
    if os.environ.get("UPDATE_SNAPSHOTS") or not path.exists():
        path.write_text(rendered, encoding="utf-8")
    return rendered, path.read_text(encoding="utf-8")
