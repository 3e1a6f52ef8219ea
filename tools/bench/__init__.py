"""Speed benchmarks: `intentroute bench NAME` runs `bench.NAME.run` (bench/commands.py adds
the commands to `intentroute` through the `intentroute.commands` entry points).

A module here is named after the command that runs it (`bench.pipeline` is `intentroute
bench pipeline`); what it measures lives in the serving code it starts. Part of the
`intentroute-tools` distribution (tools/), installed for development only: the wheel
and the image do not ship it, and no serving code imports it (import-linter).
"""
