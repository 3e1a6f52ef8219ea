"""Who may connect and what they may do: NATS connection kwargs and credential files
(`natsconn`), the permission matrix of services, ops and agents (`permissions`), agent
secrets and tokens (`identity`), the gateway's admission stamp (`admission`) and the
agent lookup Protocols (`ports`). Imports `contracts`, `policy` and `common`; the store,
the runtime, services and the stack (`intentroute.stack`) import it."""
