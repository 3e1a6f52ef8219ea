"""The embedded answerer: builds the answer from what the request already holds.

Used when no Ollama is configured or it does not answer. It never writes facts of
its own: documentation answers quote retrieved passages, platform answers quote
`extra_context`, conversational answers reuse the previous answer, a question about
the editor ("explain this") lists the commands of the editor's program with what the
retrieved passages say of them, and a greeting or thanks gets a canned reply
(`social.py`). Every answer says it is extractive.
"""

from __future__ import annotations

import re

from services.generator.social import social_reply
from shared.contracts.pipeline import Passage, Routed
from shared.contracts.routing import RETRIEVING_TYPES, QueryType

LABEL_START = "[extractive answer: "
LABEL = LABEL_START + "no language model answered; built from "


def with_why(answer: str, why: str) -> str:
    """The answer's label saying why no model answered, in one phrase (`why`)."""
    if not why or not answer.startswith(LABEL):
        return answer
    head = LABEL_START + "no language model answered"
    return f"{head} ({why}){answer[len(head):]}"
_WORD = re.compile(r"[\wáéíóúñü]+", re.IGNORECASE)
_FENCE = re.compile(r"```[a-zA-Z]*\n(.*?)```", re.DOTALL)
_SHORTER = re.compile(
    r"\b(short|shorter|brief|fewer words|summar|tl;?dr|corto|breve|menos palabras|resum)",
    re.IGNORECASE,
)
_STOP = frozenset(
    "the a an of to in is are how what do does i my me for and or with on in it this that "
    "el la los las de del un una que como cómo qué es en por para con y o mi se lo".split()
)


def _terms(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text) if w.lower() not in _STOP and len(w) > 1}


def _sentences(text: str) -> list[str]:
    # Markdown wraps sentences over lines: join lines, split on sentence ends and blocks.
    out: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        if block.lstrip().startswith(("#", "|", "-", "*", "```")):
            continue
        joined = " ".join(line.strip() for line in block.splitlines())
        out.extend(s.strip() for s in re.split(r"(?<=[.!?])\s+", joined) if s.strip())
    return out


def _best_passages(query: str, passages: list[Passage], n: int = 2) -> list[Passage]:
    """Retrieval order, except that a passage whose title names the query's subject
    (e.g. the command asked about) comes first."""
    q = _terms(query)
    ranked = sorted(
        enumerate(passages[:5]),
        key=lambda ip: (-len(q & _terms(ip[1].title)), ip[0]),
    )
    return [p for _, p in ranked[:n]]


def _summary(text: str, query: str, max_sentences: int) -> str:
    sentences = _sentences(_FENCE.sub("", text))
    if len(sentences) <= max_sentences:
        return " ".join(sentences)
    q = _terms(query)
    scored = sorted(range(len(sentences)), key=lambda i: (-len(q & _terms(sentences[i])), i))
    keep = sorted(scored[:max_sentences])
    return " ".join(sentences[i] for i in keep)


# A line of AVAP code that calls a command, optionally assigned (`r = RequestGet(...)`).
_CALL = re.compile(r"^[ \t]*(?:[A-Za-z_]\w*[ \t]*=[ \t]*)?([A-Za-z_]\w*)[ \t]*\(", re.MULTILINE)
_COMMENT = re.compile(r"^[ \t]*//[ \t]*(\S.*?)[ \t]*$", re.MULTILINE)
# "explain this", "what does my code do", "¿qué hace esto?": a question about the editor
# when the classifier did not already resolve the pointer to it (a declared type).
_ABOUT_EDITOR = re.compile(
    r"\b(explain|describe|what does|what is|review|check|explica\w*|describ\w*|qu[eé] hace|"
    r"revisa)\b.*\b(this|my code|the code|esto|eso|este|mi c[oó]digo|el c[oó]digo)\b",
    re.IGNORECASE,
)
# Words of a question about the editor that say nothing about what to look up.
_EDITOR_WORDS = frozenset(
    "explain describe review check code does what this that program file editor snippet "
    "explica explícame explicame describa revisa hace esto eso este código codigo".split()
)
_FEEDBACK_TAG = re.compile(r"</?parser_feedback>")
# Starts as a sentence does (a capital, a command in backticks) and ends as one.
_WHOLE_SENTENCE = re.compile(r"[A-Z`¿¡].*[.!?]", re.DOTALL)
# AVAP has 27 commands: a longer list names commands the language does not have.
_MAX_LISTED = 30
_TRACE_LINE = re.compile(r"^Line \d+:.*$", re.MULTILINE)


def _about_editor(env: Routed) -> bool:
    """The question points at the editor's content: the classifier resolved a pointer
    ("explain this") while the editor held something, or the question says so."""
    req = env.request
    if not req.editor_context.strip() or env.decision.type not in RETRIEVING_TYPES:
        return False
    # CODE_GENERATION must leave with a program for the validator: prose in the editor
    # leaves it to the documentation's example.
    if env.decision.type == QueryType.CODE_GENERATION and not _CALL.search(req.editor_context):
        return False
    # A question about the editor is short; the bound keeps the pattern's scan linear
    # ("explain " * 1000 took 0.34 s to fail).
    return env.decision.resolved_reference or (
        len(req.query) <= 200 and bool(_ABOUT_EDITOR.search(req.query)))


