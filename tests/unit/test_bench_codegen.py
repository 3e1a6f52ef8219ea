"""How `bench codegen` counts a request: each invalid first answer is retried from the
same start twice, with the parser's trace and blind, and each outcome lands in one key
(hand-written fakes for the model; the parser's own validate behind the real guard)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from bench.codegen import Loop, Prompt, _request
from services.parser.avap import validate
from services.retriever.ports import SearchResult
from services.validator.parser_client import GuardedParser
from services.validator.ports import ParseOutcome
from shared.contracts.pipeline import Passage
from shared.llm.ports import BackendUnavailableError, ChatMessage, TokenCounts

VALID = "```avap\naddParam(password, pwd)\nencodeSHA256(pwd, hash)\naddResult(hash)\n```"
INVALID = "```avap\naddParam(password, pwd)\ngetSHA256(pwd, hash)\naddResult(hash)\n```"
PROSE = "Use a function that hashes the password."


class InProcessParser:
    async def validate(self, code: str, *, strict: bool = False) -> ParseOutcome:
        result = validate(code, strict=strict)
        return ParseOutcome(result.valid, tuple(result.trace))


class Scripted:
    """Answers by what the prompt holds: the first call, a call with the trace, a call
    without it (the blind retry) — or fails."""

    name = "scripted"

    def __init__(self, first: str, traced: str, blind: str | None) -> None:
        self.answers = {"first": first, "traced": traced, "blind": blind}
        self.prompts: list[str] = []

    async def stream(self, model: str, messages: list[ChatMessage]
                     ) -> AsyncIterator[str | TokenCounts]:
        system = messages[0].content
        kind = ("traced" if "<parser_feedback>" in system
                else "first" if not self.prompts.count(system) else "blind")
        self.prompts.append(system)
        answer = self.answers[kind]
        if answer is None:
            raise BackendUnavailableError("scripted: down")
        yield answer
        yield TokenCounts(10, 5)


class OnePassage:
    async def search(self, query: str, k: int) -> SearchResult:
        return SearchResult([Passage("c#1", "Crypto", "encodeSHA256(src, dst)", 1.0)], "bm25")

    async def maybe_reload(self) -> bool:
        return False

    async def close(self) -> None:
        return None


async def outcome(first: str, traced: str, blind: str | None) -> tuple[list[str], Any]:
    loop = Loop(Scripted(first, traced, blind), "m", GuardedParser(InProcessParser()))
    return await _request(loop, OnePassage(), 8, Prompt("p", "hash the password"))


async def test_a_valid_first_answer_is_not_retried() -> None:
    keys, row = await outcome(VALID, VALID, VALID)
    assert keys == ["valid_first"]
    assert "trace_retry" not in row


async def test_an_invalid_answer_is_retried_with_the_trace_and_blind() -> None:
    keys, row = await outcome(INVALID, VALID, INVALID)
    assert keys == ["fixed_by_trace_retry"]
    assert "encodeSHA256" in row["first"]["feedback"]  # the parser's suggestion
    keys, _ = await outcome(INVALID, INVALID, VALID)
    assert keys == ["invalid_unresolved", "fixed_by_blind_retry"]


async def test_an_answer_without_a_program_is_invalid_without_a_parse() -> None:
    keys, row = await outcome(PROSE, INVALID, INVALID)
    assert keys == ["no_program_first", "invalid_unresolved"]
    assert "no AVAP program" in row["first"]["feedback"]


async def test_a_model_failure_leaves_the_request_out() -> None:
    keys, row = await outcome(INVALID, VALID, None)
    assert keys == ["model_errors"]
    assert row["blind_retry"]["status"] == "MODEL_ERROR"
