"""Reaching NATS and Postgres from a command a person (or a cron job) runs: a server that
is away or silent ends the command within `intentroute --timeout` seconds with one line
(exit 1), not a retry loop. Workers do not use this: they keep retrying, supervised."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

from intentroute.cli.failure_lines import CliError, UsageError
from shared.common.settings import nats_servers

# Between two connection attempts within the bound (nats-py waits 2 s by default, which
# leaves two tries in a 5 s bound; a server being restarted by `up` is back in ~1 s).
RETRY_WAIT = 0.25


def shown(url: str) -> str:
    """A server URL without its password, for a message."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "the configured URL"
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}" if parts.scheme else url


async def connect_nats(url: str, kwargs: dict[str, Any], *, timeout: float,
                       report_reconnects: bool = False) -> Any:
    """A NATS connection within `timeout` seconds (retrying every RETRY_WAIT until then),
    else a CliError saying why; a refused credential ends the attempts at once. Once
    connected, `kwargs` decide reconnection; `report_reconnects` prints its errors dimmed."""
    import nats
    import typer

    connected = False
    seen: list[BaseException] = []

    async def on_error(exc: Exception) -> None:
        if connected:
            if report_reconnects:
                typer.secho(f"nats: {exc!r}", dim=True, err=True)
            return
        # nats-py awaits this inside connect(): raising ends its retries at once.
        if "authorization" in str(exc).lower():
            raise exc
        seen.append(exc)

    options = {"reconnect_time_wait": RETRY_WAIT, "connect_timeout": min(timeout / 2, 2.0),
               **kwargs, "error_cb": on_error}
    where = ", ".join(shown(server) for server in nats_servers(url))
    try:
        nc = await asyncio.wait_for(nats.connect(nats_servers(url), **options), timeout)
    except (TimeoutError, nats.errors.NoServersError):
        why = f" ({_reason(seen[-1])})" if seen else ""
        raise CliError(
            f"NATS at {where} not reachable within {timeout:g} s{why}: is `intentroute up` "
            "running, or NATS_URL right? (`intentroute --timeout N` waits longer)") from None
    except nats.errors.Error as exc:
        if "authorization" in str(exc).lower():
            raise CliError(f"NATS at {where} refused the credential: check --creds or "
                           "NATS_USER / NATS_PASSWORD / NATS_TOKEN / NATS_CREDS") from exc
        raise CliError(f"NATS at {where}: {exc}") from exc
    connected = True
    return nc


def check_db(url: str, timeout: float) -> None:
    """Raise a CliError unless Postgres at `url` takes a login within `timeout` seconds
    (one short connection: asyncpg's own wait is 60 s and takes no setting from the URL).
    Skipped inside a running event loop (asyncio.run cannot nest)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(_probe(url, timeout))


async def _probe(url: str, timeout: float) -> None:
    import asyncpg

    from shared.store import asyncpg_dsn

    where = shown(url)
    try:
        conn = await asyncpg.connect(asyncpg_dsn(url), timeout=timeout)
    except TimeoutError:
        raise CliError(f"Postgres at {where} did not answer within {timeout:g} s: is it "
                       "running? (`intentroute --timeout N` waits longer)") from None
    except OSError as exc:
        raise CliError(f"Postgres at {where}: {_reason(exc)}: is `intentroute up` running, "
                       "or DATABASE_URL right?") from exc
    except (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError) as exc:
        raise CliError(f"Postgres at {where} refused the login ({exc}): check DATABASE_URL "
                       "or DATABASE_PASSWORD_FILE") from exc
    except asyncpg.PostgresError as exc:
        raise CliError(f"Postgres at {where}: {exc}") from exc
    except (ValueError, asyncpg.InterfaceError) as exc:  # a URL asyncpg cannot parse
        raise UsageError(f"DATABASE_URL: {exc}") from exc
    await conn.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "no answer"
    if isinstance(exc, OSError):
        return (exc.strerror or str(exc)).lower()
    return str(exc) or type(exc).__name__
