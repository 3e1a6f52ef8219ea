"""A forgiving ingest (issue 31): a file that cannot be read as text, or of a kind not
read, is skipped and named with its reason, the good files are read; a long ingest says
how long first and asks only on a terminal; `ingest --list` counts in the right plural."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from intentroute.cli import app
from intentroute.cli.data_cmds import DEFAULT_RATE, LONG_INGEST, confirm_long_ingest
from services.retriever.indexing.documents import NOT_READ, Skipped, load_documents

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))


def mixed_folder(root: Path) -> Path:
    """A good .md and .txt beside a PNG, binary bytes named .md, Latin-1 text named .txt
    and a corpus line that is not JSON; a hidden file is passed over unnamed."""
    root.mkdir()
    (root / "good.md").write_text("# Loops\n\nUse startLoop to repeat.\n", encoding="utf-8")
    (root / "notes.txt").write_text("Plain notes.\n", encoding="utf-8")
    (root / "diagram.png").write_bytes(PNG)
    (root / "binary.md").write_bytes(b"\xd0\xcf\x11\xe0\x00\x01binary")
    (root / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "corpus.jsonl").write_text('{"_id": "1", "text": "ok"}\nnot json\n')
    (root / ".hidden.md").write_bytes(b"\x00")
    return root


def test_unreadable_files_are_named_with_their_reason_and_the_rest_read(
        tmp_path: Path) -> None:
    skipped: list[Skipped] = []
    docs = list(load_documents(mixed_folder(tmp_path / "kb"), skipped))
    assert sorted(d.doc_id for d in docs) == ["good.md", "notes.txt"]
    assert {s.file: s.reason for s in skipped} == {
        "binary.md": "binary, not text (it holds NUL bytes)",
        "corpus.jsonl": "line 2 is not JSON (Expecting value)",
        "diagram.png": NOT_READ,
        "latin.txt": "not UTF-8 text (byte 0xe9 at offset 3)",
    }
    with pytest.raises(ValueError, match="NUL bytes"):  # without a list: as before
        list(load_documents(tmp_path / "kb"))


def test_a_long_ingest_says_how_long_and_asks_only_on_a_terminal(
        capsys: pytest.CaptureFixture[str]) -> None:
    short = int(LONG_INGEST * DEFAULT_RATE) - 1
    assert confirm_long_ingest(short, None, yes=False, terminal=True)  # nothing asked
    assert capsys.readouterr().err == ""
    many = int(LONG_INGEST * DEFAULT_RATE * 3)
    assert confirm_long_ingest(many, None, yes=False, terminal=False)
    err = capsys.readouterr().err
    assert f"ingest: {many:,} chunks to embed, about 3 min at ~{DEFAULT_RATE:.0f} chunks/s" in err
    assert "not a terminal: going on without asking" in err
    assert confirm_long_ingest(many, 50.0, yes=True, terminal=True)
    assert "not a terminal" not in capsys.readouterr().err


def test_a_terminal_is_asked_and_may_say_no(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer

    asked: list[str] = []

    def answer(text: str, **_: object) -> bool:
        asked.append(text)
        return False

    monkeypatch.setattr(typer, "confirm", answer)
    assert not confirm_long_ingest(100_000, 20.0, yes=False, terminal=True)
    assert asked == ["Go on?"]


def test_list_says_one_chunk_and_two_chunks(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from services.retriever.indexing import embedded_ingest

    monkeypatch.setattr(embedded_ingest, "list_sources", lambda _: {
        "a.md": {"chunks": 1, "ingested_at": 0, "from": "/kb"},
        "b.md": {"chunks": 2, "ingested_at": 0, "from": "/kb"}})
    result = CliRunner().invoke(app, ["ingest", "--list", "--index-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "    1 chunk " in lines[0]
    assert "1 chunks" not in result.output
    assert "    2 chunks" in lines[1]
