"""Hypothesis strategies for hostile input: arbitrary bytes, JSON that is broken in
every way a decoder has to survive, and well-typed values that are hostile anyway
(subject-special and reserved ids, NUL characters, over-long and unicode-edge text,
huge numbers, wrong admission stamps)."""

from __future__ import annotations

import json
import string
import time
from functools import cache
from typing import Any

import msgspec
from hypothesis import strategies as st

from shared.auth.admission import Admission
from shared.contracts.ids import MAX_ID_CHARS
from shared.contracts.pipeline import Admitted, Passage
from shared.contracts.request import MAX_CONTEXT_CHARS, MAX_QUERY_CHARS, AgentRequest
from shared.contracts.routing import (
    Alternative,
    Clarity,
    HistoryEntry,
    Layer,
    ModelSlot,
    QueryType,
    RoutingDecision,
)

# Strings a subject, a column or a template has trouble with.
SPECIAL_TEXT = [
    "", " ", "\t", "\n", "\r\n", "\x00", "a\x00b", "\x7f", "\x1b[31m", ".", "*", ">", "a.b",
    "a*", "a>", "a b", "_invalid", "$SRV", "_INBOX", "agent.response.x.y", "intentroute.invalid",
    "$context", "${editor}", "{0}", "%s", "\\", '"', "'", "```", "```avap\n", "<parser_feedback>",
    "\u202e", "\ufeff", "\u200b", "\u0301", "e\u0301", "\U0001f642",
    "\U0001d518\U0001d52b\U0001d526", "\uff41\uff42\uff43", "İ", "ß",
    "\u2028", "\u2029", "\ud7ff", "\ue000", "\U0010ffff", "ﷺ", "ǅ", "null", "NaN", "-1",
    "/path/../../etc",
]
SPECIAL_CHARS = "\x00\t\n .*>_-$\\\"'`{}\u202e\ufeff\u200b\u0301\U0001f642é"
ID_CHARS = string.ascii_letters + string.digits + "_-"
SPECIAL_IDS = [
    "", ".", "*", ">", "a.b", "a*", "a>b", "a b", " a", "a\t", "a\n", "_invalid", "\x00",
    "a\x00", "é", "\uff41", "$SRV", "-", "_", "A-_z9", "\u200b", "\ufeff", ">.*",
]
QUERY_TYPES = [t.value for t in QueryType]
HUGE_INTS = [0, 1, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), 10**30]
HUGE_FLOATS = [0.0, -0.0, -1.0, 1e-300, 5e-324, 1e15, 1e300, 1.7976931348623157e308,
               -1.7976931348623157e308]


@cache
def repeated() -> st.SearchStrategy[str]:
    """Over-long text: up to past the biggest bound (context fields)."""
    return st.builds(
        lambda n, unit: unit * n,
        st.sampled_from([MAX_ID_CHARS, MAX_QUERY_CHARS, MAX_QUERY_CHARS + 1, MAX_CONTEXT_CHARS,
                         MAX_CONTEXT_CHARS + 1]) | st.integers(0, 2_000),
        st.sampled_from(["a", "é", "\U0001f642", "\u0301", "\x00", " ", ".", "ab ", "\n"]),
    )


@cache
def hostile_text(max_size: int = 200) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=max_size),
        st.sampled_from(SPECIAL_TEXT),
        st.text(alphabet=SPECIAL_CHARS, max_size=max_size),
        st.lists(st.sampled_from(SPECIAL_TEXT), max_size=6).map("".join),
        repeated(),
    )


# What users send, so that examples get past the checks and deep into each stage's logic.
SENTENCES = [
    "How do I loop from 1 to 10 in AVAP?", "write an endpoint that returns the sha256 of "
    "the password param", "explain this", "en menos palabras", "how is my quota?",
    "usage=82% plan=starter", "cuántas llamadas llevo este mes?", "hola", "gracias!",
    "and in a loop?", "hazlo más corto", "what does addVar do", "fix it: addVar(x 1)",
    "explain addVar and also show my usage", "PLATFORM: reset my key", "and how do I test "
    "that?", "startLoop(i, 1, 5) arréglalo", "tell me about the thing", "bye", "",
]
WORDS = "how do I loop in AVAP write the sha256 of password addVar explain this my quota " \
    "usage 82% billing hola hazlo más corto and also then ? . calls month".split()


