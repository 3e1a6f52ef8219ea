"""`intentroute` command line: run the stack, one worker, ask, ingest, benchmarks.

One module per group of commands; importing them registers their commands on `app`."""

from intentroute.cli import ask_cmd, bench_cmds, data_cmds, stack_cmds
from intentroute.cli.apps import app

__all__ = ["app", "ask_cmd", "bench_cmds", "data_cmds", "stack_cmds"]
