"""Layer 1: deterministic rules (RC-01 platform prefix, RC-02 platform data signals).

O(1) in the number of rules that matter: one lowercase pass and a few compiled
regexes, no model.
"""

from __future__ import annotations

import re

from shared.contracts.routing import QueryType

# RC-01: prefixes injected by the platform itself (not user input). Adding one is a
# code change plus an update of the list in ADR-0008 RC-01.
PLATFORM_PREFIXES: tuple[str, ...] = ("you are a direct and concise assistant",)

_PCT = r"\d{1,3}(?:[.,]\d+)?\s?%"
# RC-02 signals, English and Spanish. Each needs account/usage vocabulary next to
# the figure, so "AVAP code that applies a 20% discount" is not platform data.
# Each pattern is paired with literal substrings one of which it cannot match
# without: a C-level `in` check skips the regex for most messages.
_SIGNAL_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    # usage percentages of the project / account / plan
    (("%",), rf"(usage|consumption|quota|plan|limit|project|account)\b[^.?!\n]{{0,40}}{_PCT}"),
    (("%",), rf"{_PCT}[^.?!\n]{{0,40}}\b(usage|used|of (your|my|the) (quota|plan|limit)|"
             r"consumed)"),
    (("%",), rf"(uso|consumo|cuota|plan|l[ií]mite|proyecto|cuenta)\b[^.?!\n]{{0,40}}{_PCT}"),
    (("%",), rf"{_PCT}[^.?!\n]{{0,40}}\b(de uso|usado|consumido|de (tu|mi|la) (cuota|plan))"),
    # call / request counts of the account
    (("how many", "number of"),
     r"\b(how many|number of)\b[^.?!\n]{0,30}\b(api )?(calls|requests)\b[^.?!\n]{0,40}"
     r"\b(i|we|my|our)\b"),
    (("my", "our"),
     r"\b(my|our)\b[^.?!\n]{0,20}\b(api )?(calls|requests|usage|quota|consumption)\b"),
    (("cuánt", "cuant"),
     r"\bcu[aá]nt[ao]s\b[^.?!\n]{0,30}\b(llamadas|peticiones|solicitudes|requests)\b"),
    (("llamadas", "peticiones", "solicitudes"),
     r"\b(llamadas|peticiones|solicitudes)\b[^.?!\n]{0,30}\b(llevo|he hecho|me quedan|"
     r"este mes|consumid[ao]s)\b"),
    (("mi", "nuestr"),
     r"\b(mi|mis|nuestra|nuestro)\s+(cuota|consumo|uso|factura|facturaci[oó]n|plan|"
     r"suscripci[oó]n|l[ií]mite)\b"),
    # quotas, limits and billing of the account
    (("my", "our"),
     r"\b(my|our)\s+(invoice|bill|billing|subscription|plan|quota|limit|credits?)\b"),
    (("remaining", "left on"),
     r"\b(remaining|left on)\b[^.?!\n]{0,30}\b(quota|plan|credits?|requests|calls)\b"),
    (("quota", "rate limit"),
     r"\b(quota|rate limit)\b[^.?!\n]{0,30}\b(exceeded|reached|left|remaining)\b"),
    (("cuota",), r"\bcuota\b[^.?!\n]{0,30}\b(excedida|superada|restante|agotada)\b"),
    (("factura", "cobro", "cargo"),
     r"\b(factura|facturaci[oó]n|cobro|cargo)\b[^.?!\n]{0,40}\b(mes|cuenta|tarjeta|plan)\b"),
    (("invoice", "charged", "billing"),
     r"\b(invoice|charged|billing)\b[^.?!\n]{0,40}\b(month|account|card|plan)\b"),
)
_SIGNALS = tuple((triggers, re.compile(p, re.IGNORECASE)) for triggers, p in _SIGNAL_RULES)
_OWN_TRIGGERS = ("my", "our", "mi", "nuestr", "recibo", "receipt", "tarjeta", "card", "tengo",
                 "i have", "have i",
                 "suspend", "cancel", "block", "bloque", "tarifa", "plan")
