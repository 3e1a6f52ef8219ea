"""Per-agent policy and the routing arithmetic built on it: `AgentPolicy` and its
assignments (`agent`), the clarity gate's thresholds (`clarity`), agent confidence
(`confidence`), A/B arms (`ab`) and the lookup Protocol (`ports`). Pure logic, no I/O;
imports `contracts` only. Workers, the store, accounting and learning import it."""