def _command_doc(name: str, passages: list[Passage]) -> str:
    """What the retrieved passage titled after the command (`... > encodeSHA256`) says it
    does, in its first whole sentence; "" when no passage is about it. A long section is
    indexed as overlapping chunks, so a later chunk starts mid-sentence ("or replaces its
    current value. ... 1. If it names ..."): only a chunk that starts a sentence is read,
    and only a sentence that starts and ends as one is taken."""
    about = [p for p in passages
             if p.title.rsplit(" > ", 1)[-1].strip("`() ").lower() == name.lower()
             and _WHOLE_SENTENCE.match(p.text.lstrip())]
    for passage in about:
        for sentence in _sentences(_FENCE.sub("", passage.text)):
            if _WHOLE_SENTENCE.fullmatch(sentence) and not sentence.startswith("Signature"):
                return sentence
    return ""


def _inline(line: str, limit: int = 60) -> str:
    """A code line as Markdown inline code, shortened; `` when it holds backticks."""
    text = line if len(line) <= limit else line[:limit - 1] + "…"
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _commands(code_lines: list[str]) -> dict[str, tuple[int, str]]:
    """Each command the program calls -> the number and text of its first line."""
    first_line: dict[str, tuple[int, str]] = {}
    for line_no, line in enumerate(code_lines, 1):
        m = _CALL.match(line)
        if m:
            first_line.setdefault(m.group(1), (line_no, line.strip()))
    return first_line


def _editor_answer(env: Routed) -> str:
    req = env.request
    code = req.editor_context.strip("\n")
    code_lines = code.splitlines()
    first_line = _commands(code_lines)
    if not first_line:
        return (LABEL + "your editor]\nYour editor holds no AVAP command call. In short, it "
                "says: " + _summary(code, req.query, 4))
    lines = [f"Your editor holds an AVAP program of {len(code_lines)} lines that uses "
             f"{len(first_line)} commands, in order of first use:"]
    docs_used = False
    for name, (line_no, text) in list(first_line.items())[:_MAX_LISTED]:
        doc = _command_doc(name, env.passages)
        docs_used = docs_used or bool(doc)
        lines.append(f"- `{name}` (line {line_no}: {_inline(text)})" + (f": {doc}" if doc else ""))
    if len(first_line) > _MAX_LISTED:
        lines.append(f"- and {len(first_line) - _MAX_LISTED} more")
    comments = _COMMENT.findall(code)
    if comments:
        lines.append("Its comments say: " + " / ".join(comments[:3]))
    if env.parser_feedback:
        # The feedback is written for a model; its "Line N: ..." lines are the findings.
        found = _TRACE_LINE.findall(env.parser_feedback)
        lines.append("The AVAP parser rejects it:\n" + "\n".join(
            found or [_FEEDBACK_TAG.sub("", env.parser_feedback).strip()]))
    asked = _terms(req.query) - _EDITOR_WORDS
    best = _best_passages(req.query, env.passages, 1)
    if asked and best and asked & _terms(best[0].title + " " + best[0].text):
        docs_used = True
        lines.append(f"From the documentation, {best[0].title}: "
                     + _summary(best[0].text, req.query, 2))
    source = "your editor and the documentation" if docs_used else "your editor"
    # One fenced block, the editor's program as it is: the validator parses exactly it.
    fence = "```"
    while fence in code:
        fence += "`"
    return (LABEL + source + "]\n" + "\n".join(lines)
            + f"\n\n{fence}avap\n{code}\n{fence}\n")


def extractive_answer(env: Routed, *, previous_answer: str = "") -> str:
    req = env.request
    kind = env.decision.type
    if _about_editor(env):
        return _editor_answer(env)
    if kind == QueryType.PLATFORM:
        if not req.extra_context.strip():
            return (LABEL + "your request]\nThis request carries no account data, so I cannot "
                    "tell you anything about your usage, quota or billing.")
        return (LABEL + "the account data in your request]\n"
                + _summary(req.extra_context, req.query, 4))
    if kind == QueryType.CONVERSATIONAL:
        canned = social_reply(req.query)
        if canned:
            return LABEL + "a canned reply]\n" + canned
        if not previous_answer:
            return (LABEL + "the conversation]\nThere is no previous answer in this session "
                    "to rephrase.")
        body = previous_answer.split("]\n", 1)[-1] if previous_answer.startswith(LABEL_START) else (
            previous_answer
        )
        limit = 2 if _SHORTER.search(req.query) else 5
        return LABEL + "the previous answer]\n" + _summary(body, req.query, limit)
    if not env.passages:
        return (LABEL + "the documentation]\nThe knowledge base returned nothing for this "
                "question. Try `intentroute ingest` with the AVAP documentation.")
    best = _best_passages(req.query, env.passages)
    if kind == QueryType.CODE_GENERATION:
        for passage in best + env.passages:
            code = _FENCE.search(passage.text)
            if code:
                return (LABEL + f"the documentation: {passage.title}]\n"
                        + _summary(passage.text, req.query, 2)
                        + "\n\n```avap\n" + code.group(1).strip() + "\n```\n")
    parts = [f"{p.title}: {_summary(p.text, req.query, 3)}" for p in best]
    return LABEL + "the documentation]\n" + "\n\n".join(parts)
