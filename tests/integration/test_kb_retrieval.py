"""Hybrid retrieval on the demo knowledge base answers questions that name a command."""

from __future__ import annotations

import pytest

from services.retriever.index import EmbeddedIndex
from shared.encoders.fast import shared_fast_encoder

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("query", "section"),
    [
        ("What does addParam do in AVAP and in which order does it search the request?",
         "addParam"),
        ("what does getListLen return", "getListLen"),
        ("what comparators does if accept", "Comparators"),
    ],
)
def test_a_named_command_section_ranks_first(kb_index, query: str, section: str) -> None:
    index = EmbeddedIndex.open(kb_index, shared_fast_encoder())
    hybrid = index.search(query, 8, "hybrid")
    assert hybrid.passages[0].title.endswith(section)


def test_bm25_alone_stays_standard(kb_index) -> None:
    # The heading ranking is part of the hybrid fusion only; BM25 scores are untouched.
    index = EmbeddedIndex.open(kb_index, None)
    result = index.search("What does addParam do in AVAP and in which order", 8, "bm25")
    assert result.passages[0].title == "AVAP overview"
