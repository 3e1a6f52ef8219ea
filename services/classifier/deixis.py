"""Deictic references (RC-03): messages that only make sense with the previous turn.

Only these messages may look at the intent history, and only to find what "this"
or "lo anterior" points at. A self-contained message never reads the history.
"""

from __future__ import annotations

import re

from services.classifier.rules import CODE_NOUNS, COMMAND_NAME
from shared.contracts.routing import HistoryEntry, QueryType

# Pronouns and pointers that need a referent, English and Spanish.
_POINTERS = re.compile(
    r"\b(this|that|these|those|it|above|previous|last one|the same|same thing|there)\b"
    r"(?!\s+(month|week|year|morning|plan|quarter))|"
    r"\b(so|that) (high|low|much|many|expensive|slow)\b|"
    r"\b(ahí|ahi|allí|alli|allá|tan (alto|alta|caro|cara|bajo|lento))\b|"
    r"\b(esto|eso|aquello|lo anterior|lo de antes|lo mismo|el anterior|la anterior|"
    r"hazlo|explícalo|explicalo|arréglalo|arreglalo)\b|"
    r"\b(añ[aá]dele|a[nñ]adele|agr[eé]gale|qu[ií]tale|ponle|c[aá]mbiale|hazle|m[eé]tele)\b|"
    r"\b(este|esta|ese|esa)\s*[?.!]*\s*$",
    re.IGNORECASE,
)
# Asks to reshape the previous answer: conversational whatever the topic was.
_RESHAPE = re.compile(
    r"\b(shorter|shorten|short version|briefer|simpler|simplify|in fewer words|"
    r"summari[sz]e|summary|rephrase|reword|rewrite|again|translate|in english|in spanish|"
    r"more detail|elaborate|as a list|as bullet|bullet points|numbered|in a table|"
    r"as a table|checklist|step by step|"
    r"más corto|mas corto|más breve|acorta|abrevia|en menos palabras|resume|resumen|"
    r"resum[ei]\w*|resúmelo|simplifica|otra vez|de nuevo|tradu[cz]\w*|en inglés|en español|"
    r"más simple|mas simple|con más detalle|reformula|reescribe|como lista|en una lista|"
    r"en una tabla|en forma de|pasos numerados|lista de comprobación|punto por punto)\b",
    re.IGNORECASE,
)
# Asks to go on with, repeat or finish the previous answer, or to say it in plainer
# words: the whole message is the request ("continue", "keep going", "sigue",
# "repite eso", "explain it like I'm five", "in plain English").
_CONTINUE = re.compile(
    r"^\W*(please\s+|por favor\s+|ok\s+|vale\s+|(can|could|would) you\s+|"
    r"puedes\s+|podr[ií]as\s+)?"
    r"(continue|keep going|go on|carry on|repeat( that| it)?|say (that|it) again|"
    r"finish (the|your|that) (answer|reply|response|sentence|list)|"
    r"sigue|contin[uú]a|prosigue|rep[ií]te(lo|me|melo)?|repetir(lo)?|"
    r"termina (la|tu|esa) (respuesta|frase|lista))\b",
    re.IGNORECASE,
)
_PLAINER = re.compile(
    r"\b(plain(er)? (english|words|language|terms)|simpler (words|terms)|"
    r"like i'?m (five|5|a beginner)|tl;?dr|trim (it|that|this)|cut off|"
    r"palabras m[aá]s (sencillas|simples|f[aá]ciles)|m[aá]s sencillo|"
    r"como si tuviera (cinco|5) a[nñ]os|como a un principiante|a medias|vi[nñ]etas)\b",
    re.IGNORECASE,
)
# Explicit references to the previous answer ("what you said", "tu última respuesta").
_PRIOR = re.compile(
    r"\b(what you (just )?said|you (just )?said|your (last |previous |first )?(answer|response|"
    r"message|reply|explanation)|the previous (answer|response|message)|that (answer|"
    r"explanation|response|reply)|lo que (me )?(dijiste|has dicho|explicaste)|"
    r"tu (última |ultima |anterior )?(respuesta|mensaje|explicación|explicacion)|"
    r"tu último mensaje|la respuesta anterior|lo anterior)\b",
    re.IGNORECASE,
)
# Greetings, thanks and sign-offs: conversational by content, no history needed.
_SOCIAL = re.compile(
    r"^\W*(thanks|thank you|thx|cheers|gracias|muchas gracias|perfect|perfecto|great|"
    r"genial|awesome|vale|ok|okay|cool|nice|hola|hi|hello|hey|buenas|buenos días|bye|"
    r"goodbye|adiós|adios|hasta luego|see you|good morning|lol|haha\w*|jaja\w*|xd)\b",
    re.IGNORECASE,
)
# Thanks and sign-offs later in the message ("Great, thank you so much!").
_THANKS = re.compile(
    r"\b(thank you|thanks|gracias|that'?s all for|that'?s (exactly )?what i needed|"
    r"eso es todo|justo lo que necesitaba)\b",
    re.IGNORECASE,
)
_TECH = re.compile(
    r"\b(avap|addvar|addparam|addresult|startloop|endloop|ormdirect|requestget|requestpost|"
    r"endpoint|script|code|código|codigo|command|comando|loop|bucle|write|escribe|quota|"
    r"cuota|invoice|factura|usage|plan)\b",
    re.IGNORECASE,
)
# Code as the object of a reshape verb.
_CODE_OBJECT = re.compile(rf"\b({CODE_NOUNS}|function|funci[oó]n)\b", re.IGNORECASE)
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
    "this that these those there what about explain show please does with from same thing "
    "high much many ahí allí "
    "esto esta este como cómo explica muestra sobre para favor hazlo también tambien "
    "then have make more less about test with".split()
)


