"""`intentroute` command line: run the stack, one worker, status, ask, agents, ingest,
deployments, reports.

One module per group of commands; importing them registers their commands on the root
app. The commands of other installed distributions (the development install's `bench ...`,
`eval ...` and `train-classifier`, from tools/) are added when `app` is first taken from
this package, by entry point (intentroute.cli.plugins): the CLI never imports them, and
not at import either, because a plugin's module imports `intentroute.cli.apps` and may be
imported before the CLI (a test importing `bench.commands`)."""

from intentroute.cli import (
    agent_cmds,
    ask_cmd,
    cache_cmds,
    dashboard_cmd,
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
from intentroute.cli.apps import Cli
from intentroute.cli.apps import app as _root
from intentroute.cli.help_text import unwrap_help
from intentroute.cli.plugins import load_plugins

# Not bound until first asked for (`__getattr__`), so that asking loads the plugins.
app: Cli


def __getattr__(name: str) -> Cli:
    """`app`: the root app, the installed plugins' commands added the first time."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    load_plugins(_root)
    unwrap_help(_root)  # help texts wrapped by the terminal (intentroute.cli.help_text)
    globals()["app"] = _root
    return _root


__all__ = ["agent_cmds", "app", "ask_cmd", "cache_cmds", "dashboard_cmd", "data_cmds",
           "deploy_cmds", "dlq_cmds", "docs_cmds", "learn_cmds", "report_cmds", "serve_cmds",
           "stack_cmds", "status_cmd"]