@cache
def plain_text(max_size: int = 120) -> st.SearchStrategy[str]:
    """Text a user might send, now and then hostile (each is a few choices only:
    hypothesis spends most of a run generating)."""
    return st.one_of(
        st.sampled_from(SENTENCES),
        st.tuples(st.sampled_from(SENTENCES), st.sampled_from(WORDS),
                  st.sampled_from(SENTENCES)).map(" ".join),
        st.text(alphabet=WORDS[0] + " AVAPádd.?%", max_size=max_size),
        hostile_text(max_size),
    )


def _admissible(text: str, limit: int, *, blank: bool = True) -> str:
    """`text` made to pass the gateway's checks: no NUL, within `limit`, not blank
    unless `blank`; everything else about it stays hostile."""
    text = text.replace("\x00", "")[:limit]
    return text if blank or text.strip() else f"?{text}"[:limit]


@cache
def admissible_text(limit: int, *, blank: bool = True) -> st.SearchStrategy[str]:
    """Hostile text the gateway lets through (unicode edges, subject-special characters,
    template syntax, up to the bound): what every stage must handle."""
    return st.one_of(plain_text(), hostile_text()).map(
        lambda t: _admissible(t, limit, blank=blank))


@cache
def valid_id() -> st.SearchStrategy[str]:
    return st.text(alphabet=ID_CHARS, min_size=1, max_size=24)


@cache
def hostile_id() -> st.SearchStrategy[str]:
    """Mostly a valid id; else subject-special, reserved, over-long or any text."""
    long_ids = st.builds(lambda n, unit: unit * n,
                         st.sampled_from([MAX_ID_CHARS, MAX_ID_CHARS + 1, 1000]),
                         st.sampled_from(["a", "ü", "-"]))
    return st.one_of(valid_id(), valid_id(), valid_id(), st.sampled_from(SPECIAL_IDS),
                     long_ids, hostile_text(MAX_ID_CHARS + 20))


@cache
def hostile_int() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(HUGE_INTS), st.integers(-(2**70), 2**70),
                     st.integers(-5, 5))


@cache
def hostile_float() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(HUGE_FLOATS),
                     st.floats(allow_nan=False, allow_infinity=False))


@cache
def json_values() -> st.SearchStrategy[Any]:
    """Any JSON value: what a field of the wrong type holds."""
    scalars = st.one_of(st.none(), st.booleans(), hostile_int(), hostile_float(),
                        hostile_text(40))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        hostile_text(12), inner, max_size=4), max_leaves=12)


_MISSING = object()
_SAME_AGENT = object()


@cache
def _body_fields() -> dict[str, st.SearchStrategy[Any]]:
    """Each field of a request body: mostly of its type, sometimes any other JSON value,
    sometimes absent (built once: hypothesis validates every new strategy)."""
    typed: dict[str, st.SearchStrategy[Any]] = {
        "request_id": hostile_id(),
        "session_id": hostile_id(),
        "query": plain_text(),
        "agent_id": st.one_of(st.just(_SAME_AGENT), valid_id(), hostile_id()),
        "query_type": st.one_of(st.none(), st.sampled_from(QUERY_TYPES),
                                st.sampled_from(["", "nope", "retrieval", "PLATFORM ",
                                                 "CODE_GENERATION\x00"]), hostile_text(20)),
        "extra_context": st.one_of(st.just(""), plain_text(), hostile_text()),
        "user_info": st.one_of(st.just(""), hostile_text()),
        "editor_context": st.one_of(st.just(""), plain_text(), hostile_text()),
        "timeout_ms": hostile_int(),
    }
    optional = {"agent_id", "query_type", "extra_context", "user_info", "editor_context",
                "timeout_ms"}
    fields = {}
    for name, strategy in typed.items():
        value = st.one_of(strategy, strategy, strategy, strategy, json_values(),
                          st.just(_MISSING))
        fields[name] = st.one_of(st.just(_MISSING), value) if name in optional else value
    return fields


