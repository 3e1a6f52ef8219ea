"""Test doubles and test support, shared by the tests (tests/) and the benchmarks (bench/,
beside it in tools/).

What belongs here:
* `fakes`: hand-written fakes of every port a stage uses (the bus, the turn store, the
  delivery, the agents directory, per-agent policies, the feedback table, Layer 2, the
  search index, the chat backend, the AVAP parser), one class per port, strict where
  the real thing is strict;
* `wire`: a stage's logic run on wire bytes (`run_on_wire`) and the builders of what it
  is fed (stamped envelope bytes, requests, routing decisions);
* `fuzzing`: the fuzz targets, hostile-input strategies and the oracle that judges what
  a stage published (tests/fuzz and `intentroute bench fuzz` run the same targets);
* `procs`: checks on processes the tests and benchmarks kill.

Imported by tests/ and bench/ only, never by serving code (shared/, services/,
intentroute/): import-linter gates it (make lint). Part of the `intentroute-tools`
distribution (tools/), installed for development only.
"""
