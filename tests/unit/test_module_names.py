"""Names that say one thing: two modules of the tree share a name only when it means the
same thing in both (issue 29). Tests are named after what they test (tests/ is not
looked at), and a benchmark after the `intentroute bench` command that runs it."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from bench.commands import bench_app

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("intentroute", "services", "shared", "tools")

# Names every package may have, each meaning the same thing wherever it is.
ROLES = {
    "__init__": "a package",
    "__main__": "a package run as a program",
    "app": "a service's wiring: settings -> stage -> the deps its logic needs",
    "bootstrap": "a service's composition root: what its handlers need, built once",
    "handlers": "a service's stage: name, delivery settings, decoder, logic",
    "settings": "the one object that reads a part's environment",
    "ports": "the Protocols a package's logic depends on, with the values they exchange",
    "adapters": "the implementations behind a service's ports",
    "logic": "a package's pure logic, behind its handler or check",
    "routes": "an HTTP application's routes",
    "rows": "the row structs of a package's SQL statements, in column order",
    "health": "how healthy a worker is, as it reports it (probes, `status`)",
    "wire": "a wire format: a value from and to the bytes of its boundary",
    "procs": "operating-system processes: start, tie, check they are gone",
    "commands": "a tools package's CLI commands, added by entry point",
}


def modules() -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = defaultdict(list)
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).parts
            if "migrations" in parts or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            found[path.stem].append(path.relative_to(REPO))
    return found


def test_no_two_modules_share_a_name_with_different_meanings() -> None:
    commands = {c.name for c in bench_app.registered_commands}
    clashes = {}
    for name, paths in modules().items():
        if len(paths) < 2 or name in ROLES:
            continue
        # `bench/<command>.py` runs `intentroute bench <command>`, named after what it
        # measures: the only other module of that name is the thing measured.
        rest = [p for p in paths
                if not (p.parts[:2] == ("tools", "bench") and len(p.parts) == 3
                        and name in commands)]
        if len(rest) > 1:
            clashes[name] = [str(p) for p in paths]
    assert not clashes, (
        f"modules sharing a name: {clashes}; rename one to say what it holds, or, when the "
        "name means the same thing in each, add it to ROLES with that meaning")
