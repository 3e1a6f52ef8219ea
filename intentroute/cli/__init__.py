"""`intentroute` command line: run the stack, one worker, status, ask, agents, ingest,
deployments, reports.

One module per group of commands; importing them registers their commands on `app`.
Commands of other installed distributions (the development install's `bench ...`,
`eval ...` and `train-classifier`, from tools/) are added last, by entry point
(intentroute.cli.plugins): the CLI never imports them."""

from intentroute.cli import (
    agent_cmds,
    ask_cmd,
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
from intentroute.cli.plugins import load_plugins

load_plugins(app)

__all__ = ["agent_cmds", "app", "ask_cmd", "data_cmds", "deploy_cmds", "dlq_cmds",
           "docs_cmds", "learn_cmds", "report_cmds", "serve_cmds", "stack_cmds",
           "status_cmd"]
