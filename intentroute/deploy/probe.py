"""A container's health check: `python -m intentroute.deploy.probe URL`, exit 0 when the
service there answers healthy, else 1 with one line saying what it got.

* `http://host:port/path`: a 2xx answer (the gateway's `/readyz`, a worker's metrics
  endpoint: a worker serves it once its models are loaded and its consumers start);
* `grpc://host:port[/service]`: `grpc.health.v1` says SERVING (the parser).

Only the standard library and grpc are imported: the CLI's import takes ~0.8 s of CPU,
too much for a check every few seconds in every container (this takes ~0.1 s).
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from urllib.parse import urlsplit

TIMEOUT = 3.0


def probe(url: str, timeout: float = TIMEOUT) -> str:
    """"" when healthy, else why not."""
    scheme = urlsplit(url).scheme
    if scheme in ("http", "https"):
        return _http(url, timeout)
    if scheme == "grpc":
        return _grpc(url, timeout)
    return f"{url}: expected an http://, https:// or grpc:// URL"


def _http(url: str, timeout: float) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            status = int(answer.status)
    except urllib.error.HTTPError as exc:
        return f"{url}: HTTP {exc.code}"
    except OSError as exc:  # refused, timed out, unreachable
        return f"{url}: {getattr(exc, 'reason', exc)}"
    return "" if 200 <= status < 300 else f"{url}: HTTP {status}"


def _grpc(url: str, timeout: float) -> str:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    parts = urlsplit(url)
    service = parts.path.lstrip("/")
    with grpc.insecure_channel(parts.netloc) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            answer = stub.Check(health_pb2.HealthCheckRequest(service=service),
                                timeout=timeout)
        except grpc.RpcError as exc:
            return f"{url}: {exc.code().name}"
    if answer.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{url}: {health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)}"
    return ""


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m intentroute.deploy.probe URL", file=sys.stderr)
        return 2
    problem = probe(argv[0])
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
