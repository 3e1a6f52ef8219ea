"""`bench pipeline --fleet N`: the generators on a declared fleet instead of the echo
backend, so the fleet path (the chain walker over declared backends, the circuits in
the KV bucket LLM_CIRCUITS, the OpenAI-compatible client) is measured.

Each backend is the fake OpenAI-compatible provider (testkit.fault_provider) as its own
process on a free loopback port, every answer its no-fault model `ok` streamed with no
delay between words (60 words, `data: [DONE]`). The fleet file (LLM_FLEET) declares the
backends (`fleet_section`: every fault model) and puts both slots on the first backend's
`ok`; each bench agent's chain for both slots (its policy) is set explicitly:

    fleet 1   first/ok, extractive               (one backend)
    fleet 2   first/ok, second/ok, extractive    (the second never asked: the first answers)

fleet 0 is the echo backend, as without the option.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from intentroute.stack import free_port
from testkit.fault_provider import fleet_section

BACKENDS = ("first", "second")
MODEL = "ok"  # the provider's no-fault model
SLOTS = ("main", "conversational")
MODES = (0, 1, 2)


def refs(backends: int) -> list[str]:
    """The fleet's models a chain walks, in order (`backend/ok`)."""
    return [f"{name}/{MODEL}" for name in BACKENDS[:backends]]


def fleet_toml(urls: list[str]) -> str:
    """The fleet file of one backend per provider URL, both slots on the first's `ok`."""
    if not 1 <= len(urls) <= len(BACKENDS):
        raise ValueError(f"a fleet of 1 to {len(BACKENDS)} backends, not {len(urls)}")
    first = refs(1)[0]
    sections = [fleet_section(name, url) for name, url in zip(BACKENDS, urls, strict=False)]
    return "\n".join([*sections, f'[slots]\nmain = "{first}"\nconversational = "{first}"\n'])


def chain_assignments(backends: int) -> list[str]:
    """The policy assignments of an agent's chain for both slots after the slot's model
    (`first/ok`): the other backends' `ok`, then the extractive answerer."""
    if backends not in MODES or backends == 0:
        raise ValueError(f"--fleet 1 or 2 declares backends, not {backends}")
    chain = ",".join([*refs(backends)[1:], "extractive"])
    return [f"fallback.{slot}={chain}" for slot in SLOTS]


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the fault provider exited ({proc.returncode})")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"the fault provider did not listen on {port} in {timeout:g} s")


@contextlib.contextmanager
def serving(state: Path, backends: int) -> Iterator[dict[str, str]]:
    """`backends` providers running (their own processes), the fleet file written under
    `state`; yields the workers' environment for it. Nothing for fleet 0 (echo)."""
    if backends == 0:
        yield {"GENERATOR_BACKEND": "echo"}
        return
    chain_assignments(backends)  # the mode checked before anything starts
    procs: list[subprocess.Popen[bytes]] = []
    try:
        urls = []
        for _ in range(backends):
            port = free_port()
            proc = subprocess.Popen(
                [sys.executable, "-m", "testkit.fault_provider", "--port", str(port)],
                stdout=subprocess.DEVNULL)
            procs.append(proc)
            _wait_listening(port, proc)
            urls.append(f"http://127.0.0.1:{port}/v1")
        fleet = state / "fleet.toml"
        fleet.write_text(fleet_toml(urls), encoding="utf-8")
        yield {"GENERATOR_BACKEND": "openai", "LLM_FLEET": str(fleet)}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(15)
