"""Per-agent admission limits of the gateway (issue 19): requests per second with a
burst, requests in flight, model tokens per minute, daily and monthly budgets; the
global defaults (settings.py, LIMIT_*), the pure decisions (logic.py), the shared state
in Postgres (store.py), a replica's allowance leased from it (lease.py) and the check
the handler calls (gate.py)."""
