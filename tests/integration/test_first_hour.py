"""The first hour of a newcomer (issue 31), on one real `intentroute up --demo --grpc`
started as `make run` starts it, in a fresh folder with nothing set: the ready screen
comes and its URLs answer, its dashboard link logs a real browser in once and is
refused after, the quick start's commands work as written, in order, from the stack's
folder, from a sub-folder and from another folder with INTENTROUTE_HOME (the session
example included), `agent add myapp --out myapp.json` works beside the running `up`,
the Python example of the NATS page runs as written, `status` fits 60 and 80 columns,
and the start printed no library line below WARNING.

One `up` serves the module (starting one takes tens of seconds)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.browser import LAUNCH_ARGS, find_chromium
from intentroute.stack.state import StackInfo, read_state

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent.parent
BIN = Path(sys.executable).parent
QUICK_START = (REPO / "docs" / "tutorials" / "quick-start.md").read_text(encoding="utf-8")
NATS_PAGE = (REPO / "docs" / "guides" / "doors" / "nats.md").read_text(encoding="utf-8")
CHROMIUM = find_chromium()


@dataclass
class Stack:
    folder: Path  # where `up` runs: the state folder is folder/.intentroute
    info: StackInfo
    log: Path
    out: Path

    @property
    def home(self) -> Path:
        return self.folder / ".intentroute"


def clean_env(**extra: str) -> dict[str, str]:
    """A newcomer's environment: nothing of intentroute's set, the venv on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NATS_", "DATABASE_", "INTENTROUTE_", "GATEWAY_", "OLLAMA_",
                                "OPENAI_", "LLM_", "COLUMNS"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", HF_HUB_OFFLINE="1", **extra)
    return env


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("newcomer") / "project"
    folder.mkdir()
    (folder / "examples").symlink_to(REPO / "examples")
    log, out = folder.parent / "up.log", folder.parent / "up.out"
    with log.open("wb") as err, out.open("wb") as stdout:
        proc = subprocess.Popen([str(BIN / "intentroute"), "up", "--demo", "--grpc"],
                                cwd=folder, env=clean_env(), stdout=stdout, stderr=err)
    try:
        deadline = time.monotonic() + 300
        info = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            if (folder / ".intentroute" / "stack.json").exists():
                info = read_state(folder / ".intentroute")
                if info is not None and info.ready is not None:
                    break
            time.sleep(0.25)
        assert info is not None, log.read_text(errors="replace")[-3000:]
        assert info.ready is not None, log.read_text(errors="replace")[-3000:]
        yield Stack(folder, info, log, out)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(90)


def quick_start_lines() -> list[str]:
    """The shell lines of the quick start's "Ask it something", in order."""
    section = QUICK_START.split("## 2. Ask it something", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the quick start shows its commands"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines()
            if line.strip()]


