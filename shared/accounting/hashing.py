"""Agent ids replaced by a keyed hash in exports and reports (ADR-0006, privacy).

HMAC-SHA256 of the id under a secret key, hex, cut to 32 characters (128 bits): the
same id always gives the same name, so reports can be compared and joined over time,
and without the key nobody can recompute it from a guessed id (a plain hash of a short
id could be reversed by trying names). The key comes from a file or an environment
variable, never from the command line (where `ps` and shell history would show it).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from pathlib import Path

MIN_KEY_BYTES = 16
HASH_CHARS = 32

AgentNamer = Callable[[str], str]


class HashKeyError(ValueError):
    """No usable key (the message says where one was looked for)."""


def agent_hasher(key: bytes) -> AgentNamer:
    if len(key) < MIN_KEY_BYTES:
        raise HashKeyError(f"the agent hash key must have at least {MIN_KEY_BYTES} bytes")

    def name(agent_id: str) -> str:
        return hmac.new(key, agent_id.encode("utf-8"), hashlib.sha256).hexdigest()[:HASH_CHARS]

    return name


def load_key(*, key_file: Path | None = None, env_key: str = "") -> bytes:
    """The key from `key_file` (its content, surrounding whitespace stripped) or else
    from the environment variable's value `env_key`."""
    if key_file is not None:
        try:
            key = key_file.read_bytes().strip()
        except OSError as exc:
            raise HashKeyError(f"cannot read the agent hash key file {key_file}: {exc}") from None
    else:
        key = env_key.strip().encode("utf-8")
    if not key:
        raise HashKeyError("no agent hash key: set AGENT_HASH_KEY_FILE (a file holding the "
                           "key) or AGENT_HASH_KEY, or pass --hash-key-file")
    if len(key) < MIN_KEY_BYTES:
        raise HashKeyError(f"the agent hash key must have at least {MIN_KEY_BYTES} bytes")
    return key


def identity(agent_id: str) -> str:
    return agent_id
