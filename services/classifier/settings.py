from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import msgspec

from shared.common.settings import CommonSettings, env, read_env, refuse_retired
from shared.encoders.embeddings import DEFAULT_MODEL
from shared.policy.agent import ClarityPolicy, MultiIntent
from shared.policy.clarity import DECIDE_THRESHOLD


class ClassifierSettings(msgspec.Struct, frozen=True, kw_only=True):
    common: CommonSettings
    # Messages fetched per pull request; they are handled concurrently.
    batch_size: Annotated[int, env("CLASSIFIER_BATCH")] = 32
    # Layer 2: the versioned head registry; None: `<state dir>/heads`, "": Layer 2 off.
    heads_dir: Annotated[str | None, env("CLASSIFIER_HEADS_DIR", parse=str)] = None
    # Layer 2 decides at or above this confidence; below, the message goes on to Layer 3.
    threshold: Annotated[float, env("CLASSIFIER_THRESHOLD")] = DECIDE_THRESHOLD
    # Messages the encoder embeds together, and milliseconds it waits to fill a batch.
    micro_batch: Annotated[int, env("CLASSIFIER_MICRO_BATCH")] = 32
    micro_batch_wait_ms: Annotated[float, env("CLASSIFIER_MICRO_BATCH_WAIT_MS")] = 2.0
    # Layer 2's sentence encoders, chosen when a head is trained (`train-classifier`):
    # the full head's and the early exit's (unset: the full head's); a trained head
    # names its encoders and is served with them. docs/explanation/encoders.md has the
    # measurements.
    encoder: Annotated[str, env("CLASSIFIER_ENCODER")] = DEFAULT_MODEL
    early_exit_encoder: Annotated[str, env(
        "CLASSIFIER_EARLY_EXIT_ENCODER", unset=lambda s, _: s.encoder)] = DEFAULT_MODEL
    # Layer 3: the LLM classifier's model on the configured model server (Ollama, else
    # the OpenAI-compatible one: common settings); "" = no Layer 3 -> fallback. Unset:
    # the conversational slot's model there.
    llm_model: Annotated[str, env(
        "CLASSIFIER_LLM_MODEL", unset=lambda s, _: s.common.slot_model(
            s.common.llm_backend, conversational=True))] = ""
    llm_timeout: Annotated[float, env("CLASSIFIER_LLM_TIMEOUT")] = 3.0
    # Clarity gate policy of agents whose own policy (`intentroute agent set NAME
    # clarity_policy=...`) does not say: "proceed" (default) or "ask".
    clarity_policy: Annotated[ClarityPolicy, env("CLARITY_POLICY")] = ClarityPolicy.PROCEED
    # A message carrying several requests, for agents whose policy (`agent set NAME
    # multi_intent=...`) does not say: "split" (default: each part answered in order,
    # neighbouring parts of one type answered as one), "ask" (ask for them one by one,
    # when the clarity gate sees several) or "first" (the first request only).
    multi_intent: Annotated[MultiIntent, env("CLASSIFIER_MULTI_INTENT")] = MultiIntent.SPLIT

    @property
    def heads_root(self) -> Path | None:
        """The head registry's directory (None: Layer 2 off)."""
        if self.heads_dir is None:
            return self.common.state_dir / "heads"
        return Path(self.heads_dir) if self.heads_dir else None

    @property
    def ollama_host(self) -> str:
        return self.common.ollama_host

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClassifierSettings:
        refuse_retired(environ, "CLARITY_POLICY_BY_AGENT", "set an agent's policy with "
                       "`intentroute agent set NAME clarity_policy=ask`")
        return read_env(cls, environ, common=CommonSettings.from_env(environ))
