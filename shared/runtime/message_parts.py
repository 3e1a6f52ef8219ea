"""A message carrying several requests, answered part by part in one stream (issue 34).

The classifier splits the message and routes each part (services/classifier/split.py,
RC-01..RC-08 per part); the envelope carries the plan (`Routed.parts`) and answers one
part at a time: `request.query` is the part's text and `decision` its decision, so every
stage works on a part exactly as on a request of its own (a PLATFORM part never reaches
the retriever, a CODE_GENERATION part is validated and retried alone). The stage that
ends a part (the generator, the validator) hands the next part to its first stage
instead of sending a final chunk (`next_part`); the stage that ends the last one sends
the message's one final chunk with every part's decision, validation status and code,
and writes one turn and one request-log row (`finish_parts`).

Each part opens with a marker chunk (kind PART: its place, its text as a heading, its
decision), sent by the part's first stage (`open_part`) — a redelivered one finds its
marker stored and does not send it again — so a RESET of a redelivered stage drops
only that part's text. Every hand-off of part k carries `p<k>.` in its msg id, so the
parts' hand-offs never share one; the hand-off to the next part is claimed before it is
published, so a redelivery of a part already handed on answers nothing
(shared.runtime.part_handoffs).
"""

from __future__ import annotations

import msgspec

from shared.contracts.ids import part_id
from shared.contracts.pipeline import PartDone, Routed, Usage, UsagePart, first_subject
from shared.contracts.response import STREAM as RESPONSES
from shared.contracts.response import PartInfo, PartResult, response_subject
from shared.contracts.routing import topic_snippet
from shared.runtime.answer_stream import AnswerStream
from shared.runtime.endings import answer_usage, history_row, request_log_row
from shared.runtime.ports import Publisher
from shared.runtime.stage import Handoff, StageDeps
from shared.store.ports import TurnStore
from shared.store.rows import HistoryRow, TurnRow


def heading(env: Routed) -> str:
    """A part's heading in the plain answer: `### 2. how much quota do I have left?`."""
    plan = env.parts[env.part]
    lead = "" if env.part == 0 else "\n\n"
    return f"{lead}### {env.part + 1}. {plan.text.strip()}\n\n"


async def open_part(bus: Publisher, env: Routed, *, redelivered: bool) -> None:
    """The part's marker chunk, once: at the part's first stage (the classifier for the
    first). The marker is the first chunk that stage sends, at `env.seq`: a redelivery
    that finds anything stored from there on (the marker, or the part's text after it:
    a generator opens the part it answers) moves on after the marker."""
    if not env.parts or env.part_opened:
        return
    req = env.request
    if redelivered:
        last = await bus.last_chunk(response_subject(req.agent_id, req.request_id), RESPONSES)
        if last is not None and last.seq >= env.seq:
            env.seq += 1
            env.part_opened = True
            return
    plan = env.parts[env.part]
    stream = AnswerStream(bus, req.agent_id, req.request_id, start_seq=env.seq)
    await stream.part(PartInfo(env.part, len(env.parts), plan.text, plan.decision),
                      heading(env))
    env.seq = stream.seq
    env.part_opened = True


def next_part(env: Routed, *, seq: int, answer: str, answered_by: str,
              validation_status: str = "", avap_code: str = "") -> tuple[str, Routed]:
    """This part answered: the next part's subject and envelope (its marker is sent by
    the stage that takes it). The answer so far is kept for the final chunk and the
    turn; the usage of this part for the request log."""
    done = [*env.done, PartDone(answer=answer, answered_by=answered_by,
                                validation_status=validation_status, avap_code=avap_code,
                                usage=env.usage)]
    index = env.part + 1
    plan = env.parts[index]
    nxt = Routed(
        request=msgspec.structs.replace(env.request, query=plan.text),
        accepted_at=env.accepted_at, decision=plan.decision, timings=env.timings,
        admission=env.admission, deadline=env.deadline, run=env.run, degraded=env.degraded,
        seq=seq, parts=env.parts, part=index, done=done, message=env.message)
    return first_subject(plan.decision), nxt


def previous_part_answer(env: Routed) -> str | None:
    """A CONVERSATIONAL part refers to the answer before it: the previous part's, when
    there is one (None: the session's last answer, as for a message of one request)."""
    return env.done[-1].answer if env.part > 0 and env.done else None


