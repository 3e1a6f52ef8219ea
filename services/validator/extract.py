"""Pull the AVAP program out of a generated answer."""

from __future__ import annotations

import re

_FENCE = re.compile(r"```([a-zA-Z]*)\n(.*?)```", re.DOTALL)


def extract_avap_code(answer: str) -> str:
    blocks = _FENCE.findall(answer)
    for lang, body in blocks:
        if lang.lower() == "avap":
            return str(body).strip()
    return str(blocks[0][1]).strip() if blocks else ""
