"""A worker's logs (shared.runtime.logs): JSON lines naming the worker and the handled
message, one start line per worker, no FastStream start line, libraries quiet."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator

import pytest
from opentelemetry.trace import NoOpTracer

from services.retriever.handlers import RetrieverDeps, build_stage
from services.retriever.ports import SearchResult
from services.retriever.settings import RetrieverSettings
from shared.common.settings import CommonSettings, LogFormat, read_env
from shared.contracts.pipeline import Routed
from shared.contracts.routing import QueryType
from shared.runtime.consumer import StageSpec
from shared.runtime.logs import configure_logging, log_context, quiet_libraries
from shared.runtime.worker import Wiring, build_app, start_line
from testkit.fakes import FakeStore, RecordingBus
from testkit.wire import ADMISSION, COMMON, request, routed_decision, run_on_wire

STAGE = build_stage(RetrieverSettings(common=COMMON, relevance_mode="off"))


class FailingSearch:
    """Logs a line from inside the stage's logic, then fails (retryable): the template
    logs its own warning."""

    async def search(self, query: str, k: int) -> SearchResult:
        logging.getLogger("test.search").info("searching %r", query)
        raise ConnectionError("index unreachable")

    async def maybe_reload(self) -> bool:
        return False

    async def close(self) -> None:
        pass


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """The root logger's handler as a worker configures it, writing to a buffer."""
    for name in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY"):
        monkeypatch.delenv(name, raising=False)  # restored after the test
    root = logging.getLogger()
    level = root.level
    out = io.StringIO()
    handler = configure_logging(level="INFO", fmt=LogFormat.JSON, worker="retriever",
                                stream=out)
    yield out
    root.removeHandler(handler)
    root.setLevel(level)


