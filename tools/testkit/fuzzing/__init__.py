"""Property-based fuzzing of every subject's decoder and every stage handler.

`targets` names what is fuzzed and how one example is checked, `strategies` makes the
hostile input, `oracle` judges what a stage published (`testkit.fakes` stands in for the
bus, the store and the adapters), `caches` keeps hypothesis's files out of the
repository. The test tier (tests/fuzz) and `intentroute bench fuzz`
(`bench.fuzzing.runner`) use the same targets.
"""
