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
_SIGNALS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        # usage percentages of the project / account / plan
        rf"(usage|consumption|quota|plan|limit|project|account)\b[^.?!\n]{{0,40}}{_PCT}",
        rf"{_PCT}[^.?!\n]{{0,40}}\b(usage|used|of (your|my|the) (quota|plan|limit)|consumed)",
        rf"(uso|consumo|cuota|plan|l[ií]mite|proyecto|cuenta)\b[^.?!\n]{{0,40}}{_PCT}",
        rf"{_PCT}[^.?!\n]{{0,40}}\b(de uso|usado|consumido|de (tu|mi|la) (cuota|plan))",
        # call / request counts of the account
        r"\b(how many|number of)\b[^.?!\n]{0,30}\b(api )?(calls|requests)\b[^.?!\n]{0,40}"
        r"\b(i|we|my|our)\b",
        r"\b(my|our)\b[^.?!\n]{0,20}\b(api )?(calls|requests|usage|quota|consumption)\b",
        r"\bcu[aá]nt[ao]s\b[^.?!\n]{0,30}\b(llamadas|peticiones|solicitudes|requests)\b",
        r"\b(llamadas|peticiones|solicitudes)\b[^.?!\n]{0,30}\b(llevo|he hecho|me quedan|"
        r"este mes|consumid[ao]s)\b",
        r"\b(mi|mis|nuestra|nuestro)\s+(cuota|consumo|uso|factura|facturaci[oó]n|plan|"
        r"suscripci[oó]n|l[ií]mite)\b",
        # quotas, limits and billing of the account
        r"\b(my|our)\s+(invoice|bill|billing|subscription|plan|quota|limit|credits?)\b",
        r"\b(remaining|left on)\b[^.?!\n]{0,30}\b(quota|plan|credits?|requests|calls)\b",
        r"\b(quota|rate limit)\b[^.?!\n]{0,30}\b(exceeded|reached|left|remaining)\b",
        r"\bcuota\b[^.?!\n]{0,30}\b(excedida|superada|restante|agotada)\b",
        r"\b(factura|facturaci[oó]n|cobro|cargo)\b[^.?!\n]{0,40}\b(mes|cuenta|tarjeta|plan)\b",
        r"\b(invoice|charged|billing)\b[^.?!\n]{0,40}\b(month|account|card|plan)\b",
    )
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


def has_platform_data(query: str, extra_context: str = "") -> bool:
    """RC-02: usage percentages, account metrics, quotas or billing data.

    Platform data in `extra_context` counts only when the query itself is not about
    AVAP code or docs: a coding question keeps its type whatever the account says.
    """
    if any(p.search(query) for p in _SIGNALS):
        return not _CODE_OR_DOCS.search(query) or _is_account_statement(query)
    return False


def _is_account_statement(query: str) -> bool:
    # "You have a project usage percentage of 20%..." is data even if it says "project".
    return bool(re.search(r"\b(you have|tienes|tu proyecto|your project)\b", query, re.I))


def rules_decide(query: str, extra_context: str = "") -> QueryType | None:
    if has_platform_prefix(query) or has_platform_data(query, extra_context):
        return QueryType.PLATFORM
    return None
