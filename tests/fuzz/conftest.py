"""The fuzz tier's hypothesis profile: a bounded example count, no deadline (a busy
machine makes example times meaningless), derandomized (CI runs the same examples every
time), no example database, and hypothesis's caches kept out of the repository.

INTENTROUTE_FUZZ_EXAMPLES sets the examples per target (default 150); HYPOTHESIS_PROFILE
=fuzz-explore runs random (not derandomized) examples, 1,000 per target unless set.
`intentroute bench fuzz` runs the same targets at 10,000 examples each."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from testkit.fuzzing.caches import keep_caches_out_of_the_repo

keep_caches_out_of_the_repo()

_SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
              HealthCheck.filter_too_much]

settings.register_profile(
    "fuzz-ci",
    max_examples=int(os.environ.get("INTENTROUTE_FUZZ_EXAMPLES", "150")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=_SLOW_DATA,
    print_blob=False,
)
settings.register_profile(
    "fuzz-explore",
    parent=settings.get_profile("fuzz-ci"),
    max_examples=int(os.environ.get("INTENTROUTE_FUZZ_EXAMPLES", "1000")),
    derandomize=False,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fuzz-ci"))
