"""Every stream's declaration carries the limits of the settings (no server)."""

from __future__ import annotations

from nats.js.api import DiscardPolicy, RetentionPolicy

from shared.common.limits import StreamLimits
from shared.common.settings import CommonSettings
from shared.contracts import feedback, request
from shared.runtime.streams import stream_configs


def test_the_settings_read_the_stream_limits() -> None:
    settings = CommonSettings.from_env({
        "STREAM_MAX_BYTES": "1000", "STREAM_MAX_MSGS": "10", "STREAM_MAX_AGE": "60",
        "DLQ_MAX_AGE": "120", "STREAM_MAX_PER_AGENT": "3", "STREAM_MAX_CONSUMERS": "7",
        "MAX_SESSIONS_PER_AGENT": "5"})
    assert settings.streams == StreamLimits(max_bytes=1000, max_msgs=10, work_max_age=60,
                                            dead_letter_max_age=120, per_agent=3,
                                            max_consumers=7)
    assert settings.max_sessions_per_agent == 5
    assert CommonSettings.from_env({}).streams == StreamLimits()


def test_every_stream_is_bounded_and_a_full_work_queue_refuses_new_messages() -> None:
    limits = StreamLimits(max_bytes=1000, max_msgs=10, work_max_age=60,
                          dead_letter_max_age=120, per_agent=3, max_consumers=7)
    configs = stream_configs(30, 1, limits)
    assert len(configs) == 8
    for cfg in configs:
        assert (cfg.max_bytes, cfg.max_msgs) == (1000, 10), cfg.name
        # One gateway consumer per active agent on the requests (only the gateway's).
        assert cfg.max_consumers == (-1 if cfg.name == request.STREAM else 7), cfg.name
        work = cfg.retention == RetentionPolicy.WORK_QUEUE
        # Queued work is never dropped to make room; stored answers age out oldest first.
        assert cfg.discard == (DiscardPolicy.NEW if work else DiscardPolicy.OLD), cfg.name
        # Turn rows waiting for Postgres are kept as long as dead letters.
        kept = {"INTENTROUTE_DLQ": 120, "TURN_ROWS": 120}
        assert cfg.max_age == kept.get(cfg.name or "", 60 if work else 30)
    per_agent = {c.name: (c.max_msgs_per_subject, c.discard_new_per_subject) for c in configs}
    assert per_agent.pop(request.STREAM) == (3, True)
    assert per_agent.pop(feedback.STREAM) == (3, True)
    assert per_agent.pop("KV_LLM_CIRCUITS") == (1, False)  # one circuit per backend
    assert all(limit == (-1, False) for limit in per_agent.values()), per_agent
