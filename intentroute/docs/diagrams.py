"""The architecture diagrams of the site, drawn as SVG from declared components and
arrows (`docs/diagrams/*.svg`, `intentroute docs diagrams`).

A diagram is data: boxes placed on a grid and arrows between them, each with a label.
`render()` writes plain SVG 1.1 with no script, no web font and no external reference,
so the pages show it offline and the repository host shows it as it is; the same
declarations give the same bytes on every run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

DEFAULT_OUT = Path("docs/diagrams")

# Fill and stroke per kind of box; the legend names them.
KINDS: Mapping[str, tuple[str, str, str]] = {
    "caller": ("#fff4d6", "#b7791f", "callers"),
    "door": ("#fde8e8", "#c53030", "doors (clients of the pipeline)"),
    "stage": ("#e6f0ff", "#2b6cb0", "worker types (each scaled on its own)"),
    "stream": ("#eef7ee", "#2f855a", "JetStream streams"),
    "store": ("#f3ecfb", "#6b46c1", "stores and services"),
    "job": ("#f0f0f0", "#4a5568", "jobs and operator commands"),
}
FONT = "font-family=\"DejaVu Sans, Verdana, Arial, sans-serif\""
CHAR = 6.6  # px per character at 12 px, for label backgrounds


@dataclass(frozen=True)
class Box:
    key: str
    lines: tuple[str, ...]
    x: int
    y: int
    w: int
    h: int
    kind: str


@dataclass(frozen=True)
class Arrow:
    src: str
    dst: str
    label: str = ""
    dashed: bool = False
    # Where the label sits along the arrow (0: at src, 1: at dst).
    at: float = 0.5
    # Pixels the arrow is moved sideways from the middle of the band the boxes share
    # (two arrows between the same boxes).
    shift: int = 0


@dataclass(frozen=True)
class Diagram:
    name: str
    title: str
    width: int
    height: int
    boxes: tuple[Box, ...]
    arrows: tuple[Arrow, ...]
    caption: str = ""


def _box(key: str, text: str, x: int, y: int, kind: str, w: int = 170,
         h: int = 0) -> Box:
    lines = tuple(text.split("\n"))
    return Box(key, lines, x, y, w, h or 18 + 16 * len(lines), kind)


ARCHITECTURE = Diagram(
    name="architecture",
    title="intentroute: the workers, the bus and the stores",
    width=1300, height=640,
    boxes=(
        _box("agent", "agent\n(a platform backend,\nan IDE: any NATS\nclient, any language)",
             20, 40, "caller", w=190, h=260),
        _box("client", "HTTP / gRPC clients\n(OpenAI SDK, grpcurl,\na browser)", 20, 390,
             "caller", w=190),
        _box("requests", "AGENT_REQUESTS\nagent.request.<agent>", 280, 40, "stream",
             w=190),
        _box("doors", "doors\ngRPC · OpenAI-compatible\nHTTP feedback · dashboard", 280, 390,
             "door", w=190),
        _box("gateway", "gateway\nadmission · fair share\nlimits · replay · feedback",
             540, 40, "stage", w=190),
        _box("responses", "AGENT_RESPONSES\nagent.response.<agent>.<id>", 540, 240,
             "stream", w=190),
        _box("classifier", "classifier\nrules, Layer 2, Layer 3\nclarity gate", 840, 40,
             "stage", w=200),
        _box("retriever", "retriever\nhybrid search\nrelevance check", 840, 146, "stage",
             w=200),
        _box("generators", "generators\nmain · conversational\n(a worker type per slot)",
             840, 252, "stage", w=200),
        _box("validator", "validator\nparser gate, breaker", 840, 372, "stage", w=200),
        _box("index", "index\nembedded, or Elasticsearch", 1110, 146, "store", w=170),
        _box("models", "model servers\nOllama · OpenAI-compatible\nllama.cpp (up --llm)",
             1110, 252, "store", w=170),
        _box("parser", "AVAP parser\n(gRPC)", 1110, 372, "store", w=170),
        _box("postgres", "PostgreSQL\nsessions · history · request log\npolicies · limits"
             " · scores", 730, 500, "store", w=310),
        _box("learn", "operator jobs\nlearning job, reports,\nretention, migrations",
             280, 500, "job", w=190),
    ),
    arrows=(
        Arrow("agent", "requests", "publish"),
        Arrow("requests", "gateway", "its turn"),
        Arrow("gateway", "classifier", "stage.classify"),
        Arrow("classifier", "retriever", "stage.retrieve"),
        Arrow("retriever", "generators", "stage.generate.<slot>"),
        Arrow("generators", "validator", "stage.validate"),
        Arrow("generators", "responses", "chunks"),
        Arrow("validator", "responses", "final chunk", at=0.4),
        Arrow("responses", "agent", "subscribe, replay", at=0.3),
        Arrow("client", "doors", "bearer token"),
        Arrow("doors", "requests", "as the agent", at=0.2),
        Arrow("responses", "doors", "follow", at=0.45),
        Arrow("retriever", "index"),
        Arrow("generators", "models"),
        Arrow("validator", "parser"),
        Arrow("classifier", "models", "Layer 3", dashed=True, at=0.8),
        Arrow("validator", "postgres", "turn rows (every stage reads and writes)",
              dashed=True),
        Arrow("learn", "postgres", "rollups, scores, proposals", dashed=True),
    ),
    caption="Every hand-off (stage.*) is a message of INTENTROUTE_PIPELINE on a durable "
            "pull consumer that the stage's replicas share.",
)

REQUEST_FLOW = Diagram(
    name="request-flow",
    title="One request: the subjects it crosses",
    width=1480, height=480,
    boxes=(
        _box("agent", "agent", 20, 40, "caller", w=110),
        _box("gateway", "gateway\nadmission stamp, deadline", 280, 30, "stage", w=190),
        _box("classifier", "classifier\ntype, layer, confidence", 620, 30, "stage",
             w=200),
        _box("conv", "generator-conversational\nCONVERSATIONAL, PLATFORM", 980, 30, "stage",
             w=220),
        _box("history", "classify_history\n(the last 6 entries)", 280, 200, "store",
             w=190),
        _box("retriever", "retriever\nRETRIEVAL, CODE_GENERATION", 620, 200, "stage",
             w=200),
        _box("main", "generator-main\nRETRIEVAL, CODE_GENERATION", 980, 200, "stage",
             w=220),
        _box("validator", "validator\nCODE_GENERATION only", 980, 370, "stage", w=220),
        _box("answer", "agent.response.\n<agent>.<request_id>\n\nchunks in seq order,\n"
             "exactly one final", 1300, 30, "stream", w=160, h=392),
    ),
    arrows=(
        Arrow("agent", "gateway", "agent.request.<agent>"),
        Arrow("gateway", "classifier", "stage.classify"),
        Arrow("classifier", "conv", "generate.conversational\n(RC-04: no retrieval)"),
        Arrow("classifier", "retriever", "stage.retrieve"),
        Arrow("classifier", "history", "deictic only (RC-03)", dashed=True),
        Arrow("retriever", "main", "generate.main"),
        Arrow("main", "validator", "stage.validate", shift=-50),
        Arrow("validator", "main", "one trace-guided\nretry (RC-07, RC-08)", dashed=True,
              shift=50),
        Arrow("conv", "answer", "chunks"),
        Arrow("main", "answer", "chunks"),
        Arrow("validator", "answer", "validated code"),
    ),
    caption="Each hand-off is a JetStream message on intentroute.stage.*; a stage that "
            "dies mid-answer is replaced by another replica, which sends a reset chunk.",
)

DIAGRAMS = (ARCHITECTURE, REQUEST_FLOW)


def _center(box: Box) -> tuple[float, float]:
    return box.x + box.w / 2, box.y + box.h / 2


def _edge(box: Box, toward: tuple[float, float]) -> tuple[float, float]:
    """Where the line from the box's centre toward a point leaves the box."""
    cx, cy = _center(box)
    dx, dy = toward[0] - cx, toward[1] - cy
    if dx == 0 and dy == 0:
        return cx, cy
    scale = min((box.w / 2) / abs(dx) if dx else float("inf"),
                (box.h / 2) / abs(dy) if dy else float("inf"))
    return cx + dx * scale, cy + dy * scale


