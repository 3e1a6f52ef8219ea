"""Deictic references (RC-03): messages that only make sense with the previous turn.

Only these messages may look at the intent history, and only to find what "this"
or "lo anterior" points at. A self-contained message never reads the history.
"""

from __future__ import annotations

import re

from shared.contracts.routing import HistoryEntry, QueryType

# Pronouns and pointers that need a referent, English and Spanish.
_POINTERS = re.compile(
    r"\b(this|that|these|those|it|above|previous|last one|the same)\b"
    r"(?!\s+(month|week|year|morning|plan|quarter))|"
    r"\b(esto|eso|aquello|lo anterior|lo de antes|lo mismo|el anterior|la anterior|"
    r"hazlo|explícalo|explicalo|arréglalo|arreglalo)\b|"
    r"\b(este|esta|ese|esa)\s*[?.!]*\s*$",
    re.IGNORECASE,
)
# Asks to reshape the previous answer: conversational whatever the topic was.
_RESHAPE = re.compile(
    r"\b(shorter|short|briefer|simpler|in fewer words|summari[sz]e|rephrase|again|"
    r"translate|in english|in spanish|more detail|elaborate|"
    r"más corto|mas corto|más breve|en menos palabras|resume|resumen|resúmelo|"
    r"otra vez|de nuevo|tradu[cz]|en inglés|en español|más simple|mas simple|"
    r"con más detalle|reformula)\b",
    re.IGNORECASE,
)
# Follow-ups that open with a connector: "and how do I test that?", "¿y el bucle?"
_CONTINUATION = re.compile(
    r"^\s*¿?\s*(and|also|what about|how about|y|e|¿y|entonces|and then)\b", re.IGNORECASE
)
_CODE_HINT = re.compile(
    r"(\w+\s*=\s*)?\b(addVar|addParam|addResult|startLoop|endLoop|if|try|ormDirect|"
    r"RequestGet|RequestPost)\s*\(",
)
_CONTENT_WORDS = re.compile(r"[a-záéíóúñ]{4,}", re.IGNORECASE)
_STOP = frozenset(
    "this that these those what about explain show please does with from "
    "esto esta este como cómo explica muestra sobre para favor hazlo también tambien "
    "then have make more less about test with".split()
)


def is_deictic(query: str) -> bool:
    """Short messages that point at something outside themselves."""
    words = query.split()
    if len(words) > 12:
        return False
    if _RESHAPE.search(query) and len(words) <= 8:
        return True
    if not (_POINTERS.search(query) or _CONTINUATION.search(query)):
        return False
    # "explain the startLoop command" names its subject; "explain this" does not.
    content = [w.lower() for w in _CONTENT_WORDS.findall(query) if w.lower() not in _STOP]
    return len(content) <= 3


def is_reshape_request(query: str) -> bool:
    return bool(_RESHAPE.search(query)) and len(query.split()) <= 8


def editor_has_code(editor_context: str) -> bool:
    return bool(_CODE_HINT.search(editor_context))


def resolve_reference(
    query: str, history: list[HistoryEntry], editor_context: str
) -> QueryType | None:
    """The type of what a deictic message refers to, or None if nothing to point at.

    Reshaping the previous answer is CONVERSATIONAL. Otherwise the referent is code
    in the editor, else the most recent turn of the intent history.
    """
    if is_reshape_request(query) and history:
        return QueryType.CONVERSATIONAL
    if editor_has_code(editor_context):
        return QueryType.CODE_GENERATION
    if history:
        last = history[-1].type
        # A follow-up on a reshaped answer points at what that answer was about.
        for entry in reversed(history):
            if entry.type != QueryType.CONVERSATIONAL:
                return entry.type
        return last
    return None
