"""The worker runtime every stage runs on: the broker and streams (`streams`, `bus`),
answer streaming (`answer_stream`), how a request ends (`endings`), turn rows queued while
Postgres is away (`row_queue`), pull consumers (`consumer`), the stage
template (`stage.run_stage`: every message has one documented fate), the worker and its
wiring (`worker.build_app`), and what a worker reports about itself (`signals`,
`metrics`, `micro`, `telemetry`). Imports `contracts`, `policy`, `common`, `auth` and
`store`; services and the CLI import it, the learning and accounting system does not."""
