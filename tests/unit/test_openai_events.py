"""The OpenAI-compatible stream's lines as the generator reads them: text deltas, the
final usage event, and everything else (keep-alives, comments, [DONE], other JSON)
ignored rather than failing the answer."""

from __future__ import annotations

from shared.llm.openai import _sse_event


def test_text_deltas_and_the_usage_event_are_read() -> None:
    event = _sse_event('data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}')
    assert event is not None
    assert [c.delta.content for c in event.choices] == ["Hel"]
    assert event.usage is None
    usage = _sse_event('data: {"choices":[],"usage":{"prompt_tokens":22,'
                       '"completion_tokens":360,"total_tokens":382}}')
    assert usage is not None
    assert usage.usage is not None
    assert (usage.usage.prompt_tokens, usage.usage.completion_tokens) == (22, 360)


def test_lines_that_are_not_chat_events_are_skipped() -> None:
    for line in ("", ": keep-alive", "data: [DONE]", "data:", "event: ping",
                 'data: {"choices": "not a list"}', "data: {garbage",
                 'data: {"choices":[{"delta":{}}]}'):
        event = _sse_event(line)
        assert event is None or not any(c.delta.content for c in event.choices), line
