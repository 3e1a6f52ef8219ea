"""A constrained answer: one JSON object `{key: option}`, the option one of a fixed set,
in the form each server constrains output with: a JSON schema (Ollama's `format`,
OpenAI's `response_format`) or a GBNF grammar (llama.cpp's `grammar` field)."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec


class Choice(msgspec.Struct, frozen=True):
    key: str
    options: tuple[str, ...]

    def schema(self) -> dict[str, Any]:
        """The JSON schema of the answer."""
        return {"type": "object",
                "properties": {self.key: {"type": "string", "enum": list(self.options)}},
                "required": [self.key], "additionalProperties": False}

    def grammar(self) -> str:
        """The answer as a GBNF grammar with no free whitespace: llama.cpp's grammar from
        the JSON schema allows up to 21 whitespace characters between tokens, and
        SmolLM2-135M spends them all (24 tokens of spaces after the label, measured),
        while this one ends right after the label: ~8 tokens in all."""
        options = " | ".join(json.dumps(option) for option in self.options)
        opening = json.dumps(f'{{"{self.key}": "')
        return f'root ::= {opening} ({options}) "\\"}}"\n'

    def parse(self, text: str) -> str | None:
        """The option the answer names, None when it names none. An answer cut short after
        the option (a schema-constrained server out of tokens in trailing whitespace)
        still names it."""
        try:
            value = json.loads(text).get(self.key)
        except (ValueError, AttributeError):
            found = re.search(rf'"{re.escape(self.key)}"\s*:\s*"([^"]*)"', text)
            value = found.group(1) if found else None
        return value if isinstance(value, str) and value in self.options else None
