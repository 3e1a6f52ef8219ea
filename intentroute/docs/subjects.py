"""The subjects and messages as a page of the site, rendered from the AsyncAPI document
(`docs/reference/subjects.md`, `intentroute docs subjects`): the operations an agent
performs, every channel with its stream and consumer, every message with its headers
and fields, and the types the fields use. `render(document)` is a pure function of the
document `intentroute docs asyncapi` writes (intentroute.docs.asyncapi.document)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from intentroute.docs.markdown import GENERATED, code, table, text

DEFAULT_OUT = Path("docs/reference/subjects.md")
REF = "#/components/"


def _name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _anchor(name: str) -> str:
    """The id the site's table of contents gives a heading that is just `name`."""
    return name.lower()


def _message_anchor(name: str) -> str:
    return f"{name.lower()}-message"


def _type(schema: Mapping[str, Any]) -> str:
    """A field's type as Markdown: a named type links to its section."""
    if "$ref" in schema:
        name = _name(schema["$ref"])
        return f"[{name}](#{_anchor(name)})"
    if "anyOf" in schema:
        kinds = [_type(s) for s in schema["anyOf"]]
        return " or ".join(kinds)
    kind = schema.get("type", "any")
    if kind == "array":
        if "prefixItems" in schema:  # a tuple (an array-like struct): its fields in order
            return "[" + ", ".join(_type(s) for s in schema["prefixItems"]) + "]"
        items = schema.get("items", {})
        return f"array of {_type(items) if isinstance(items, Mapping) else 'any'}"
    if kind == "object" and "additionalProperties" in schema:
        return f"map of {_type(schema['additionalProperties'])}"
    if "enum" in schema:
        return " \\| ".join(code(json.dumps(v)) for v in schema["enum"])
    return str(kind)


def _constraints(schema: Mapping[str, Any]) -> str:
    said = []
    for key, word in (("minLength", "min length"), ("maxLength", "max length"),
                      ("minimum", "min"), ("maximum", "max"), ("pattern", "pattern")):
        if key in schema:
            said.append(f"{word} {code(str(schema[key]))}")
    if "contentMediaType" in schema:
        said.append(code(schema["contentMediaType"]))
    return ", ".join(said)


def _fields(schema: Mapping[str, Any]) -> list[str]:
    required = set(schema.get("required", []))
    rows = []
    for name, prop in schema.get("properties", {}).items():
        default = code(json.dumps(prop["default"])) if "default" in prop else ""
        notes = " ".join(x for x in (text(prop.get("description", "")),
                                     _constraints(prop)) if x)
        rows.append((code(name), _type(prop), "yes" if name in required else "",
                     default, notes))
    return table(("field", "type", "required", "default", "notes"), rows)


def _paragraphs(value: str) -> list[str]:
    """Authored Markdown (the document's descriptions), kept as written."""
    return [" ".join(p.split()) for p in value.split("\n\n") if p.strip()]


