"""The splitter (issue 34): a message is cut into its requests when, and only when, it
carries several; each part keeps its span. Hand-written cases, one per kind of join
and per kind of single request, in English and Spanish (none is a line of the
labelled sets)."""

from __future__ import annotations

import pytest

from services.classifier.split import Split, split, split_judged


def texts(message: str) -> list[str]:
    return [p.text for p in split(message).parts]


@pytest.mark.parametrize(
    ("message", "parts"),
    [
        # conjunctions
        ("describe getListLen and then build an endpoint that counts a list",
         ["describe getListLen", "build an endpoint that counts a list"]),
        ("what does encodeMD5 return? also, which plan am I on?",
         ["what does encodeMD5 return?", "which plan am I on?"]),
        ("Write a script that reads a date param. btw, how many requests did I make today?",
         ["Write a script that reads a date param.", "how many requests did I make today?"]),
        ("Explain RequestPost, plus show me my last invoice",
         ["Explain RequestPost", "show me my last invoice"]),
        ("summarise your answer, then tell me what exception() stores",
         ["summarise your answer", "tell me what exception() stores"]),
        ("explain ormDirect and write an endpoint that reads one row",
         ["explain ormDirect", "write an endpoint that reads one row"]),
        ("what is randomString for, and how much quota have I got left?",
         ["what is randomString for", "how much quota have I got left?"]),
        ("Is there a way to sleep in AVAP? One more thing: what's on my invoice?",
         ["Is there a way to sleep in AVAP?", "what's on my invoice?"]),
        # several questions; a question followed by an imperative
        ("Does replace take a regex? Does getRegex?",
         ["Does replace take a regex?", "Does getRegex?"]),
        ("What does itemFromList return past the end? Write a safe wrapper for it.",
         ["What does itemFromList return past the end?", "Write a safe wrapper for it."]),
        # lists
        ("1. what is addResult\n2. write an endpoint returning two results\n3. my usage?",
         ["what is addResult", "write an endpoint returning two results", "my usage?"]),
        ("- shorten your answer\n- explain getTimeStamp",
         ["shorten your answer", "explain getTimeStamp"]),
        ("1) what is ormDirect 2) write a query endpoint 3) what plan do I have",
         ["what is ormDirect", "write a query endpoint", "what plan do I have"]),
        ("(1) define the try command (2) write an endpoint that uses it",
         ["define the try command", "write an endpoint that uses it"]),
        ("1 - what plan am I on\n2 - write an endpoint that returns 204",
         ["what plan am I on", "write an endpoint that returns 204"]),
        ("explain getRegex's groups, and also bullet-point your last answer",
         ["explain getRegex's groups", "bullet-point your last answer"]),
        ("What is the parser for? Let me also know when my plan renews.",
         ["What is the parser for?", "Let me also know when my plan renews."]),
    ],
)
def test_english_messages_with_several_requests_are_split(message: str,
                                                           parts: list[str]) -> None:
    assert texts(message) == parts


