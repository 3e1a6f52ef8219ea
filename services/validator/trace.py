"""The `<parser_feedback>` section injected into the single trace-guided retry (RC-08)."""

from __future__ import annotations

from collections.abc import Iterable

from shared.contracts.parser import TraceCode, TraceLine, is_error

# Enough to fix a typical answer; more lines mostly repeat one cascade and cost tokens.
MAX_LINES = 10

_HEADER = "The previous attempt produced invalid AVAP code. Specific failures:"
_FOOTER = "Correct these errors. Do not repeat the same constructs."


def _line(t: TraceLine) -> str:
    text = f"Line {t.line}: {t.message}"
    if t.suggestion:
        if t.code == TraceCode.UNKNOWN_COMMAND:
            text += f" — did you mean '{t.suggestion}'?"
        else:
            text += f" — use {t.suggestion}"
    # The trace quotes generated code: keep it from closing the section early.
    return text.replace("</parser_feedback", "< /parser_feedback")


def render_parser_feedback(trace: Iterable[TraceLine]) -> str:
    """`<parser_feedback>` text for the retry prompt, or "" if the trace has no errors."""
    errors = [t for t in trace if is_error(t)]
    if not errors:
        return ""
    lines = [_line(t) for t in errors[:MAX_LINES]]
    if len(errors) > MAX_LINES:
        lines.append(f"(and {len(errors) - MAX_LINES} more)")
    body = "\n".join(lines)
    return f"<parser_feedback>\n{_HEADER}\n\n{body}\n\n{_FOOTER}\n</parser_feedback>"
