"""Test doubles and test support, shared by the tests (tests/) and the benchmarks (bench/,
beside it in tools/).

What belongs here:
* `fakes`: hand-written fakes of every port a stage uses (the bus, the turn store, the
  delivery, the agents directory, per-agent policies, the limits' state, the feedback
  table, Layer 2 and its encoder, Layer 3, the search index, the chat backend, the AVAP
  parser and the validator's checker), strict where the real thing is strict, hashed
  from their input or scripted by the test;
* `wire`: a stage's logic run on wire bytes (`run_on_wire`) and the builders of what it
  is fed (stamped envelope bytes, requests, routing decisions);
* `fuzzing`: the fuzz targets, hostile-input strategies and the oracle that judges what
  a stage published (tests/fuzz and `intentroute bench fuzz` run the same targets);
* `clocks`: clocks the test moves (seconds, UTC datetimes);
* `procs`: a stand-in child process (`FakeProc`) and checks on real ones the tests and
  benchmarks kill.

A double that stays in tests/ stands in for no port: servers on loopback for the
integration tier (tests/helpers: the model servers, the parser, the stack), or a
library's internals one test plays (a JetStream API call, nats-py's pull protocol).

Imported by tests/ and bench/ only, never by serving code (shared/, services/,
intentroute/): import-linter gates it (make lint). Part of the `intentroute-tools`
distribution (tools/), installed for development only.
"""
