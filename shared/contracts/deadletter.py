"""`intentroute.dlq.<durable>`: messages that exhausted their deliveries, kept with their
stage and reason for an operator (`intentroute dlq list`, `intentroute dlq replay`)."""

from __future__ import annotations

STREAM = "INTENTROUTE_DLQ"
SUBJECT_PREFIX = "intentroute.dlq"
# Headers of a dead letter (the payload is the original message's, unchanged).
STAGE_HEADER = "Intentroute-Stage"
REASON_HEADER = "Intentroute-Reason"
SUBJECT_HEADER = "Intentroute-Subject"
DELIVERIES_HEADER = "Intentroute-Deliveries"


def dead_letter_subject(durable: str) -> str:
    return f"{SUBJECT_PREFIX}.{durable}"
