"""The learner worker: the learning job (ADR-0006, shared.learning) every
LEARN_INTERVAL seconds, in a process of its own, as the Postgres role
`intentroute_learner`. Replicas never run it at once (the job's advisory lock).
`intentroute learn` runs it once (from cron, say) instead."""