@st.composite
def request_body(draw: st.DrawFn, agent_id: str) -> dict[str, Any]:
    """An `agent.request` body as an agent might send it, hostile in any field."""
    body: dict[str, Any] = {}
    for name, strategy in _body_fields().items():
        value = draw(strategy)
        if value is _SAME_AGENT:
            value = agent_id
        if value is not _MISSING:
            body[name] = value
    body.update(draw(_extra_keys()))
    return body


@cache
def _extra_keys() -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(hostile_text(12), json_values(), max_size=2)


def _dumps(value: Any, ensure_ascii: bool) -> bytes:
    return json.dumps(value, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")


@st.composite
def broken(draw: st.DrawFn, raw: bytes) -> bytes:
    """`raw` as it might arrive broken: truncated, invalid UTF-8, a lone surrogate or NUL
    escape, nested past any recursion limit, a key repeated, bytes inserted."""
    kind = draw(st.sampled_from([
        "truncate", "invalid_utf8", "surrogate", "nul", "deep_field", "deep_whole", "dup_key",
        "insert", "not_object"]))
    pos = draw(st.integers(0, len(raw)))
    if kind == "truncate":
        return raw[:pos]
    if kind == "invalid_utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80",
                                    b"\xf4\x90\x80\x80", b"\xc0\xaf"]))
        at = raw.find(b'": "') + 4 if draw(st.booleans()) and b'": "' in raw else pos
        return raw[:at] + bad + raw[at:]
    if kind in ("surrogate", "nul"):
        escape = b"\\ud800" if kind == "surrogate" else b"\\u0000"
        at = raw.find(b'": "')
        return raw if at < 0 else raw[:at + 4] + escape + raw[at + 4:]
    if kind == "deep_field":
        depth = draw(st.sampled_from([64, 1_000, 10_000, 200_000]))
        inner = b"[" * depth + b"]" * depth
        return raw[:1] + b'"nested": ' + inner + (b", " if len(raw) > 2 else b"") + raw[1:]
    if kind == "deep_whole":
        depth = draw(st.sampled_from([64, 1_000, 10_000, 200_000]))
        return b'{"a":' * depth + raw + b"}" * depth
    if kind == "dup_key":
        return raw[:1] + b'"request_id": "dup-1", ' + raw[1:]
    if kind == "insert":
        return raw[:pos] + draw(st.binary(min_size=1, max_size=8)) + raw[pos:]
    if kind == "not_object":
        return b"[" + raw + b"]"
    return raw


@cache
def shaped_body(agent_id: str, *, admissible: bool) -> st.SearchStrategy[dict[str, Any]]:
    """A body of the contract's shape and types: with valid ids and content the gateway
    lets through (`admissible`: to reach the hand-off), or content it must refuse."""
    if admissible:
        ids, query_type = valid_id(), st.none() | st.sampled_from(QUERY_TYPES)
        query = admissible_text(MAX_QUERY_CHARS, blank=False)
        context = admissible_text(MAX_CONTEXT_CHARS)
    else:
        ids = st.one_of(valid_id(), hostile_id())
        query_type = st.one_of(st.none(), st.sampled_from(QUERY_TYPES), hostile_text(20))
        query, context = st.one_of(plain_text(), hostile_text()), hostile_text()
    return st.fixed_dictionaries(
        {"request_id": ids, "session_id": ids, "query": query},
        optional={
            "agent_id": st.one_of(st.just(agent_id), st.just(agent_id), valid_id()),
            "query_type": query_type,
            "extra_context": context,
            "user_info": context,
            "editor_context": context,
            "timeout_ms": hostile_int(),
        })


