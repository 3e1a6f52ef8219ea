"""The Postgres roles of a deployment: who owns the schema, who each worker connects as.

The owner role owns the database and every table and runs the migrations and the
operator's commands; each worker type connects as its own role, granted only what it
runs (migration 0009 holds the stages' grants, 0016 the doors'); the learning job has a
role of its own, which the learner worker connects as. The superuser only creates the
roles and the database (`intentroute db-init`).
"""

from __future__ import annotations

OWNER_ROLE = "intentroute_owner"
LEARNER_ROLE = "intentroute_learner"
DOORS_ROLE = "intentroute_doors"

# Worker (intentroute.workers.WORKERS) -> its role; both generator slots share one. The
# doors read the agents' records and the dashboard's figures, and write nothing but a
# token's digest.
WORKER_ROLES: dict[str, str] = {
    "gateway": "intentroute_gateway",
    "classifier": "intentroute_classifier",
    "retriever": "intentroute_retriever",
    "generator-main": "intentroute_generator",
    "generator-conversational": "intentroute_generator",
    "validator": "intentroute_validator",
    "doors": DOORS_ROLE,
}

# Every login role the init creates, the owner first.
ROLES: tuple[str, ...] = (OWNER_ROLE, *dict.fromkeys(WORKER_ROLES.values()), LEARNER_ROLE)


def worker_role(worker: str) -> str:
    """The role a worker connects as, the learner's included (KeyError for an unknown
    worker)."""
    return LEARNER_ROLE if worker == "learner" else WORKER_ROLES[worker]
