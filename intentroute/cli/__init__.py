"""`intentroute` command line: run the stack, one worker, status, ask, agents, ingest,
benchmarks.

One module per group of commands; importing them registers their commands on `app`."""

from intentroute.cli import (
    agent_cmds,
    ask_cmd,
    bench_cmds,
    cache_cmds,
    data_cmds,
    deploy_cmds,
    dlq_cmds,
    docs_cmds,
    learn_cmds,
    report_cmds,
    serve_cmds,
    stack_cmds,
    status_cmd,
)
from intentroute.cli.apps import app

__all__ = ["agent_cmds", "app", "ask_cmd", "bench_cmds", "cache_cmds", "data_cmds",
           "deploy_cmds", "dlq_cmds",
           "docs_cmds",
           "learn_cmds",
           "report_cmds", "serve_cmds",
           "stack_cmds", "status_cmd"]
