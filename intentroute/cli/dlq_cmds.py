"""`dlq list` / `dlq replay`: the messages that exhausted their deliveries."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated, Any

import typer

from intentroute.cli.apps import OPTIONS, app, emit, operator_kwargs, settings, urls
from intentroute.cli.failure_lines import CliError
from intentroute.cli.reach import connect_nats
from intentroute.cli.stack_home import no_stack

# JetStream's error code for "no message found" (a missing stream is 10059).
NO_MESSAGE = 10037

dlq_app = typer.Typer(no_args_is_help=True, help="Dead letters: look and retry.")
app.add_typer(dlq_app, name="dlq")


async def _connect() -> Any:
    nats_url, _ = urls()
    if not nats_url:
        no_stack()
    return await connect_nats(nats_url, operator_kwargs(), timeout=OPTIONS.timeout)


async def dead_letters(nc: Any) -> list[dict[str, Any]]:
    from nats.js.errors import NotFoundError

    from shared.contracts import deadletter

    js = nc.jetstream()
    info = await js.stream_info(deadletter.STREAM)
    rows: list[dict[str, Any]] = []
    if not info.state.messages:  # an empty stream reports first_seq 0, not a message
        return rows
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await js.get_msg(deadletter.STREAM, seq)
        except NotFoundError:  # deleted (replayed)
            continue
        headers = msg.headers or {}
        rows.append({
            "id": seq,
            "stage": headers.get(deadletter.STAGE_HEADER, ""),
            "subject": headers.get(deadletter.SUBJECT_HEADER, ""),
            "deliveries": int(headers.get(deadletter.DELIVERIES_HEADER, "0") or 0),
            "reason": headers.get(deadletter.REASON_HEADER, ""),
            "payload": (msg.data or b"")[:200].decode("utf-8", "replace"),
        })
    return rows


@dlq_app.command("list")
def dlq_list(json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Every dead letter: id, stage, original subject, deliveries, reason; changes
    nothing."""

    async def run() -> list[dict[str, Any]]:
        nc = await _connect()
        try:
            return await dead_letters(nc)
        finally:
            await nc.drain()

    rows = asyncio.run(run())
    if json_out:
        emit({"dead_letters": rows}, True)
        return
    for row in rows:
        typer.echo(f"{row['id']:>6}  {row['stage']:<24} {row['subject']:<40} "
                   f"x{row['deliveries']}  {row['reason'][:80]}")
    typer.echo(f"{len(rows)} dead letter(s)", err=True)


def fresh_run(payload: bytes, budget: float, dlq_id: int) -> bytes:
    """An envelope as a new run of its request (a replay is a new attempt, answered
    again even if its first run ended in STAGE_FAILED), its deadline `budget` seconds
    from now; a request (no envelope) is a new run and gets its deadline at the gateway."""
    try:
        body = json.loads(payload)
    except ValueError:
        return payload
    if isinstance(body, dict) and "deadline" in body and "request" in body:
        body["deadline"] = time.time() + budget
        body["run"] = f"{body.get('run', '')}r{dlq_id}"
        return json.dumps(body, separators=(",", ":")).encode()
    return payload


async def readmit(js: Any, subject: str, payload: bytes) -> None:
    """A request the gateway dead-lettered is replayed as a new message naming its
    request id, which the gateway admits once (its admission claim, ANSWER_CLAIMS): the
    claim is removed first, by the operator's hand, so this replay runs."""
    from shared.contracts import request, response

    agent = request.agent_of(subject)
    try:
        body = json.loads(payload)
    except ValueError:
        return
    rid = body.get("request_id") if isinstance(body, dict) else None
    if agent and isinstance(rid, str) and rid:
        await js.purge_stream(response.CLAIM_STREAM,
                              subject=response.admission_subject(agent, rid))


@dlq_app.command("replay")
def dlq_replay(
    dlq_id: Annotated[int, typer.Argument(metavar="ID", help="The id `dlq list` shows")],
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Publish a dead letter again on its original subject (with a fresh deadline) and
    remove it from the dead-letter stream. Exit 1 if there is no dead letter ID."""
    from nats.js.errors import NotFoundError

    from shared.contracts import deadletter

    budget = settings().common.request_deadline

    async def run() -> dict[str, Any]:
        nc = await _connect()
        js = nc.jetstream()
        try:
            try:
                msg = await js.get_msg(deadletter.STREAM, dlq_id)
            except NotFoundError as exc:
                if exc.err_code != NO_MESSAGE:  # the stream itself
                    raise
                raise CliError(f"no dead letter {dlq_id}: `intentroute dlq list` shows the "
                               "ids") from exc
            headers = msg.headers or {}
            subject = headers.get(deadletter.SUBJECT_HEADER, "")
            if not subject:
                raise typer.BadParameter(f"dead letter {dlq_id} names no original subject")
            await readmit(js, subject, msg.data or b"")
            ack = await js.publish(subject, fresh_run(msg.data or b"", budget, dlq_id),
                                   headers={"Nats-Msg-Id": f"dlq-replay:{dlq_id}"})
            await js.delete_msg(deadletter.STREAM, dlq_id)
            return {"id": dlq_id, "subject": subject, "stream": ack.stream, "seq": ack.seq}
        finally:
            await nc.drain()

    emit(asyncio.run(run()), json_out)
