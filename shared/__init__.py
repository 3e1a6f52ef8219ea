"""intentroute's shared library: what more than one worker, the CLI or the offline tools use.

Packages, lowest first; a package imports only the ones listed before it (checked by
import-linter, `make lint`):

- `contracts` (and the generated `grpc` stubs): wire messages, subjects, the codec.
- `policy`: per-agent policy, the clarity gate, agent confidence, A/B arms; pure logic.
- `common`: settings every worker shares, deadlines, background-task helpers.
- `encoders`: sentence encoders (sentence-transformers, the ONNX fast encoder).
- `auth`: NATS connection credentials, the permission matrix, agent identity, admission.
- `store`: Postgres: schema, migrations, stores, the group-commit writer, policies.
- `runtime`: the worker runtime: bus, streams, consumers, the stage template, signals.
- `accounting`, then `learning`: the request log's reports and the per-agent learning job.
- `client`: the caller's side of the contract (imports `contracts` only).

Services (`services/*`) may import any of these; nothing here imports a service,
`intentroute` or `bench`.
"""
