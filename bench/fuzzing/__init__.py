"""Property-based fuzzing of every subject's decoder and every stage handler.

`targets` names what is fuzzed and how one example is checked, `strategies` makes the
hostile input, `fakes` stands in for the bus, the store and the adapters, `oracle`
judges what a stage published. The test tier (tests/fuzz) and `intentroute bench
fuzz` (`runner`) use the same targets.
"""