@st.composite
def agent_request_bytes(draw: st.DrawFn, agent_id: str) -> bytes:
    """Bytes on `agent.request.<agent_id>`: a body of the right shape whose content the
    gateway lets through or must refuse, a body hostile in any field, either broken on
    the wire, or any bytes."""
    mode = draw(st.sampled_from(["admissible"] * 4 + ["refused", "refused", "wild", "wild",
                                                       "broken", "bytes"]))
    if mode == "bytes":
        return draw(st.binary(max_size=600))
    if mode in ("admissible", "refused"):
        body = draw(shaped_body(agent_id, admissible=mode == "admissible"))
    else:
        body = draw(request_body(agent_id))
    raw = _dumps(body, draw(st.booleans()))
    return draw(broken(raw)) if mode == "broken" else raw


# ---------------------------------------------------------------- pipeline envelopes


@cache
def agent_request(agent_ids: st.SearchStrategy[str], ids: st.SearchStrategy[str], *,
                  admissible: bool = True) -> st.SearchStrategy[AgentRequest]:
    """A request as the gateway admitted it: hostile content it lets through
    (`admissible`), or values no gateway should have let by."""
    if admissible:
        query = admissible_text(MAX_QUERY_CHARS, blank=False)
        context = st.just("") | admissible_text(MAX_CONTEXT_CHARS)
        query_type = st.none() | st.sampled_from(QUERY_TYPES)
    else:
        query = st.one_of(plain_text(), hostile_text())
        context = st.one_of(st.just(""), plain_text(), hostile_text())
        query_type = st.one_of(st.none(), st.sampled_from(QUERY_TYPES), hostile_text(20))
    return st.builds(AgentRequest, request_id=ids, session_id=ids, agent_id=agent_ids,
                     query=query, query_type=query_type, extra_context=context,
                     user_info=context, editor_context=context, timeout_ms=hostile_int())


# The epoch examples' times are relative to: fixed per process, so that replaying an
# example (hypothesis does) draws the same bytes.
EPOCH = float(int(time.time()))


def _epoch(offsets: st.SearchStrategy[float]) -> st.SearchStrategy[float]:
    return offsets.map(lambda d: EPOCH + d)


@cache
def accepted_at(hostile: bool = False) -> st.SearchStrategy[float]:
    recent = _epoch(st.floats(-600, 0))
    return st.one_of(recent, hostile_float()) if hostile else recent


@cache
def deadline(hostile: bool = False) -> st.SearchStrategy[float]:
    """None (0), far enough ahead for a whole run, or passed; any float if `hostile`."""
    ahead = _epoch(st.floats(3600, 7200))
    times = st.one_of(st.just(0.0), ahead, ahead, ahead, _epoch(st.floats(-600, 0)))
    return st.one_of(times, hostile_float()) if hostile else times


@cache
def timings(hostile: bool = False) -> st.SearchStrategy[dict[str, float]]:
    stages = st.sampled_from(["classify", "classify.at", "retrieve", "retrieve.at",
                              "generate.main", "validate.0"])
    sane: st.SearchStrategy[dict[str, float]] = st.one_of(
        st.just({}), st.dictionaries(stages, st.floats(0, 1e4), max_size=4))
    return st.one_of(sane, st.dictionaries(hostile_text(20), hostile_float(), max_size=4)
                     ) if hostile else sane


@cache
def decision(types: tuple[QueryType, ...]) -> st.SearchStrategy[RoutingDecision]:
    """A routing decision, usually of a type the stage expects."""
    return st.builds(
        RoutingDecision,
        type=st.sampled_from(types) | st.sampled_from(list(QueryType)),
        layer=st.sampled_from(list(Layer)),
        confidence=st.floats(0, 1) | hostile_float(),
        model_slot=st.sampled_from(list(ModelSlot)),
        clarity=st.sampled_from(list(Clarity)),
        alternatives=st.lists(st.builds(Alternative, st.sampled_from(list(QueryType)),
                                        hostile_float()), max_size=4),
        resolved_reference=st.booleans(),
        declared_ignored=st.booleans(),
    )


