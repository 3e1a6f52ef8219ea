"""Per-agent learning (ADR-0006): the learning job and its phases, off the hot path.

Workers import only `shared.learning.job` (the runner, started in the gateway's
lifespan when LEARN_INTERVAL is set) and `shared.policy.ab` (which arm a request is in).
"""
