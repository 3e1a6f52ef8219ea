"""The embedded answerer: builds the answer from what the request already holds.

Used when no Ollama is configured or it does not answer. It never writes facts of
its own: documentation answers quote retrieved passages, platform answers quote
`extra_context`, conversational answers reuse the previous answer. Every answer
says it is extractive.
"""

from __future__ import annotations

import re

from shared.contracts.pipeline import Passage, Routed
from shared.contracts.routing import QueryType

LABEL = "[extractive answer: no language model answered; built from "
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


def extractive_answer(env: Routed, *, previous_answer: str = "") -> str:
    req = env.request
    kind = env.decision.type
    if kind == QueryType.PLATFORM:
        if not req.extra_context.strip():
            return (LABEL + "your request]\nThis request carries no account data, so I cannot "
                    "tell you anything about your usage, quota or billing.")
        return (LABEL + "the account data in your request]\n"
                + _summary(req.extra_context, req.query, 4))
    if kind == QueryType.CONVERSATIONAL:
        if not previous_answer:
            return (LABEL + "the conversation]\nThere is no previous answer in this session "
                    "to rephrase.")
        body = previous_answer.split("]\n", 1)[-1] if previous_answer.startswith(LABEL) else (
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