# Every trigger, for one C-level pass (`map` over a bound method, no Python loop):
# most messages stop there.
_ALL_TRIGGERS = tuple(sorted(
    {t for triggers, _ in _SIGNAL_RULES for t in triggers} | set(_OWN_TRIGGERS)))
# The user's own account named outright: platform even next to code words
# ("does RequestGet in my endpoints count against my quota?"), unless code is asked for.
_OWN_ACCOUNT = re.compile(
    r"\b(my|our)\s+(quota|invoice|bill|billing|subscription|plan|credits|usage|consumption|"
    r"account balance|rate limit)\b|"
    r"\b(mi|mis|nuestra|nuestro)\s+(cuota|factura|facturación|facturacion|suscripción|"
    r"suscripcion|consumo|tarifa|saldo)\b|"
    r"\b(recibo|receipt)\b.{0,40}\b(pago|payment|cobro|charge)\b|"
    r"\b(tarjeta|card)\b.{0,30}\b(rechaz|declin)|"
    r"\b(tengo|do i have|have i got)\b.{0,25}\b(facturas?|invoices?|pagos?|payments?)\b.{0,15}"
    r"\b(pendientes?|sin pagar|unpaid|outstanding|due|overdue)\b|"
    r"\b(suspend\w*|cancel\w*|block\w*|bloque\w*)\b.{0,20}\b(my|mi|la|the) "
    r"(account|cuenta)\b|"
    r"\bqu[eé] (tarifa|plan)\b.{0,25}\b(tengo|tenemos|contratad)",
    re.IGNORECASE,
)
_WRITE_CODE = re.compile(
    r"\b(write|build|create|generate|implement|fix|refactor|escribe|genera|crea|construye|"
    r"implementa|arregla|refactoriza|haz)\b.{0,40}\b(script|code|c[oó]digo|endpoint|"
    r"function|funci[oó]n|program|programa|avap)\b",
    re.IGNORECASE,
)
# Account data injected by the platform into extra_context (key=value figures).
_ACCOUNT_DATA = re.compile(
    r"\b(usage|usage_pct|usage_percentage|quota|plan|calls|calls_used|calls_month|requests|"
    r"invoice\w*|billing|balance|credits|subscription|consumo|cuota|factura)\w*\s*[=:]",
    re.IGNORECASE,
)

# Documentation or code about billing is not platform data (ADR hard negatives).
_CODE_OR_DOCS = re.compile(
    r"\b(avap|addvar|addparam|addresult|requestpost|requestget|ormdirect|startloop|"
    r"script|endpoint|c[oó]digo|code|function|funci[oó]n|docs?|documentation|"
    r"documentaci[oó]n|api reference)\b",
    re.IGNORECASE,
)


def has_platform_prefix(query: str) -> bool:
    """RC-01: a platform-injected prefix anywhere in the query."""
    lowered = query.lower()
    return any(prefix in lowered for prefix in PLATFORM_PREFIXES)


_PREFIX_RE = re.compile("(?:" + "|".join(re.escape(p) for p in PLATFORM_PREFIXES) + r")[.:;,!]?\s*",
                        re.IGNORECASE)


def strip_platform_prefix(query: str) -> str:
    """The query without RC-01 prefixes: what an untrusted agent's message says. (The
    head learned the prefix as a PLATFORM cue; typed by an untrusted agent it must not
    route through any layer.)"""
    return _PREFIX_RE.sub("", query).strip() or query


def has_platform_data(query: str, extra_context: str = "") -> bool:
    """RC-02: usage percentages, account metrics, quotas or billing data.

    Platform data in `extra_context` counts only when the query itself is not about
    AVAP code or docs: a coding question keeps its type whatever the account says.
    """
    lowered = query.lower()
    contains = lowered.__contains__
    if not any(map(contains, _ALL_TRIGGERS)):
        return False
    if (
        any(map(contains, _OWN_TRIGGERS))
        and _OWN_ACCOUNT.search(query)
        and not _WRITE_CODE.search(query)
    ):
        return True
    if any(any(map(contains, triggers)) and rx.search(query) for triggers, rx in _SIGNALS):
        return not _CODE_OR_DOCS.search(query) or _is_account_statement(query)
    return False