def _total(usages: list[Usage | None]) -> Usage | None:
    """The request's usage: every part's tokens and time; its parts, one per part (and
    per model of a continued part), each billed at its own model's price."""
    known = [u for u in usages if u is not None]
    if not known:
        return None
    parts: list[UsagePart] = []
    for u in known:
        parts += u.parts or ([UsagePart(u.model, u.tokens_in, u.tokens_out)] if u.model else [])
    last = known[-1]
    return Usage(model=last.model, tokens_in=sum(u.tokens_in for u in known),
                 tokens_out=sum(u.tokens_out for u in known),
                 tokens_note=next((u.tokens_note for u in known if u.tokens_note), ""),
                 compute_ms=sum(u.compute_ms for u in known),
                 fallback=any(u.fallback for u in known),
                 fallback_reason=next((u.fallback_reason for u in known
                                       if u.fallback_reason), ""),
                 parts=parts)


_SHORT = {"RETRIEVAL": "RET", "CODE_GENERATION": "CODE", "CONVERSATIONAL": "CONV",
          "PLATFORM": "PLAT"}


def parts_type(env: Routed) -> str:
    """A split message's type in the request log and the turn (a 32-character column):
    its parts' types in order, `RET+CODE+PLAT`."""
    return "+".join(_SHORT[plan.decision.type.value] for plan in env.parts)[:32]


def results(env: Routed, last: PartDone) -> list[PartResult]:
    """Every part's result for the final chunk, in order."""
    return [PartResult(index=i, text=plan.text, query_type=plan.decision.type.value,
                       decision=plan.decision, validation_status=done.validation_status,
                       avap_code=done.avap_code, answered_by=done.answered_by)
            for i, (plan, done) in enumerate(zip(env.parts, [*env.done, last], strict=True))]


async def finish_parts(store: TurnStore, env: Routed, last: PartDone, *,
                       first_chunk_at: float | None = None) -> tuple[list[PartResult], str]:
    """The last part answered: one turn (the whole message and every part under its
    heading), one classify_history entry per part, one request-log row with the parts'
    types and usage. Returns the final chunk's parts and its query type."""
    import time

    parts = [*env.done, last]
    whole = "".join(f"### {i + 1}. {plan.text.strip()}\n\n{done.answer}\n\n"
                    for i, (plan, done) in enumerate(zip(env.parts, parts, strict=True)))
    types = parts_type(env)
    env.usage = _total([d.usage for d in parts]) if env.usage is not None else None
    req = env.request
    history: list[HistoryRow] = []
    for i, plan in enumerate(env.parts):
        row = history_row(msgspec.structs.replace(env, decision=plan.decision))
        history.append(msgspec.structs.replace(
            row, request_id=part_id(req.request_id, i),
            topic=topic_snippet(plan.text)))
    first_chunk: dict[str, float] = {}
    if env.usage is not None:
        sent = first_chunk_at if first_chunk_at is not None else time.time()
        first_chunk["first_chunk_ms"] = round((sent - env.accepted_at) * 1000, 3)
    log_row = request_log_row(
        env, "ok", answered_by="+".join(dict.fromkeys(d.answered_by for d in parts)),
        total_ms=round((time.time() - env.accepted_at) * 1000, 3),
        validation_status=next((d.validation_status for d in parts if d.validation_status),
                               ""), **first_chunk)
    log_row = msgspec.structs.replace(log_row, query_type=types)
    await store.write(
        *history,
        TurnRow(agent_id=req.agent_id, session_id=req.session_id, request_id=req.request_id,
                query=env.message or req.query, answer=whole.replace("\x00", ""),
                query_type=types),
        log_row,
        deadline=env.deadline or None,
    )
    return results(env, last), types


async def end_part(deps: StageDeps, out: AnswerStream, env: Routed, done: PartDone
                   ) -> Handoff | None:
    """A part answered by the stage that ends it: the next part handed to its first
    stage, or, after the last, the message's turn and its one final chunk."""
    if env.more_parts:
        await out.flush()
        subject, nxt = next_part(env, seq=out.seq, answer=done.answer,
                                 answered_by=done.answered_by,
                                 validation_status=done.validation_status,
                                 avap_code=done.avap_code)
        return Handoff(subject, nxt, "part")
    parts, types = await finish_parts(deps.store, env, done, first_chunk_at=out.first_text_at)
    await out.final(decision=env.decision, query_type=types, parts=parts,
                    answered_by=parts[-1].answered_by, usage=answer_usage(env))
    return None