@pytest.mark.parametrize(
    ("message", "parts"),
    [
        ("explica getListLen y luego crea un endpoint que cuente una lista",
         ["explica getListLen", "crea un endpoint que cuente una lista"]),
        ("¿qué devuelve encodeMD5? Además, ¿qué plan tengo?",
         ["¿qué devuelve encodeMD5?", "¿qué plan tengo?"]),
        ("Escribe un script que lea una fecha. Por cierto, ¿cuántas peticiones hice hoy?",
         ["Escribe un script que lea una fecha.", "¿cuántas peticiones hice hoy?"]),
        ("resume tu respuesta y después dime qué guarda exception()",
         ["resume tu respuesta", "dime qué guarda exception()"]),
        ("¿Se puede esperar en AVAP? Otra cosa: ¿qué pone mi factura?",
         ["¿Se puede esperar en AVAP?", "¿qué pone mi factura?"]),
        ("¿replace admite regex? ¿Y getRegex?", ["¿replace admite regex?", "¿Y getRegex?"]),
        ("¿Qué devuelve itemFromList fuera de rango? Escríbeme un envoltorio seguro.",
         ["¿Qué devuelve itemFromList fuera de rango?", "Escríbeme un envoltorio seguro."]),
        ("1. ¿qué es addResult?\n2. escribe un endpoint con dos resultados\n3. ¿mi consumo?",
         ["¿qué es addResult?", "escribe un endpoint con dos resultados", "¿mi consumo?"]),
        ("- acorta tu respuesta\n- explica getTimeStamp",
         ["acorta tu respuesta", "explica getTimeStamp"]),
        # chat Spanish without accents nor question marks
        ("como leo una cabecera y tambien cual es mi limite de peticiones",
         ["como leo una cabecera", "cual es mi limite de peticiones"]),
        ("genera un endpoint que sume dos números... ¿y cuánto me queda de cuota?",
         ["genera un endpoint que sume dos números...", "¿y cuánto me queda de cuota?"]),
        ("¿tengo facturas pendientes? por cierto para qué sirve getListLen",
         ["¿tengo facturas pendientes?", "para qué sirve getListLen"]),
        # a modal lends its ask to the infinitives after it
        ("¿puedes explicar addVar, escribir un endpoint con él y decirme mi plan?",
         ["¿puedes explicar addVar", "escribir un endpoint con él", "decirme mi plan?"]),
    ],
)
def test_spanish_messages_with_several_requests_are_split(message: str,
                                                           parts: list[str]) -> None:
    assert texts(message) == parts


@pytest.mark.parametrize(
    "message",
    [
        # one request with several steps
        "take the id, look it up with ormDirect, return the row",
        "build an endpoint that takes a name, uppercases it and then returns it",
        "toma el id, búscalo con ormDirect y devuelve la fila",
        "crea un endpoint que reciba un nombre, lo pase a mayúsculas y luego lo devuelva",
        "Write an endpoint that:\n1. reads the email\n2. checks it with getRegex\n3. answers 400",
        "Escribe un endpoint que:\n- lea el email\n- lo valide con getRegex\n- responda 400",
        "It must 1) read the key 2) hash it 3) return it. Can you write that?",
        # X and Y as one subject
        "compare RequestGet and RequestPost",
        "compara encodeMD5 y encodeSHA256",
        "how do startLoop and endLoop fit together?",
        "¿cómo encajan startLoop y endLoop?",
        "show my invoices for May and June",
        "explain addVar, addParam and addResult",
        "tell me what getRegex is and how it works",
        "dime qué es getRegex y cómo funciona",
        # code or editor text
        "why does this fail?\n```\naddVar(x, 1)\naddResult(y)\n```\nand how do I fix it?",
        "addParam(id, id)\normDirect(q, row)\naddResult(row)\nwhat's wrong here? also fix it",
        "getRegex(s, [a-z]+, m), replace(s, a, b, out). why is out empty?",
        # context, greetings, thanks, examples, remedies, reshapes
        "I'm migrating from Node. How do I read headers in AVAP?",
        "Estoy migrando desde Node. ¿Cómo leo cabeceras en AVAP?",
        "hello there! what does getDateTime return?",
        "what does getDateTime return? cheers!",
        "explain variableToList and show me an example",
        "explica variableToList y dame un ejemplo",
        "why is my loop endless? and how can I fix it?",
        "¿por qué mi bucle no termina? ¿y cómo lo arreglo?",
        "simplify that and translate it into English",
        "simplifícalo y tradúcelo al inglés",
        "write an endpoint that returns the date and explain it",
        "also, what does getQueryParamList return?",
        "por cierto, ¿qué devuelve getQueryParamList?",
        # a question about what the one before asked about; a remedy asked politely
        "what's the difference between getDateTime and getTimeStamp, and when do I use each?",
        "how many calls did I make in May and how does that compare with April?",
        "Why does getRegex(s, [0-9]+, m) give None? Can you fix it?",
        "¿Por qué getRegex(s, [0-9]+, m) da None? ¿Me lo arreglas?",
        "could you summarise that and make it shorter?",
        # "write" / "escribir" making a step, not a deliverable; explaining each line
        "can you read the file and write the result to a variable?",
        "¿puedes leer el fichero y escribir el resultado en otra variable?",
        "explain getListLen and generate a random string with randomString",
        "show me the code for an upload endpoint and explain each line",
        "can you add error handling to it and make the response JSON?",
        # doing the same thing some way; how to do what was just said; "??"
        "Quiero un endpoint que devuelva la hora de Madrid. Hazlo en AVAP.",
        "I want to move to the Business plan, how do I do that?",
        "why did my bill double this month??",
        # "como" / "cuando" that are not questions
        "como te decía, quiero un endpoint que devuelva la hora",
        "cuando llamo a RequestGet, ¿por qué tarda tanto?",
    ],
)
def test_a_single_request_is_not_split(message: str) -> None:
    assert not split(message).multi, texts(message)