def has_account_context(extra_context: str) -> bool:
    """extra_context carries platform account data (usage, quota, plan, billing figures)."""
    return bool(extra_context) and bool(_ACCOUNT_DATA.search(extra_context))


def _is_account_statement(query: str) -> bool:
    # "You have a project usage percentage of 20%..." is data even if it says "project".
    return bool(re.search(r"\b(you have|tienes|tu proyecto|your project)\b", query, re.I))


# An imperative asking for code ("write / fix / refactor ... endpoint|script|function").
_CODE_REQUEST = re.compile(
    r"^\W*(please\s+|pls\s+|can you\s+|could you\s+|puedes\s+|podrías\s+|podrias\s+|"
    r"por favor\s+)?(write|build|create|generate|implement|code|fix|debug|refactor|rewrite|"
    r"escribe|escríbeme|genera|génerame|crea|créame|construye|implementa|programa|arregla|"
    r"corrige|refactoriza|reescribe|hazme|haz)\b.{0,60}\b(script|code|c[oó]digo|endpoint|"
    r"function|funci[oó]n|program|programa|avap|loop|bucle|handler|api)\b",
    re.IGNORECASE,
)


# Pasted code: a call such as `getRegex(code, [A-Z]{3}, m)` or `addResult(x)`.
_CODE_CALL = re.compile(r"\b[a-z]+[A-Z][A-Za-z]*\s*\([^()\n]{0,120}\)|\b\w+\(\s*\)")
# Asking for that code to change, wherever the verb sits ("... arréglalo", "this won't
# compile, can you correct it?"). Explanation verbs stay out: "why does X(...) fail?"
# is left to the later layers.
_CHANGE_VERB = re.compile(
    r"\b(fix|correct|repair|refactor|rewrite|debug|patch|won'?t compile|doesn'?t compile|"
    r"arr[eé]gla(lo|la|me)?|corr[ií]ge(lo|la|me)?|refactoriza(lo|la)?|reescr[ií]be(lo|la)?|"
    r"depura(lo|la)?|no compila)\b",
    re.IGNORECASE,
)
# An AVAP command named in the message ("refactor these three RequestGet calls").
COMMAND_NAME = re.compile(r"\b[a-z]+[A-Z][A-Za-z]+\b|\bRequest(Get|Post)\b")
_CHANGE_FIRST = re.compile(
    r"^\W*(please\s+|can you\s+|could you\s+|puedes\s+|podr[ií]as\s+|por favor\s+)?"
    r"(fix|refactor|rewrite|debug|optimi[sz]e|arregla|corrige|refactoriza|reescribe|"
    r"depura|optimiza)\b",
    re.IGNORECASE,
)


# Nouns that name code (also deixis: code as the object of a reshape verb).
CODE_NOUNS = r"snippet|code|c[oó]digo|script|fragmento|endpoint|bucle|loop"
# "shorten this AVAP snippet": reshaping code is changing code.
_RESHAPE_CODE = re.compile(
    r"^\W*(please\s+|can you\s+|puedes\s+)?(shorten|simplify|optimi[sz]e|clean up|acorta|"
    r"simplifica|optimiza|limpia)\s+(this|that|the|my|mi|este|ese|el)?\s*(avap\s+)?"
    rf"({CODE_NOUNS})\b",
    re.IGNORECASE,
)


def is_code_request(query: str) -> bool:
    """An imperative asking for code, or pasted code / a named command to be changed."""
    if _CODE_REQUEST.search(query) or _RESHAPE_CODE.search(query):
        return True
    if "(" in query and _CODE_CALL.search(query) and _CHANGE_VERB.search(query):
        return True
    return bool(_CHANGE_FIRST.search(query) and COMMAND_NAME.search(query))


def rules_decide(query: str, extra_context: str = "") -> QueryType | None:
    if has_platform_prefix(query) or has_platform_data(query, extra_context):
        return QueryType.PLATFORM
    if is_code_request(query):
        return QueryType.CODE_GENERATION
    return None
