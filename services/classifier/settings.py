from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec

from services.classifier.clarity import DECIDE_THRESHOLD
from shared.common.settings import CommonSettings, env_float, env_int, env_str
from shared.policy.agent import ClarityPolicy


class ClassifierSettings(msgspec.Struct, frozen=True, kw_only=True):
    common: CommonSettings
    # Messages fetched per pull request; they are handled concurrently.
    batch_size: int = 32
    # Layer 2: the versioned head registry; None: `<state dir>/heads`, "": Layer 2 off.
    heads_dir: str | None = None
    threshold: float = DECIDE_THRESHOLD
    micro_batch: int = 32
    micro_batch_wait_ms: float = 2.0
    # Layer 3: Ollama model for the LLM classifier ("" = no Layer 3 -> fallback).
    ollama_host: str = ""
    llm_model: str = ""
    llm_timeout: float = 3.0
    # Clarity gate policy of agents whose own policy (`intentroute agent set NAME
    # clarity_policy=...`) does not say: "proceed" (default) or "ask".
    clarity_policy: ClarityPolicy = ClarityPolicy.PROCEED

    @property
    def heads_root(self) -> Path | None:
        """The head registry's directory (None: Layer 2 off)."""
        if self.heads_dir is None:
            return self.common.state_dir / "heads"
        return Path(self.heads_dir) if self.heads_dir else None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClassifierSettings:
        if env_str("CLARITY_POLICY_BY_AGENT", "", environ):
            raise ValueError("CLARITY_POLICY_BY_AGENT is gone: set an agent's policy with "
                             "`intentroute agent set NAME clarity_policy=ask`")
        policy = env_str("CLARITY_POLICY", "proceed", environ)
        if policy not in ClarityPolicy.__members__.values():
            raise ValueError(f"CLARITY_POLICY={policy!r}: expected proceed or ask")
        main = env_str("OLLAMA_MODEL_NAME", "", environ)
        small = env_str("OLLAMA_MODEL_NAME_CONVERSATIONAL", "", environ) or main
        common = CommonSettings.from_env(environ)
        return cls(
            common=common,
            batch_size=env_int("CLASSIFIER_BATCH", 32, environ),
            heads_dir=env_str("CLASSIFIER_HEADS_DIR", str(common.state_dir / "heads"), environ),
            threshold=env_float("CLASSIFIER_THRESHOLD", DECIDE_THRESHOLD, environ),
            micro_batch=env_int("CLASSIFIER_MICRO_BATCH", 32, environ),
            micro_batch_wait_ms=env_float("CLASSIFIER_MICRO_BATCH_WAIT_MS", 2.0, environ),
            ollama_host=env_str("OLLAMA_HOST", "", environ),
            llm_model=env_str("CLASSIFIER_LLM_MODEL", small, environ),
            llm_timeout=env_float("CLASSIFIER_LLM_TIMEOUT", 3.0, environ),
            clarity_policy=ClarityPolicy(policy),
        )
