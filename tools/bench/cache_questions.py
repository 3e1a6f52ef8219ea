"""The questions `bench cache` replays: documentation and code questions, each with
paraphrases (the same question: its answer may be served again) and hard negatives
(one command, number or identifier swapped, a negation, one requirement more, the other
language: their own question). Written for the benchmark, apart from the pair sets the
thresholds were chosen on (tests/data/cache_pairs*.jsonl)."""

from __future__ import annotations

from typing import NamedTuple


class Group(NamedTuple):
    query_type: str  # "RETRIEVAL": routed by the classifier; CODE_GENERATION: declared
    base: str
    paraphrases: tuple[str, ...]
    negatives: tuple[str, ...]


GROUPS: tuple[Group, ...] = (
    Group("RETRIEVAL", "What does addVar do?",
          ("How does addVar work?", "what does addVar do", "Can you explain addVar?"),
          ("What does addParam do?", "What does addVar not do?", "¿Qué hace addVar?")),
    Group("RETRIEVAL", "How do I declare a variable in AVAP?",
          ("How can I define a variable in AVAP?", "How do I create a variable in AVAP?"),
          ("How do I delete a variable in AVAP?", "How do I declare a global variable?")),
    Group("RETRIEVAL", "What parameters does RequestPost take?",
          ("Which arguments does RequestPost accept?", "What parameters does RequestPost take"),
          ("What parameters does RequestGet take?",
           "What parameters does RequestPost take and what does it return?")),
    Group("RETRIEVAL", "How does startLoop count?",
          ("How does startLoop do its counting?", "how does startLoop count?"),
          ("How does endLoop count?", "How does startLoop count backwards?")),
    Group("RETRIEVAL", "What does getListLen return?",
          ("What is returned by getListLen?", "getListLen returns what?"),
          ("What does itemFromList return?", "What does getListLen return for an empty list?")),
    Group("RETRIEVAL", "How do I handle errors in AVAP?",
          ("How can I catch errors in AVAP?", "How do I handle errors in AVAP"),
          ("How do I log errors in AVAP?", "How do I handle errors inside a loop in AVAP?")),
    Group("RETRIEVAL", "¿Qué hace encodeSHA256?",
          ("¿Para qué sirve encodeSHA256?", "que hace encodeSHA256"),
          ("¿Qué hace encodeMD5?", "What does encodeSHA256 do?")),
    Group("RETRIEVAL", "¿Cómo funcionan los bucles en AVAP?",
          ("Explícame los bucles en AVAP", "¿Cómo funcionan los bucles en AVAP"),
          ("¿Cómo funcionan las condiciones en AVAP?", "¿Cómo funcionan los bucles anidados?")),
    Group("RETRIEVAL", "What format does getDateTime expect?",
          ("Which format does getDateTime expect?", "what format does getDateTime expect"),
          ("What format does getTimeStamp expect?", "What format does getDateTime not accept?")),
    Group("CODE_GENERATION", "Write an endpoint that returns the user id",
          ("Create an endpoint that returns the user id",
           "write an endpoint that returns the user id."),
          ("Write an endpoint that returns the order id",
           "Write an endpoint that returns the user id and the user name",
           "Escribe un endpoint que devuelva el id del usuario")),
    Group("CODE_GENERATION", "Write code that reads the name parameter and returns it",
          ("Write code to read the name parameter and return it",
           "Write code that reads the name parameter and returns it."),
          ("Write code that reads the email parameter and returns it",
           "Write code that reads the name parameter, uppercases it and returns it")),
    Group("CODE_GENERATION", "Write a loop from 1 to 10 with startLoop",
          ("Write a loop from 1 to 10 using startLoop",
           "Please write a loop from 1 to 10 with startLoop"),
          ("Write a loop from 1 to 20 with startLoop",
           "Write a loop from 1 to 10 without startLoop")),
)