def run(line: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A docs line as a person types it, in `cwd` (`.venv/bin/intentroute` is the venv's
    wherever the person is)."""
    args = shlex.split(line)
    if args[0].endswith("intentroute"):
        args[0] = str(BIN / "intentroute")
    return subprocess.run(args, cwd=cwd, env=clean_env(**env), capture_output=True,
                          text=True, timeout=300)


def test_the_ready_screen_says_what_to_do_and_stack_json_holds_it(stack: Stack) -> None:
    ready = stack.info.ready
    assert ready is not None
    out = stack.out.read_text(encoding="utf-8")
    assert "intentroute is ready:" in out  # plain lines: not a terminal
    assert f"  ask: {ready.ask}" in out
    assert ready.ask.endswith('ask "How do I loop from 1 to 10 in AVAP?"')
    assert ready.add_agent.endswith("agent add myapp --out myapp.json")
    assert f"base_url={stack.info.gateway_http_url}/v1 api_key={ready.openai_api_key}" in out
    assert ready.openai_api_key == json.loads(
        (stack.home / "creds" / "demo.json").read_text())["token"]
    assert ready.grpc_address == stack.info.gateway_grpc_address
    assert ready.dashboard_login_url.startswith(f"{stack.info.dashboard_url}/login/")
    assert f"state: {stack.home} " in out
    # Absolute, whatever folder `up` was started in.
    for path in (stack.info.dashboard_token_file, stack.info.nats_config,
                 stack.info.metrics_targets):
        assert Path(path).is_absolute(), path
        assert Path(path).exists(), path


def test_the_ready_screens_urls_answer(stack: Stack) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from openai import OpenAI

    ready = stack.info.ready
    assert ready is not None
    client = OpenAI(base_url=ready.openai_base_url, api_key=ready.openai_api_key)
    assert "intentroute" in [m.id for m in client.models.list()]
    reply = client.chat.completions.create(
        model="intentroute", messages=[{"role": "user", "content": "What does addParam do?"}])
    assert "addParam" in (reply.choices[0].message.content or "")
    with grpc.insecure_channel(ready.grpc_address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.skipif(CHROMIUM is None, reason=(
    "no Chromium found: `make browser` installs Debian's chromium package "
    "(or set INTENTROUTE_CHROMIUM to a Chromium binary)"))
async def test_the_dashboard_link_logs_a_browser_in_once(stack: Stack) -> None:
    from playwright.async_api import async_playwright

    ready = stack.info.ready
    assert ready is not None
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            first = await browser.new_page()
            await first.goto(ready.dashboard_login_url)
            await first.wait_for_selector('body[data-ready="1"]', timeout=30_000)
            assert first.url == stack.info.dashboard_url  # the link is gone from the bar
            # A 30-day window with today's data only: the charts are today's, not a grid
            # of 30 days with one bar at the edge.
            spans = await first.evaluate(
                "Object.values(Chart.instances).map(c => c.data.labels.length)")
            assert spans, "the charts are drawn"
            assert max(spans) <= 2, spans  # today (and yesterday, past midnight UTC)
            again = await (await browser.new_context()).new_page()
            response = await again.goto(ready.dashboard_login_url)
            assert response is not None
            assert response.status == 401
            assert "used already or has expired" in await again.inner_text("#login-error")
            assert await again.locator('input[name="token"]').count() == 1
        finally:
            await browser.close()


@pytest.mark.parametrize("where", ["the stack's folder", "a sub-folder", "INTENTROUTE_HOME"])
def test_the_quick_start_works_as_written(stack: Stack, where: str) -> None:
    if where == "the stack's folder":
        cwd, env = stack.folder, {}
    elif where == "a sub-folder":
        cwd, env = stack.folder / "src" / "deep", {}
        cwd.mkdir(parents=True, exist_ok=True)
        (cwd / "examples").symlink_to(REPO / "examples")
    else:
        cwd, env = stack.folder.parent / "elsewhere", {"INTENTROUTE_HOME": str(stack.home)}
        cwd.mkdir(exist_ok=True)
        (cwd / "examples").symlink_to(REPO / "examples")
    lines = quick_start_lines()
    assert len(lines) == 6, lines
    for line in lines:
        done = run(line, cwd, **env)
        assert done.returncode == 0, (where, line, done.stderr)
        assert done.stdout.strip(), (where, line, done.stderr)
        if "en menos palabras" in line:  # the session's first answer, reshaped
            assert "There is no previous answer" not in done.stdout, done.stdout
            assert "built from the previous answer" in done.stdout, done.stdout
            assert "type=CONVERSATIONAL" in done.stderr, done.stderr


def test_an_agent_is_added_beside_the_running_up_as_the_readme_says(stack: Stack) -> None:
    done = run(".venv/bin/intentroute agent add myapp --out myapp.json", stack.folder)
    assert done.returncode == 0, done.stderr
    cred = json.loads((stack.folder / "myapp.json").read_text())
    assert cred["agent_id"] == "myapp"
    asked = run('.venv/bin/intentroute ask "hello!" --creds myapp.json', stack.folder)
    assert asked.returncode == 0, asked.stderr
    # An untrusted agent's declared type is ignored, and the plain output says so.
    declared = run('.venv/bin/intentroute ask "What does addParam do?" --creds myapp.json '
                   '--query-type PLATFORM', stack.folder)
    assert declared.returncode == 0, declared.stderr
    assert "--query-type PLATFORM ignored: only a trusted agent's declared type" in (
        declared.stderr)


def test_the_python_example_runs_as_written(stack: Stack, tmp_path: Path) -> None:
    block = re.search(r"```python\n(# python ask\.py CREDENTIAL\.json .*?)```", NATS_PAGE,
                      re.S)
    assert block, "the NATS page shows the Python example"
    assert len(block.group(1).splitlines()) <= 20
    (tmp_path / "ask.py").write_text(block.group(1), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "ask.py", str(stack.home / "creds" / "demo.json"),
         "How do I loop from 1 to 10 in AVAP?"], cwd=tmp_path, env=clean_env(),
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "extractive answer" in done.stdout
    assert "CONVERSATIONAL rules" in done.stdout
    assert "feedback accepted: True" in done.stdout


@pytest.mark.parametrize("columns", [60, 80])
def test_status_fits_the_terminal(stack: Stack, columns: int) -> None:
    done = run(".venv/bin/intentroute status", stack.folder, COLUMNS=str(columns))
    assert done.returncode == 0, done.stderr
    width = max(len(line) for line in done.stdout.splitlines())
    assert width <= columns, done.stdout
    for stage in ("gateway", "classifier", "generator-conversational", "validator"):
        assert stage in done.stdout
    as_json = run(".venv/bin/intentroute status --json", stack.folder, COLUMNS="60")
    assert next(s["stage"] for s in json.loads(as_json.stdout)["stages"]) == "gateway"


def test_the_start_printed_no_library_line_below_warning(stack: Stack) -> None:
    log = stack.log.read_text(errors="replace")
    assert "intentroute.up" in log  # the log is there
    for noise in ("fusion_base", "onnx_model", "Fused Gelu",
                  "Please consider to run pre-processing"):
        assert noise not in log, noise
    levels = re.findall(r"^\S+ \S+ (INFO|DEBUG) \S+ (\S+)", log, re.M)
    assert {name.split(".")[0] for _, name in levels} <= {"intentroute", "services",
                                                          "shared"}, levels


def test_a_stopped_stack_is_not_found(stack: Stack) -> None:
    """Last: after `up` stops, commands say where they looked (the fixture stops it at
    the module's end; here a folder that never had one)."""
    done = run(".venv/bin/intentroute status", stack.folder.parent.parent)
    assert done.returncode == 2
    assert done.stderr.startswith("no running `intentroute up` found: looked for "
                                  f".intentroute/stack.json in {stack.folder.parent.parent} "
                                  "(the current folder)")


def test_a_mixed_folder_ingests_the_good_files_and_names_the_others(tmp_path: Path) -> None:
    """No stack needed: the embedded index in a folder of its own."""
    from tests.unit.test_forgiving_ingest import mixed_folder

    kb = mixed_folder(tmp_path / "kb")
    index = tmp_path / "index"
    done = run(f".venv/bin/intentroute ingest {kb} --index-dir {index}", tmp_path)
    assert done.returncode == 3, done.stderr  # ingested, with files skipped
    summary = json.loads(next(line for line in done.stderr.splitlines()
                              if line.startswith("{")))
    assert summary["docs"] == 2
    assert sorted(s["file"] for s in summary["skipped"]) == [
        "binary.md", "corpus.jsonl", "diagram.png", "latin.txt"]
    assert done.stderr.strip().endswith(
        "ingest: 4 files skipped (named in the summary); the others were ingested")
    listed = run(f".venv/bin/intentroute ingest --list --json --index-dir {index}", tmp_path)
    assert sorted(json.loads(listed.stdout)["sources"]) == ["good.md", "notes.txt"]