@cache
def passages(max_size: int = 4) -> st.SearchStrategy[list[Passage]]:
    return st.lists(st.builds(Passage, doc_id=hostile_text(30), title=plain_text(60),
                              text=plain_text(400) | hostile_text(2000), score=hostile_float(),
                              source=hostile_text(30)), max_size=max_size)


AVAP_LINES = [
    "addVar(x, 1)", "addParam(password, p)", "encodeSHA256(p, h)", "getSHA256(x)",
    "startLoop(i, 1, 10)", "endLoop()", 'if(x, 1, "==")', "else()", "end()", "addResult(h)",
    "function f(a, b){", "return(a)", "}", "x = y + 1", '"unterminated', "((((", "))))",
    "try()", "exception(e)", "import x", "for i in range(10):", "console.log(x)", "",
]


@cache
def avap_answer() -> st.SearchStrategy[str]:
    """An answer with (possibly broken) AVAP code, fenced or not, or anything at all."""
    program = st.lists(st.sampled_from(AVAP_LINES) | hostile_text(40), max_size=12).map(
        "\n".join)
    return st.one_of(
        program.map(lambda p: f"Here it is:\n```avap\n{p}\n```"),
        program.map(lambda p: f"```\n{p}\n```\nand ```avap\n{p}"),
        program,
        hostile_text(2000),
    )


@st.composite
def envelope_bytes(draw: st.DrawFn, envelopes: dict[str, st.SearchStrategy[Any]],
                   admission: Admission) -> bytes:
    """An envelope as the previous stage hands it over: stamped, with usable ids and
    hostile content the gateway lets through (most examples, so they reach the stage's
    logic); or with content the gateway refuses, hostile ids, a wrong stamp, a field of
    the wrong type or missing, broken bytes, any bytes. `envelopes` holds the
    "valid", "refused" (content) and "ids" (hostile ids) envelope strategies."""
    mode = draw(st.sampled_from(["valid"] * 6 + ["refused", "ids", "stamp", "retyped",
                                                  "broken", "bytes"]))
    if mode == "bytes":
        return draw(st.binary(max_size=600))
    env = draw(envelopes.get(mode, envelopes["valid"]))
    admission.stamp(env)
    if mode == "stamp":
        wrong = draw(st.sampled_from(["none", "garbage", "other", "flipped"]))
        if wrong == "none":
            env.admission = ""
        elif wrong == "garbage":
            env.admission = draw(st.text(alphabet="0123456789abcdef", max_size=64))
        elif wrong == "other":  # a genuine stamp, for another request
            other = msgspec.structs.replace(env, request=msgspec.structs.replace(
                env.request, agent_id=env.request.agent_id + "x"))
            admission.stamp(other)
            env.admission = other.admission
        elif isinstance(env, Admitted):  # stamped, then its trust changed
            env.trusted = not env.trusted
        else:  # stamped, then its acceptance time changed
            env.accepted_at += 1
    raw = msgspec.json.encode(env)
    if mode == "retyped":
        raw = _dumps(draw(_retyped(msgspec.json.decode(raw))), True)
    elif mode == "broken":
        raw = draw(broken(raw))
    return raw


@st.composite
def _retyped(draw: st.DrawFn, tree: Any) -> Any:
    """`tree` with one value (at any depth) replaced by another JSON value or removed."""
    node, key = tree, None
    while isinstance(node, dict) and node:
        key = draw(st.sampled_from(sorted(node)))
        if not isinstance(node[key], dict) or not node[key] or draw(st.booleans()):
            break
        node = node[key]
    if isinstance(node, dict) and key is not None:
        if draw(st.booleans()):
            node[key] = draw(json_values())
        else:
            node.pop(key)
    return tree


@cache
def history() -> st.SearchStrategy[list[HistoryEntry]]:
    return st.lists(st.builds(HistoryEntry, st.sampled_from(list(QueryType)), plain_text(60)),
                    max_size=6)


@cache
def turns() -> st.SearchStrategy[list[tuple[str, str]]]:
    return st.lists(st.tuples(st.sampled_from(["user", "assistant"]), plain_text(200)),
                    max_size=6)
