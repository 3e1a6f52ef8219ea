"""The model backends' circuits (shared.llm.circuit), shared by every replica: a
JetStream key-value bucket, one key per backend, its value a `Circuit` as JSON."""

from __future__ import annotations

BUCKET = "LLM_CIRCUITS"
# The stream JetStream keeps the bucket in, and the subjects of its keys.
STREAM = f"KV_{BUCKET}"
SUBJECTS = f"$KV.{BUCKET}.>"