def is_social(query: str) -> bool:
    """Thanks, greetings, sign-offs with nothing else to do."""
    if len(query.split()) > 12 or _TECH.search(query) or COMMAND_NAME.search(query):
        return False
    # A question after the thanks ("thanks! and what does getRegex return?") is not social.
    return bool(_SOCIAL.search(query)) or ("?" not in query and bool(_THANKS.search(query)))


def is_deictic(query: str) -> bool:
    """Short messages that point at something outside themselves."""
    words = query.split()
    if is_reshape_request(query):
        return True
    if len(words) > 12:
        return False
    if not (_POINTERS.search(query) or _CONTINUATION.search(query)):
        return False
    # "explain the startLoop command" names its subject; "explain this" does not.
    content = [w.lower() for w in _CONTENT_WORDS.findall(query) if w.lower() not in _STOP]
    return len(content) <= 3


def is_reshape_request(query: str) -> bool:
    """Asks to rephrase / shorten / translate / reformat / continue the previous answer."""
    words = len(query.split())
    if words <= 6 and _CONTINUE.search(query) and not _names_a_subject(query):
        return True
    if not (_RESHAPE.search(query) or _PLAINER.search(query)):
        return False
    if _PRIOR.search(query):
        return words <= 25
    # "shorten this AVAP snippet" reshapes code, not the answer.
    if _CODE_OBJECT.search(query):
        return False
    return words <= 8 and bool(_POINTERS.search(query) or not _TECH.search(query))


def _names_a_subject(query: str) -> bool:
    """Code, an AVAP command or account vocabulary named in the message: "continue the
    endpoint", "repeat the RequestGet call" are requests of their own."""
    return bool(_CODE_OBJECT.search(query) or _TECH.search(query)
                or COMMAND_NAME.search(query))


# A line of AVAP code: a command call, optionally assigned (`r = RequestGet(...)`).
_CODE_LINE = re.compile(r"^\s*(\w+\s*=\s*)?[A-Za-z_]\w*\([^\n]*\)\s*$", re.MULTILINE)


def editor_has_code(editor_context: str) -> bool:
    """The editor holds AVAP code: a known command called, or a line that is a call."""
    return bool(_CODE_HINT.search(editor_context) or _CODE_LINE.search(editor_context))


def resolve_reference(
    query: str, history: list[HistoryEntry], editor_context: str
) -> QueryType | None:
    """The type of what a deictic message refers to, or None if nothing to point at.

    Reshaping the previous answer is CONVERSATIONAL. Otherwise the referent is code
    in the editor, else the most recent turn of the intent history, else a document
    in the editor (a passage of AVAP docs: RETRIEVAL).
    """
    if is_reshape_request(query):
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
    if editor_context.strip():
        return QueryType.RETRIEVAL
    return None
