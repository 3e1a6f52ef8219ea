import json

import pytest

from shared.contracts.checks import parse_request, salvage_request_id
from shared.contracts.errors import InvalidInputError as InputError
from shared.contracts.request import AgentRequest

OK = {"request_id": "r1", "session_id": "s1", "agent_id": "a1", "query": "What is addVar?"}


def _parse(**overrides: object) -> AgentRequest | InputError:
    return parse_request(json.dumps({**OK, **overrides}).encode(), "a1")


def test_valid_request_decodes_with_defaults() -> None:
    req = _parse()
    assert isinstance(req, AgentRequest)
    assert req.query_type is None
    assert req.extra_context == ""


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"query": "   "}, "MISSING_FIELD"),
        ({"query": "x" * 8001}, "OVERSIZED_FIELD"),
        ({"extra_context": "x" * 32001}, "OVERSIZED_FIELD"),
        ({"session_id": "s" * 129}, "OVERSIZED_FIELD"),
        ({"agent_id": "a b"}, "INVALID_FIELD"),
        ({"query": 12}, "INVALID_FIELD"),
        ({"query_type": "BILLING"}, "UNKNOWN_QUERY_TYPE"),
        # Nothing visible: zero-width spaces, a BOM, a word joiner, bidi marks.
        ({"query": "\u200b\u200b\u200b"}, "MISSING_FIELD"),
        ({"query": "\ufeff"}, "MISSING_FIELD"),
        ({"query": " \u2060\u200e\u200f \t"}, "MISSING_FIELD"),
        ({"session_id": "\u200b"}, "MISSING_FIELD"),
        ({"timeout_ms": -5}, "INVALID_FIELD"),
        ({"timeout_ms": 10**30}, "INVALID_FIELD"),
        ({"timeout_ms": 86_400_001}, "INVALID_FIELD"),
    ],
)
def test_each_bad_field_maps_to_its_code(overrides: dict[str, object], code: str) -> None:
    err = _parse(**overrides)
    assert isinstance(err, InputError)
    assert err.code == code
    assert err.message


def test_missing_field_is_reported_with_the_request_id() -> None:
    body = {k: v for k, v in OK.items() if k != "session_id"}
    err = parse_request(json.dumps(body).encode(), "a1")
    assert isinstance(err, InputError)
    assert err.code == "MISSING_FIELD"
    assert err.request_id == "r1"
    assert "session_id" in err.message


def test_the_agent_is_the_credentials_not_the_bodys() -> None:
    body = {k: v for k, v in OK.items() if k != "agent_id"}
    req = parse_request(json.dumps(body).encode(), "a1")
    assert isinstance(req, AgentRequest)
    assert req.agent_id == "a1"
    err = parse_request(json.dumps({**OK, "agent_id": "someone-else"}).encode(), "a1")
    assert isinstance(err, InputError)
    assert err.code == "AGENT_MISMATCH"
    assert err.request_id == "r1"


def test_malformed_json_salvages_the_request_id() -> None:
    err = parse_request(b'{"request_id": "abc-1", "query": "unterminated', "a1")
    assert isinstance(err, InputError)
    assert err.code == "MALFORMED_JSON"
    assert err.request_id == "abc-1"
    assert salvage_request_id(b"garbage") == ""


def test_known_query_types_are_accepted() -> None:
    for qt in ("RETRIEVAL", "CODE_GENERATION", "CONVERSATIONAL", "PLATFORM"):
        assert isinstance(_parse(query_type=qt), AgentRequest)


def test_a_query_with_a_visible_character_among_invisible_ones_is_kept() -> None:
    req = _parse(query="\u200bhello\ufeff")
    assert isinstance(req, AgentRequest)
    assert req.query == "\u200bhello\ufeff"


def test_the_contracts_timeout_bounds_are_accepted() -> None:
    for ms in (0, 1, 86_400_000):
        assert isinstance(_parse(timeout_ms=ms), AgentRequest)


def test_the_request_id_is_found_past_a_deeply_nested_prefix() -> None:
    # 5,000 levels of nesting (past the decoder's depth) and 20 kB before the id.
    body = ('{"x": ' + "[" * 5000 + "]" * 5000 + ', "pad": "' + "p" * 20_000
            + '", "request_id": "deep-1", "session_id": "s", "query": "q"}').encode()
    err = parse_request(body, "a1")
    assert isinstance(err, InputError)
    assert err.request_id == "deep-1"
