"""Offline tools: training and evaluating what the workers serve, run by hand or in CI,
never by a worker (`intentroute eval ...`, `intentroute train-classifier`).

* `classifier`  Layer 2's training and promotion, the intent, routing and rule evaluations
* `retriever`   retrieval quality on BEIR sets, relevance calibration, fusion cross-validation
* `commands`    their CLI commands, added to `intentroute` through the `intentroute.commands`
                entry points (tools/pyproject.toml)

Part of the `intentroute-tools` distribution (tools/), installed for development only:
they import the serving code, which never imports them (import-linter, `make lint`).
"""
