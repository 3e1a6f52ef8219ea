"""Per-agent learning (ADR-0006): the learning job and its phases, off the hot path.

Workers import only `shared.learning.job` (the runner, the learner worker's: services/
learner, every LEARN_INTERVAL seconds) and `shared.policy.ab` (which arm a request is in).
"""
