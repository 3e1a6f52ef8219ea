"""Canned replies of the extractive answerer to a greeting, thanks, an acknowledgement
or a goodbye.

A message that is only social ("hello!", "hola", "thanks!", "good morning", "¡muchas
gracias!") gets a short reply in its language (English or Spanish) instead of a summary
of the previous answer. Anything more than social words ("thanks, and shorter") is not
social here and takes the ordinary path.
"""

from __future__ import annotations

import enum
import re


class Social(enum.Enum):
    GREETING = "greeting"
    THANKS = "thanks"
    ACK = "ack"  # "ok", "great", "vale": an acknowledgement
    GOODBYE = "goodbye"


_EN: dict[Social, tuple[str, ...]] = {
    Social.GREETING: ("hello", "hi", "hey", "hiya", "howdy", "good morning",
                      "good afternoon", "good evening", "good day", "greetings",
                      "how are you", "how are you doing", "how's it going"),
    Social.THANKS: ("thanks", "thank you", "thx", "ty", "cheers", "many thanks",
                    "much appreciated", "appreciated"),
    Social.ACK: ("great", "perfect", "awesome", "cool", "nice", "ok", "okay", "got it",
                 "understood", "all right", "alright"),
    Social.GOODBYE: ("bye", "goodbye", "bye bye", "see you", "see you later",
                     "see ya", "good night", "later"),
}
_ES: dict[Social, tuple[str, ...]] = {
    Social.GREETING: ("hola", "buenas", "buenos días", "buenos dias", "buen día",
                      "buen dia", "buenas tardes", "buenas noches", "qué tal", "que tal",
                      "cómo estás", "como estas", "saludos"),
    Social.THANKS: ("gracias", "muchas gracias", "mil gracias"),
    Social.ACK: ("genial", "perfecto", "vale", "estupendo", "entendido", "de acuerdo",
                 "muy bien"),
    Social.GOODBYE: ("adiós", "adios", "hasta luego", "hasta pronto", "hasta mañana",
                     "chao", "chau", "nos vemos"),
}
# Words that may follow or join social phrases without making the message a request.
_FILLER = ("there", "all", "everyone", "team", "again", "so much", "a lot", "very much",
           "mate", "friend", "and", "y", "a todos", "de nuevo", "amigo", "amiga", "equipo",
           "por todo", "for everything", "for that", "for the help", "por la ayuda")

_REPLIES: dict[tuple[Social, str], str] = {
    (Social.GREETING, "en"): "Hello! Ask me about AVAP: what a command does, an endpoint "
                             "to write, or your account's usage.",
    (Social.GREETING, "es"): "¡Hola! Pregúntame sobre AVAP: qué hace un comando, un "
                             "endpoint que escribir o el uso de tu cuenta.",
    (Social.THANKS, "en"): "You're welcome! Ask me anything else about AVAP.",
    (Social.THANKS, "es"): "¡De nada! Pregúntame lo que quieras sobre AVAP.",
    (Social.ACK, "en"): "Glad it helps. Ask me anything else about AVAP.",
    (Social.ACK, "es"): "Me alegro de que te sirva. Pregúntame lo que quieras sobre AVAP.",
    (Social.GOODBYE, "en"): "Goodbye! Come back with any AVAP question.",
    (Social.GOODBYE, "es"): "¡Hasta luego! Vuelve con cualquier duda de AVAP.",
}


def _alternation(phrases: tuple[str, ...]) -> str:
    # Longest first, so "thank you" is not read as "thank" + a stray word.
    return "|".join(re.escape(p) for p in sorted(phrases, key=len, reverse=True))


def _kinds(table: dict[Social, tuple[str, ...]]) -> list[tuple[Social, re.Pattern[str]]]:
    return [(kind, re.compile(rf"\b({_alternation(words)})\b", re.IGNORECASE))
            for kind, words in table.items()]


_ALL = tuple(p for table in (_EN, _ES) for words in table.values() for p in words)
# The whole message: social phrases and fillers, separated by punctuation, spaces, emoji.
# Each phrase is matched atomically: with a plain group "bye bye bye ... x" (113 chars)
# took 4.2 s to fail, as "bye bye" is one phrase or two; atomic, 0.02 ms.
_ONLY_SOCIAL = re.compile(
    rf"[\W_]*(?>\b(?:{_alternation(_ALL + _FILLER)})\b[\W_]*)+", re.IGNORECASE
)
_KINDS = {"en": _kinds(_EN), "es": _kinds(_ES)}
# Spanish punctuation marks a Spanish message even when its words are shared ("vale!").
_SPANISH_MARKS = re.compile(r"[¡¿]")


def social_kind(query: str) -> tuple[Social, str] | None:
    """(what the message is, "en" or "es") when it is only a greeting, thanks or goodbye;
    a goodbye wins over thanks, thanks over an acknowledgement, that over a greeting
    ("hi, thanks!" is thanks)."""
    if len(query) > 120 or not _ONLY_SOCIAL.fullmatch(query.strip()):
        return None
    found: dict[Social, str] = {}
    for lang in ("es", "en"):  # Spanish first: its words are the more specific
        for kind, pattern in _KINDS[lang]:
            if pattern.search(query):
                found.setdefault(kind, lang)
    for kind in (Social.GOODBYE, Social.THANKS, Social.ACK, Social.GREETING):
        if kind in found:
            lang = "es" if _SPANISH_MARKS.search(query) else found[kind]
            return kind, lang
    return None  # fillers only ("and there")


def social_reply(query: str) -> str | None:
    """The canned reply to a social message, or None when the message asks something."""
    kind = social_kind(query)
    return _REPLIES[kind] if kind else None
