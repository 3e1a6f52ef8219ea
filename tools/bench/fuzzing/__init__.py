"""`intentroute bench fuzz` (`runner`): every fuzz target for many generated examples,
counting findings. The targets, hostile-input strategies, fakes and oracle are test
support, in `testkit.fuzzing` (the test tier, tests/fuzz, runs the same targets).
"""
