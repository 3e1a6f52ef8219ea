"""The Postgres roles of a deployment: who owns the schema, who each worker connects as.

The owner role owns the database and every table and runs the migrations and the
operator's commands; each worker type connects as its own role, granted only what its
stage runs (migration 0009 holds the grants); the learning job has a role of its own.
The superuser only creates the roles and the database (`intentroute db-init`).
"""

from __future__ import annotations

OWNER_ROLE = "intentroute_owner"
LEARNER_ROLE = "intentroute_learner"

# Worker (intentroute.workers.WORKERS) -> its role; both generator slots share one.
WORKER_ROLES: dict[str, str] = {
    "gateway": "intentroute_gateway",
    "classifier": "intentroute_classifier",
    "retriever": "intentroute_retriever",
    "generator-main": "intentroute_generator",
    "generator-conversational": "intentroute_generator",
    "validator": "intentroute_validator",
}

# Every login role the init creates, the owner first.
ROLES: tuple[str, ...] = (OWNER_ROLE, *dict.fromkeys(WORKER_ROLES.values()), LEARNER_ROLE)


def worker_role(worker: str) -> str:
    """The role a worker connects as (KeyError for an unknown worker)."""
    return WORKER_ROLES[worker]
