"""Talking to a running stack as a caller: `ask`; and `parse`, the parser as a linter."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from nats.aio.client import Client

from intentroute.cli.apps import OPTIONS, app, settings, urls
from intentroute.cli.failure_lines import CliError, UsageError
from intentroute.cli.reach import connect_nats
from intentroute.cli.stack_home import no_stack
from shared.auth.natsconn import RECONNECT


@app.command()
def ask(
    query: Annotated[str, typer.Argument(help="The question")],
    session: Annotated[str, typer.Option(help="Session id")] = "cli",
    agent: Annotated[
        str, typer.Option(help="Agent (caller) id; default: the credential's, else 'cli'")
    ] = "",
    creds: Annotated[
        Path | None,
        typer.Option(help="Agent credential file; default: the running stack's demo agent"),
    ] = None,
    extra_context: Annotated[str, typer.Option(help="Platform data for PLATFORM")] = "",
    editor: Annotated[Path | None, typer.Option(help="File whose text is editor_context")] = None,
    query_type: Annotated[str, typer.Option(
        help="Caller-declared type: RETRIEVAL, CODE_GENERATION, CONVERSATIONAL or PLATFORM "
             "(a trusted agent's is honoured, others' ignored)")] = "",
    json_lines: Annotated[bool, typer.Option("--json", help="One JSON line per chunk")] = False,
    timeout: Annotated[float, typer.Option(
        help="Seconds to wait for the answer once asked (reaching NATS: `intentroute "
             "--timeout`)")] = 120.0,
) -> None:
    """Publish a question on NATS as an agent and print the answer as it streams
    (adds a turn to the session's history and a row to the request log). Exit 1 if it
    ends in an error."""
    if not query.strip():
        raise UsageError('ask needs a question: QUERY is empty (e.g. intentroute ask "How do '
                         'I loop from 1 to 10 in AVAP?")')
    editor_context = editor.read_text(encoding="utf-8") if editor else ""  # before NATS
    # NATS_URL, else the server(s) the credential names, else the running `up`'s.
    nats_url = settings().nats_url or credential_url(creds) or urls()[0]
    if not nats_url:
        no_stack()
    kwargs, creds_agent = caller_kwargs(creds)

    async def run() -> int:
        from shared.client.caller import AnswerTimeoutError, RequestRefusedError

        nc = await connect_nats(nats_url, {**RECONNECT, **kwargs}, timeout=OPTIONS.timeout,
                                report_reconnects=True)
        try:
            return await ask_and_print(
                nc, agent=agent or creds_agent or "cli", session=session, query=query,
                json_lines=json_lines, extra_context=extra_context,
                query_type=query_type or None, timeout=timeout, editor_context=editor_context,
            )
        except AnswerTimeoutError:
            raise CliError(f"no answer within {timeout:g} s: are the workers running? "
                           "(`intentroute status` shows each stage; `ask --timeout N` waits "
                           "longer)") from None
        except RequestRefusedError as exc:
            raise CliError(f"refused: {exc}") from exc
        finally:
            await nc.drain()

    raise typer.Exit(asyncio.run(run()))


def credential_url(creds: Path | None) -> str:
    """The server(s) a credential file names ("" for none, or a file that is not one:
    `caller_kwargs` says what is wrong with it)."""
    import msgspec

    from shared.auth.natsconn import read_credential

    if creds is None:
        return ""
    try:
        return read_credential(creds).url
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return ""


def caller_kwargs(creds: Path | None) -> tuple[dict[str, Any], str]:
    """`nats.connect` kwargs and agent id of a caller: the credential file given, else
    the running stack's demo agent (`<state>/creds/demo.json`), else the settings."""
    import msgspec

    from intentroute.stack.nats_users import DEMO_AGENT, auth_files
    from shared.auth.natsconn import connect_kwargs, credential_kwargs, read_credential

    cli = settings()
    if creds is None:
        demo = auth_files(cli.state_dir).credential(DEMO_AGENT)
        creds = demo if demo.exists() and not cli.common.nats_authenticated else None
    if creds is None:
        return connect_kwargs(cli.common), ""
    try:
        cred = read_credential(creds)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise UsageError(f"{creds}: not an agent credential ({exc}): `intentroute agent add "
                         "NAME --out FILE` writes one") from exc
    return credential_kwargs(cred, cli.common), cred.agent_id


async def ask_and_print(
    nc: Client,
    *,
    agent: str,
    session: str,
    query: str,
    json_lines: bool,
    extra_context: str = "",
    editor_context: str = "",
    query_type: str | None = None,
    timeout: float = 120.0,
) -> int:
    """Ask one question and print its chunks as they stream; 1 if it ended in an error."""
    import msgspec

    from shared.client.caller import ask as ask_stream
    from shared.contracts.request import AgentRequest
    from shared.contracts.response import ChunkKind

    req = AgentRequest(
        request_id=uuid.uuid4().hex, session_id=session, agent_id=agent, query=query,
        query_type=query_type, extra_context=extra_context, editor_context=editor_context,
    )
    code = 0
    async for chunk in ask_stream(nc, req, timeout=timeout):
        if json_lines:
            typer.echo(msgspec.json.encode(chunk).decode())
            continue
        if chunk.kind == ChunkKind.STATUS:
            typer.secho(f"[{chunk.text}]", dim=True, err=True)
        elif chunk.kind == ChunkKind.RESET:
            typer.secho("\n[answer restarted]", dim=True, err=True)
        elif chunk.text:
            typer.echo(chunk.text, nl=False)
        if chunk.is_final:
            typer.echo("")
            if chunk.error:
                typer.secho(f"error {chunk.error.code}: {chunk.error.message}", fg="red",
                            err=True)
                code = 1
            dec = chunk.decision
            info = f"type={chunk.query_type}"
            if dec:
                info += f" layer={dec.layer} confidence={dec.confidence:.2f} slot={dec.model_slot}"
            if chunk.answered_by:
                info += f" by={chunk.answered_by}"
            if chunk.avap_code or chunk.validation_status:
                info += f" validation={chunk.validation_status or 'VALID'}"
            typer.secho(f"[{info}]", dim=True, err=True)
            if dec and dec.declared_ignored:
                typer.secho(f"[--query-type {query_type} ignored: only a trusted agent's "
                            "declared type is taken (`intentroute agent add NAME --trusted`)]",
                            fg="yellow", err=True)
    return code


@app.command()
def parse(
    file: Annotated[Path, typer.Argument(help="AVAP source file")],
    strict: Annotated[bool, typer.Option(help="Spec mode instead of the lenient dialect")] = False,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Validate one AVAP file with the reference parser (a linter for people too); reads
    FILE only. Exit 1 if it is invalid."""
    import msgspec

    from services.parser.avap import validate

    result = validate(file.read_text(encoding="utf-8"), strict=strict)
    if json_out:
        typer.echo(msgspec.json.encode(result).decode())
    else:
        for line in result.trace:
            hint = f" (did you mean {line.suggestion}?)" if line.suggestion else ""
            typer.echo(f"{file}:{line.line}:{line.column}: {line.code} {line.message}{hint}")
        typer.echo("valid" if result.valid else "invalid", err=True)
    raise typer.Exit(0 if result.valid else 1)
