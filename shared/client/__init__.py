"""The caller's side of the contract (`caller`): publish a request, follow or replay its
answer, send a verdict. Imports `contracts` only, so any agent's code can use it; the
CLI, the doors (services/doors), tests and benchmarks import it. `connect` opens an agent's
connection from its credential file (it imports `common.settings` and `auth.natsconn`
as well)."""