@pytest.mark.parametrize(
    "message",
    [
        "explain addVar and then write an endpoint that uses it; also, how much quota left?",
        "¡Gracias! Ahora, ¿qué es ormDirect? y ¿me escribes un endpoint con él?",
        "1. what is addVar\n2. write an endpoint\n\nthanks in advance",
        "see https://example.com/a?b=1, e.g. the docs. What is addVar? Write one with it.",
    ],
)
def test_each_part_is_its_span_of_the_message(message: str) -> None:
    cut = split(message)
    assert cut.parts
    previous_end = 0
    for part in cut.parts:
        assert message[part.start:part.end] == part.text
        assert part.start >= previous_end
        previous_end = part.end


def test_joins_fillers_and_greetings_belong_to_no_part() -> None:
    assert texts("Thanks, that worked. Now, what is getListLen, and could you write a "
                 "loop over a list?") == ["what is getListLen", "could you write a loop "
                                          "over a list?"]
    assert texts("btw what's my plan? and explain startLoop") == ["what's my plan?",
                                                                   "explain startLoop"]


def test_a_single_request_keeps_the_whole_message() -> None:
    message = "  hi! what does addResult do? thanks  "
    (part,) = split(message).parts
    assert (part.text, part.start) == ("hi! what does addResult do? thanks", 2)


def test_a_spanish_join_inside_the_question_mark_is_left_out_of_the_request() -> None:
    first, second = split("¿Qué hace addVar? ¿Y cuánta cuota me queda?").parts
    assert second.text == "¿Y cuánta cuota me queda?"
    assert second.query == "¿cuánta cuota me queda?"
    assert first.query == first.text


def test_an_elliptical_spanish_follow_up_keeps_its_join() -> None:
    _, second = split("¿Qué hace startLoop? ¿y con pasos negativos?").parts
    assert second.query == second.text == "¿y con pasos negativos?"


def test_a_part_pointing_back_says_at_which_and_list_items_share_their_lead_in() -> None:
    first, second = split("explain addVar, then write an endpoint that uses it").parts
    assert (first.refers_to, second.refers_to) == (None, 0)
    items = split("In AVAP:\n1. how do I declare a variable?\n2. how do I loop?").parts
    assert [p.context for p in items] == ["In AVAP:", "In AVAP:"]
    assert items[1].standalone == "In AVAP: how do I loop?"
    announced = split("Two questions:\n1. what is addVar?\n2. what is my plan?").parts
    assert [p.context for p in announced] == ["", ""]


def test_empty_and_blank_messages_are_one_part() -> None:
    assert split("").parts[0].text == ""
    assert len(split("   \n ").parts) == 1


class Judge:
    def __init__(self, verdict: bool | None) -> None:
        self.verdict = verdict
        self.asked: list[tuple[str, str]] = []

    async def separate(self, left: str, right: str) -> bool | None:
        self.asked.append((left, right))
        return self.verdict


async def test_the_judge_is_asked_only_about_uncertain_joins() -> None:
    sure = "What is addVar? Write an endpoint with it."
    judge = Judge(False)
    assert (await split_judged(sure, judge)).multi
    assert judge.asked == []

    terse = "airports in boston and also car rentals in denver"  # no request opener
    assert not split(terse).multi
    assert split(terse).uncertain
    yes = Judge(True)
    cut: Split = await split_judged(terse, yes)
    assert [p.text for p in cut.parts] == ["airports in boston", "car rentals in denver"]
    assert len(yes.asked) == 1
    assert not (await split_judged(terse, Judge(None))).multi
    assert not (await split_judged(terse, None)).multi