def render(document: Mapping[str, Any]) -> str:
    components = document["components"]
    channels: Mapping[str, Any] = document["channels"]
    messages: Mapping[str, Any] = components["messages"]
    schemas: Mapping[str, Any] = components["schemas"]
    info = document["info"]
    lines = [
        GENERATED.format(command="subjects", source="shared/contracts or "
                         "intentroute/docs/catalogue.py"), "",
        "# Subjects and messages", "",
        f"{text(info['title'])} {text(info['version'])}, AsyncAPI {document['asyncapi']}: "
        "this page renders the document "
        "[`docs/asyncapi/asyncapi.json`](../asyncapi/asyncapi.json) (one JSON Schema per "
        "message beside it in `docs/asyncapi/schemas/`), which `intentroute docs asyncapi` "
        "generates from the contracts. The [NATS door](../guides/doors/nats.md) guide "
        "shows how an agent uses them.", "",
    ]
    lines += [p + "\n" for p in _paragraphs(info.get("description", ""))]
    for name, server in document.get("servers", {}).items():
        lines += [f"Server `{name}`: {text(server['protocol'])} at "
                  f"{code(server['host'])}. {text(server.get('description', ''))}", ""]
    for name, scheme in components.get("securitySchemes", {}).items():
        lines += [f"Security `{name}` ({text(scheme['type'])}): "
                  f"{text(scheme.get('description', ''))}", ""]

    lines += ["## Operations", "",
              "What an agent does (the workers' side is in the channels below).", ""]
    rows: list[tuple[str, ...]] = []
    for key, op in document["operations"].items():
        channel = channels[_name(op["channel"]["$ref"])]
        names = [_name(m["$ref"]) for m in op["messages"]]
        rows.append((code(key), op["action"], code(channel["address"]),
                     ", ".join(f"[{n}](#{_message_anchor(n)})" for n in names),
                     text(op.get("summary", ""))))
    lines += table(("operation", "action", "subject", "messages", "what"), rows)

    lines += ["", "## Channels", "",
              "Every subject family, with the stream that stores it and the durable "
              "consumer that reads it. Internal channels are the workers': an agent's "
              "credential may not touch them.", ""]
    rows = []
    for channel in channels.values():
        extra = channel.get("x-intentroute", {})
        stream = extra.get("stream", "")
        stored = f"{code(stream)} ({extra['retention']})" if stream and "retention" in extra \
            else (code(stream) if stream else "— (core NATS)")
        names = [_name(m["$ref"]) for m in channel.get("messages", {}).values()]
        address = code(channel["address"]) if channel["address"] else \
            "the reply subject (an inbox)"
        rows.append((address, stored,
                     code(extra["durable"]) if extra.get("durable") else "",
                     "internal" if extra.get("internal") else "agent",
                     ", ".join(f"[{n}](#{_message_anchor(n)})" for n in names),
                     text(channel.get("description", ""))))
    lines += table(("subject", "stream", "durable", "who", "messages", "what"), rows)

    lines += ["", "### Subject parameters", ""]
    lines += table(("parameter", "what"), (
        (code("{" + name + "}"),
         " ".join(x for x in (text(p.get("description", "")),
                              ("one of " + ", ".join(code(v) for v in p["enum"]))
                              if "enum" in p else "") if x))
        for name, p in components.get("parameters", {}).items()))

    lines += ["", "## Messages", ""]
    for name, message in messages.items():
        lines += [f"### {name} message", ""]
        title = message.get("title", "")
        head = f"**{text(title)}**" if title else ""
        tags = [t["name"] for t in message.get("tags", [])]
        if "internal" in tags:
            head += " (internal)"
        lines += [f"{head}. {text(message.get('summary', ''))}".strip(". ") + ".", ""]
        lines += [p + "\n" for p in _paragraphs(message.get("description", ""))]
        kind = message.get("contentType", document.get("defaultContentType", ""))
        lines += [f"Content type {code(kind)}; "
                  f"schema [`{message.get('x-json-schema', '')}`]"
                  f"(../asyncapi/{message.get('x-json-schema', '')}).", ""]
        headers = message.get("headers", {}).get("properties", {})
        if headers:
            needed = set(message["headers"].get("required", []))
            lines += table(("header", "required", "what"), (
                (code(h), "yes" if h in needed else "", text(p.get("description", "")))
                for h, p in headers.items()))
            lines.append("")
        payload = message.get("payload", {})
        target = schemas.get(_name(payload["$ref"]), {}) if "$ref" in payload else payload
        if target.get("properties"):
            lines += [f"Payload: [{_name(payload['$ref'])}](#{_anchor(_name(payload['$ref']))})"
                      if "$ref" in payload else "Payload:", ""]
        else:
            lines += [f"Payload: {_type(target) if 'type' in target else 'any'}"
                      + (f" ({_constraints(target)})" if _constraints(target) else "")
                      + (f": {text(target['description'])}" if target.get("description")
                         else ""), ""]
        for example in message.get("examples", []):
            body = example["payload"]
            shown = body if isinstance(body, str) else json.dumps(body, indent=2,
                                                                  sort_keys=True)
            lines += [f"Example ({text(example.get('name', ''))}):", "",
                      "```json" if not isinstance(body, str) else "```text", shown, "```",
                      ""]

    lines += ["## Types", "",
              "The structs and enums the messages are made of (msgspec structs in "
              "`shared/contracts/`).", ""]
    for name, schema in schemas.items():
        lines += [f"### {name}", ""]
        if schema.get("description"):
            lines += [text(schema["description"]), ""]
        if schema.get("properties"):
            lines += _fields(schema)
        elif "enum" in schema:
            lines.append("One of " + ", ".join(code(json.dumps(v)) for v in schema["enum"])
                         + ".")
        else:
            lines.append(f"{_type(schema)}"
                         + (f" ({_constraints(schema)})" if _constraints(schema) else "")
                         + ".")
        lines.append("")
    return "\n".join(lines)