def _ends(src: Box, dst: Box, shift: int = 0) -> tuple[float, float, float, float]:
    """The arrow's two ends: straight across when the boxes face each other over a
    shared band (at its middle), else from centre to centre, cut at the borders."""
    top, bottom = max(src.y, dst.y), min(src.y + src.h, dst.y + dst.h)
    if bottom - top > 10 and (src.x + src.w < dst.x or dst.x + dst.w < src.x):
        y = (top + bottom) / 2 + shift
        if src.x < dst.x:
            return src.x + src.w, y, dst.x, y
        return src.x, y, dst.x + dst.w, y
    left, right = max(src.x, dst.x), min(src.x + src.w, dst.x + dst.w)
    if right - left > 10 and (src.y + src.h < dst.y or dst.y + dst.h < src.y):
        x = (left + right) / 2 + shift
        if src.y < dst.y:
            return x, src.y + src.h, x, dst.y
        return x, src.y, x, dst.y + dst.h
    x1, y1 = _edge(src, _center(dst))
    x2, y2 = _edge(dst, _center(src))
    return x1, y1, x2, y2


def _n(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def svg(diagram: Diagram) -> str:
    boxes = {b.key: b for b in diagram.boxes}
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{diagram.width}" '
        f'height="{diagram.height}" viewBox="0 0 {diagram.width} {diagram.height}" '
        f'role="img" aria-labelledby="title-{diagram.name}">',
        f'<title id="title-{diagram.name}">{escape(diagram.title)}</title>',
        "<defs>",
        '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
        'fill="#4a5568"/></marker>',
        "</defs>",
        f'<rect width="{diagram.width}" height="{diagram.height}" fill="#ffffff"/>',
    ]
    labels: list[str] = []
    for arrow in diagram.arrows:
        src, dst = boxes[arrow.src], boxes[arrow.dst]
        x1, y1, x2, y2 = _ends(src, dst, arrow.shift)
        dash = ' stroke-dasharray="5 4"' if arrow.dashed else ""
        out.append(f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" '
                   f'stroke="#4a5568" stroke-width="1.4"{dash} marker-end="url(#arrow)"/>')
        if arrow.label:
            lx, ly = x1 + (x2 - x1) * arrow.at, y1 + (y2 - y1) * arrow.at
            rows = arrow.label.split("\n")
            width = max(len(r) for r in rows) * CHAR * 11 / 12 + 8
            height = 14 * len(rows) + 4
            labels.append(f'<rect x="{_n(lx - width / 2)}" y="{_n(ly - height / 2)}" '
                          f'width="{_n(width)}" height="{_n(height)}" rx="3" '
                          'fill="#ffffff" fill-opacity="0.9"/>')
            for i, row in enumerate(rows):
                ty = ly - height / 2 + 13 + 14 * i
                labels.append(f'<text x="{_n(lx)}" y="{_n(ty)}" text-anchor="middle" '
                              f'{FONT} font-size="11" fill="#2d3748">{escape(row)}</text>')
    for box in diagram.boxes:
        fill, stroke, _ = KINDS[box.kind]
        out.append(f'<rect x="{box.x}" y="{box.y}" width="{box.w}" height="{box.h}" '
                   f'rx="6" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>')
        for i, line in enumerate(box.lines):
            weight = ' font-weight="bold"' if i == 0 else ""
            size = 13 if i == 0 else 11
            out.append(f'<text x="{_n(box.x + box.w / 2)}" y="{box.y + 20 + 16 * i}" '
                       f'text-anchor="middle" {FONT} font-size="{size}"{weight} '
                       f'fill="#1a202c">{escape(line)}</text>')
    out += labels
    used = [k for k in KINDS if any(b.kind == k for b in diagram.boxes)]
    x = 20
    y = diagram.height - 22
    for kind in used:
        fill, stroke, name = KINDS[kind]
        out.append(f'<rect x="{x}" y="{y - 11}" width="14" height="14" rx="3" '
                   f'fill="{fill}" stroke="{stroke}"/>')
        out.append(f'<text x="{x + 20}" y="{y}" {FONT} font-size="11" '
                   f'fill="#2d3748">{escape(name)}</text>')
        x += 34 + int(len(name) * CHAR * 11 / 12)
    if diagram.caption:
        out.append(f'<text x="20" y="{diagram.height - 44}" {FONT} font-size="11" '
                   f'font-style="italic" fill="#4a5568">{escape(diagram.caption)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def render() -> dict[str, str]:
    """File name -> SVG, for every diagram."""
    return {f"{d.name}.svg": svg(d) for d in DIAGRAMS}