def lines(out: io.StringIO) -> list[dict[str, str]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


async def test_json_lines_name_the_worker_and_the_handled_request(
        captured: io.StringIO) -> None:
    deps = RetrieverDeps(bus=RecordingBus(), store=FakeStore(), tracer=NoOpTracer(),
                         admission=ADMISSION, retrieval=FailingSearch())
    envelope = Routed(request=request("rq-7", "what does addVar do", agent_id="ag-3"),
                      accepted_at=time.time(), decision=routed_decision(QueryType.RETRIEVAL),
                      deadline=time.time() + 60)
    logging.getLogger("test.before").warning("outside any message")
    _, delivery = await run_on_wire(STAGE, envelope, deps)
    assert delivery.nacked  # the retryable failure: logged by the template
    logging.getLogger("test.after").warning("outside again")

    records = lines(captured)  # each line is one JSON object
    for record in records:
        assert {"time", "level", "logger", "message", "worker"} <= record.keys()
        assert record["worker"] == "retriever"
    inside = [r for r in records if r["logger"] not in ("test.before", "test.after")]
    assert {r["logger"] for r in inside} >= {"test.search", "intentroute.stage"}
    assert all(r["request_id"] == "rq-7" and r["agent_id"] == "ag-3" for r in inside)
    outside = [r for r in records if r["logger"] in ("test.before", "test.after")]
    assert len(outside) == 2
    assert all("request_id" not in r and "agent_id" not in r for r in outside)
    assert any(r["level"] == "WARNING" and "rq-7" in r["message"] for r in inside)


def test_a_traceback_stays_inside_its_json_line(captured: io.StringIO) -> None:
    with log_context(request_id="r1"):
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("test.exc").exception("failed")
    (record,) = lines(captured)
    assert record["request_id"] == "r1"
    assert "ValueError: boom" in record["exc"]


def test_text_lines_name_the_worker() -> None:
    out = io.StringIO()
    handler = configure_logging(level="INFO", worker="generator", stream=out)
    try:
        logging.getLogger("test.text").info("hello")
    finally:
        logging.getLogger().removeHandler(handler)
    assert " INFO generator test.text hello" in out.getvalue()


def test_onnxruntime_quantization_lines_on_the_root_logger_are_dropped(
        captured: io.StringIO) -> None:
    root = logging.getLogger()
    noise = root.makeRecord("root", logging.INFO, "/x/site-packages/onnxruntime/quantization/"
                            "onnx_quantizer.py", 1, "Quantization parameters for tensor", (),
                            None)
    root.handle(noise)
    logging.getLogger("onnxruntime.transformers.optimizer").info("fused 12 nodes")
    logging.getLogger("test.own").info("kept")
    assert [r["message"] for r in lines(captured)] == ["kept"]


def test_a_normal_start_shows_nothing_below_warning_from_libraries_and_no_idle_advice(
        captured: io.StringIO) -> None:
    """Issue 31: `up` printed ~20 onnxruntime.transformers lines (`fusion_base Fused
    Gelu: 6`, logged under bare module names) and the quantizer's pre-processing advice
    (a WARNING that asks for nothing). A library's real warning, and the project's own
    INFO lines wherever it is installed, still show."""
    root = logging.getLogger()
    site = "/v/lib/python3.11/site-packages/"

    def emit(name: str, level: int, path: str, message: str) -> None:
        root.handle(logging.getLogger(name).makeRecord(name, level, path, 1, message, (),
                                                       None))

    emit("fusion_base", logging.INFO, site + "onnxruntime/transformers/fusion_base.py",
         "Fused Gelu: 6")
    emit("onnx_model", logging.INFO, site + "onnxruntime/transformers/onnx_model.py",
         "Removed 126 nodes")
    emit("root", logging.WARNING, site + "onnxruntime/quantization/quantize.py",
         "Please consider to run pre-processing before quantization. Refer to example: ...")
    emit("nats", logging.WARNING, site + "nats/aio/client.py", "a real warning")
    emit("intentroute.up", logging.INFO, site + "intentroute/cli/stack_cmds.py", "ours")
    emit("services.retriever.bm25", logging.INFO, site + "services/retriever/bm25.py",
         "ours too")
    assert [r["message"] for r in lines(captured)] == ["a real warning", "ours", "ours too"]


def test_log_level_holds_for_a_library_with_a_level_of_its_own(
        captured: io.StringIO) -> None:
    """bm25s sets DEBUG on its logger at import; Alembic's INFO lines are quieted."""
    import bm25s  # noqa: F401 - its import sets the level

    bm25s_logger = logging.getLogger("bm25s")
    assert bm25s_logger.level == logging.DEBUG
    bm25s_logger.debug("Building index from tokens")
    logging.getLogger("alembic.runtime.plugins").info("setup plugin alembic.ext")
    logging.getLogger("test.own").info("kept")
    assert [r["message"] for r in lines(captured)] == ["kept"]


def test_progress_bars_are_off_when_stderr_is_no_terminal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    import os

    quiet_libraries(Terminal())
    assert "TQDM_DISABLE" not in os.environ
    quiet_libraries(io.StringIO())
    assert os.environ["TQDM_DISABLE"] == "1"
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"


def test_one_start_line_names_the_worker_its_streams_and_consumers() -> None:
    specs = [StageSpec(stream="AGENT_PIPELINE", subject="p.r", durable="retriever",
                       max_inflight=1, ack_wait=30, max_deliver=5),
             StageSpec(stream="AGENT_PIPELINE", subject="p.x", durable="reranker",
                       max_inflight=1, ack_wait=30, max_deliver=5),
             StageSpec(stream="AGENT_FEEDBACK", subject="f", durable="feedback",
                       max_inflight=1, ack_wait=30, max_deliver=5)]
    line = start_line("gateway", specs)
    assert line == ("worker gateway started: stream AGENT_PIPELINE consumer retriever, "
                    "reranker; stream AGENT_FEEDBACK consumer feedback")
    assert "\n" not in line


async def test_faststream_logs_no_start_line_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def make_deps(wiring: Wiring) -> RetrieverDeps:
        raise AssertionError("not started")

    root = logging.getLogger()
    level = root.level
    app = build_app(service="retriever", common=COMMON, stages=[STAGE], make_deps=make_deps)
    out = io.StringIO()
    handler = configure_logging(level="DEBUG", worker="retriever", stream=out)
    try:
        async with app._startup_logging():  # what FastStream logs around a start
            pass
        async with app._shutdown_logging():
            pass
        logging.getLogger("test.own").info("kept")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    assert "FastStream" not in out.getvalue()
    assert "kept" in out.getvalue()


def test_log_format_is_read_from_the_environment() -> None:
    assert read_env(CommonSettings, {"LOG_FORMAT": "json"}).log_format is LogFormat.JSON
    assert read_env(CommonSettings, {}).log_format is LogFormat.TEXT
    with pytest.raises(ValueError, match="LOG_FORMAT"):
        read_env(CommonSettings, {"LOG_FORMAT": "xml"})


def test_asyncpgs_reconnect_attempts_are_one_line_each() -> None:
    # Postgres gone (a kill -9 of `up`, a restart): the pool retries and logged each
    # attempt with a traceback of its own code.
    out = io.StringIO()
    handler = configure_logging(level="INFO", worker="gateway", stream=out)
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError:
            logging.getLogger("asyncpg.pool").warning(
                "Failed to restore the pool connection floor; retrying", exc_info=True)
    finally:
        logging.getLogger().removeHandler(handler)
    text = out.getvalue()
    assert "Traceback" not in text
    assert text.count("\n") == 1
    assert ("asyncpg.pool Failed to restore the pool connection floor; retrying: "
            "ConnectionRefusedError: [Errno 111] Connection refused") in text
