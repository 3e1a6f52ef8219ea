"""Settings are declared once per field: the variable a field is read from sits in its
annotation next to its one default, one helper (shared.common.settings.read_env) reads
them all, and a variable is read by one setting."""

from __future__ import annotations

import importlib
import inspect
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import msgspec
import pytest

from intentroute.settings import CliSettings
from services.classifier.settings import ClassifierSettings
from services.doors.dashboard.settings import DashboardSettings
from services.doors.settings import DoorsSettings
from services.gateway.limits.settings import LimitSettings
from services.gateway.settings import GatewaySettings
from services.generator.settings import GeneratorSettings
from services.learner.settings import LearnerSettings
from services.retriever.settings import RetrieverSettings
from services.validator.settings import ValidatorSettings
from shared.common.settings import (
    CommonSettings,
    Env,
    EnvGroup,
    SettingError,
    declared_variables,
    env,
    is_set,
    read_env,
    refuse_retired,
)
from shared.contracts.routing import ModelSlot
from shared.learning.settings import LearnSettings
from shared.policy.confidence import ConfidenceParams

REPO = Path(__file__).resolve().parents[2]
HELPER = REPO / "shared" / "common" / "settings.py"

# Every settings class, built the way its callers build it.
FROM_ENV: dict[type[msgspec.Struct], Callable[[Mapping[str, str]], Any]] = {
    CommonSettings: CommonSettings.from_env,
    ClassifierSettings: ClassifierSettings.from_env,
    GatewaySettings: GatewaySettings.from_env,
    DoorsSettings: DoorsSettings.from_env,
    LearnerSettings: lambda environ: LearnerSettings.from_env(
        {"LEARN_INTERVAL": "60", **environ}),
    DashboardSettings: DashboardSettings.from_env,
    LimitSettings: LimitSettings.from_env,
    GeneratorSettings: GeneratorSettings.from_env,
    RetrieverSettings: RetrieverSettings.from_env,
    ValidatorSettings: ValidatorSettings.from_env,
    LearnSettings: LearnSettings.from_env,
    CliSettings: CliSettings.from_env,
}


def settings_modules() -> list[Path]:
    return sorted(path for top in ("services", "shared", "intentroute")
                  for path in (REPO / top).rglob("settings.py"))


def field_types(cls: type[msgspec.Struct]) -> dict[str, Any]:
    """Field name -> its type without the declaration."""
    return {f.name: getattr(f.type, "__origin__", f.type) for f in msgspec.structs.fields(cls)}


def declared_fields(cls: type[msgspec.Struct]) -> list[tuple[str, str, Any]]:
    """(variable, field, the type it is read as: None for a declared parse) of each
    variable `cls` declares, those of a nested struct (`env_group`) included."""
    found = []
    for field in msgspec.structs.fields(cls):
        annotated = get_origin(field.type) is Annotated
        kind, *metadata = get_args(field.type) if annotated else (field.type,)
        for declared in metadata:
            if isinstance(declared, Env):
                found.append((declared.name, field.name, None if declared.parse else kind))
            elif isinstance(declared, EnvGroup):
                types = field_types(kind)
                found += [(name, field.name, types[sub]) for sub, name in declared.names]
    return found


def same(a: object, b: object) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float)
                      and math.isnan(a) and math.isnan(b))


def test_every_settings_class_is_covered() -> None:
    found = set()
    for path in settings_modules():
        module = importlib.import_module(
            ".".join(path.relative_to(REPO).with_suffix("").parts))
        found |= {obj for _, obj in inspect.getmembers(module, inspect.isclass)
                  if issubclass(obj, msgspec.Struct) and obj.__module__ == module.__name__}
    assert found == set(FROM_ENV)


def test_each_variable_is_read_by_one_setting() -> None:
    readers: dict[str, list[str]] = {}
    for cls in FROM_ENV:
        for name, path in declared_variables(cls):
            readers.setdefault(name, []).append(path)
    shared = {name: paths for name, paths in readers.items() if len(paths) > 1}
    assert not shared, f"variables read by several settings: {shared}"
    # The ones several stages or the CLI need are the common settings'.
    for name in ("NATS_URL", "DATABASE_URL", "INDEX_DIR", "OLLAMA_HOST", "OLLAMA_MODEL_NAME",
                 "OLLAMA_MODEL_NAME_CONVERSATIONAL", "OPENAI_API_KEY"):
        assert readers[name][0].startswith("CommonSettings."), name


def test_settings_modules_read_the_environment_only_through_the_helper() -> None:
    reader = re.compile(r"os\.environ|getenv|environ\.get|environ\[|\benv_(str|int|float|bool)\(")
    for path in settings_modules():
        if path == HELPER:
            continue
        found = [line for line in path.read_text().splitlines() if reader.search(line)]
        assert not found, f"{path.relative_to(REPO)} reads the environment itself: {found}"
    # Each declared variable is named in one declaration in all the settings modules.
    source = "\n".join(path.read_text() for path in settings_modules())
    for cls in FROM_ENV:
        for name, _ in declared_variables(cls):
            assert len(re.findall(rf'(env\(\s*|=)"{name}"', source)) == 1, name


@pytest.mark.parametrize("cls", list(FROM_ENV), ids=lambda cls: cls.__name__)
def test_unset_keeps_the_default(cls: type[msgspec.Struct]) -> None:
    read = FROM_ENV[cls]({})
    for field in msgspec.structs.fields(cls):
        if field.default is msgspec.NODEFAULT:
            continue  # `common`: given
        if (cls, field.name) in ((ClassifierSettings, "llm_model"),
                                 (RetrieverSettings, "relevance_model")):
            assert getattr(read, field.name) == ""  # the conversational slot's: none
        elif cls is CommonSettings and field.name == "onnx_cache_dir":
            assert read.onnx_cache_dir == Path.home() / ".cache" / "intentroute" / "onnx"
        elif cls is CliSettings and field.name == "index_dir":
            # The state folder found from here, absolute (intentroute.stack.home).
            assert read.index_dir == read.state_dir / "index"
            assert read.state_dir.is_absolute()
        else:
            assert same(getattr(read, field.name), field.default), f"{cls.__name__}.{field.name}"


@pytest.mark.parametrize("cls", list(FROM_ENV), ids=lambda cls: cls.__name__)
def test_a_blank_number_or_switch_keeps_the_default(cls: type[msgspec.Struct]) -> None:
    for name, field, kind in declared_fields(cls):
        if kind in (int, float, bool) and field != "confidence":
            default = getattr(FROM_ENV[cls]({}), field)
            for blank in ("", "  "):
                assert same(getattr(FROM_ENV[cls]({name: blank}), field), default), name


@pytest.mark.parametrize("cls", list(FROM_ENV), ids=lambda cls: cls.__name__)
def test_a_bad_value_names_the_variable(cls: type[msgspec.Struct]) -> None:
    for name, _, kind in declared_fields(cls):
        if kind in (int, float, bool):
            with pytest.raises(SettingError, match=rf"^{name}: expected .+, got '2s'$"):
                FROM_ENV[cls]({name: "2s"})


@pytest.mark.parametrize(("environ", "message"), [
    ({"STAGE_ACK_WAIT": "2s"}, "STAGE_ACK_WAIT: expected seconds as a number, got '2s'"),
    ({"STAGE_MAX_DELIVER": "1.5"}, "STAGE_MAX_DELIVER: expected an integer, got '1.5'"),
    ({"ROLLUP_KEEP_DAYS": "1y"}, "ROLLUP_KEEP_DAYS: expected days as an integer, got '1y'"),
    ({"ACCOUNTING": " Maybe "}, "ACCOUNTING: expected on/off, got 'maybe'"),
    ({"CONFIDENCE_DAILY_DECAY": "high"},
     "CONFIDENCE_DAILY_DECAY: expected a number, got 'high'"),
])
def test_bad_common_values(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        CommonSettings.from_env(environ)


def test_an_enum_says_its_choices() -> None:
    with pytest.raises(SettingError,
                       match=r"^GENERATOR_SLOT: expected main or conversational, got ''$"):
        GeneratorSettings.from_env({"GENERATOR_SLOT": ""})
    # The slot a caller gives wins: the variable is not read.
    conversational = GeneratorSettings.from_env({"GENERATOR_SLOT": "x"},
                                                slot=ModelSlot.CONVERSATIONAL)
    assert conversational.slot is ModelSlot.CONVERSATIONAL


def test_values_are_read_as_their_field_types() -> None:
    common = CommonSettings.from_env({
        "NATS_URL": "nats://a:1,nats://b:2", "STAGE_ACK_WAIT": "3", "STAGE_MAX_DELIVER": " 7 ",
        "ACCOUNTING": "off", "INTENTROUTE_HOME": "/srv/home",
        "CONFIDENCE_PRIOR_STRENGTH": "4"})
    assert common.nats_servers == ["nats://a:1", "nats://b:2"]
    assert common.ack_wait == 3.0
    assert isinstance(common.ack_wait, float)
    assert common.max_deliver == 7
    assert common.accounting is False
    assert common.state_dir == Path("/srv/home")
    assert common.confidence == ConfidenceParams(prior_strength=4.0)
    doors = DoorsSettings.from_env({"GATEWAY_TLS_CERT": "/c", "GATEWAY_TLS_KEY": "",
                                    "GATEWAY_HTTP_LISTEN": " OFF "})
    assert (doors.tls_cert, doors.tls_key, doors.http_listen) == (Path("/c"), None, "")
    assert LearnerSettings.from_env({"LEARN_INTERVAL": "60"}).learn.interval == 60.0
    with pytest.raises(SettingError, match="LEARN_INTERVAL"):  # the learner needs one
        LearnerSettings.from_env({})
    # A string set to "" is "" (here: Layer 2 off), not the default.
    assert ClassifierSettings.from_env({"CLASSIFIER_HEADS_DIR": ""}).heads_root is None


def test_settings_that_default_to_other_settings() -> None:
    models = {"OLLAMA_MODEL_NAME": "big", "OLLAMA_MODEL_NAME_CONVERSATIONAL": "small"}
    assert ClassifierSettings.from_env(models).llm_model == "small"
    assert ClassifierSettings.from_env({"OLLAMA_MODEL_NAME": "big"}).llm_model == "big"
    assert ClassifierSettings.from_env({**models, "CLASSIFIER_LLM_MODEL": ""}).llm_model == ""
    assert RetrieverSettings.from_env(models).relevance_model == "small"
    assert RetrieverSettings.from_env({**models, "RELEVANCE_MODEL": "j"}).relevance_model == "j"
    generator = GeneratorSettings.from_env({"OLLAMA_MODEL_NAME": "big"},
                                           slot=ModelSlot.CONVERSATIONAL)
    assert generator.model == "big"
    home = {"INTENTROUTE_HOME": "/srv/home"}
    assert ClassifierSettings.from_env(home).heads_root == Path("/srv/home/heads")
    assert CommonSettings.from_env({"XDG_CACHE_HOME": "/x"}).onnx_cache_dir == Path(
        "/x/intentroute/onnx")
    assert CommonSettings.from_env({"XDG_CACHE_HOME": "/x", "INTENTROUTE_ONNX_CACHE": "/o"}
                                   ).onnx_cache_dir == Path("/o")


def test_the_cli_tells_an_unset_nats_url_and_index_from_the_workers_defaults() -> None:
    unset = CliSettings.from_env({"INTENTROUTE_HOME": "/srv/home"})
    assert unset.nats_url == ""  # `up` starts an embedded server
    assert unset.common.nats_url == "nats://127.0.0.1:4222"  # what a worker would use
    assert unset.index_dir == Path("/srv/home/index")
    given = CliSettings.from_env({"NATS_URL": "nats://127.0.0.1:4222", "INDEX_DIR": "/i",
                                  "DATABASE_URL": "postgresql://x/y"})
    assert (given.nats_url, given.index_dir) == ("nats://127.0.0.1:4222", Path("/i"))
    assert given.database_url == given.common.database_url == "postgresql://x/y"
    assert RetrieverSettings.from_env({"INDEX_DIR": "/i"}).index_dir == Path("/i")


def test_the_helper_on_a_struct_of_its_own() -> None:
    class Plain(msgspec.Struct, frozen=True, kw_only=True):
        count: int = 0  # no declaration: not read

    class Declared(msgspec.Struct, frozen=True, kw_only=True):
        count: Annotated[int, env("EXAMPLE_COUNT")] = 2
        twice: Annotated[int, env("EXAMPLE_TWICE", unset=lambda s, _: s.count * 2)] = 0
        word: Annotated[str, env("EXAMPLE_WORD", parse=str.upper)] = "x"

    assert read_env(Plain, {"EXAMPLE_COUNT": "5", "count": "5"}) == Plain()
    assert read_env(Declared, {}) == Declared(count=2, twice=4, word="x")
    assert read_env(Declared, {"EXAMPLE_COUNT": "5", "EXAMPLE_WORD": "y"}) == Declared(
        count=5, twice=10, word="Y")
    assert read_env(Declared, {"EXAMPLE_COUNT": "x"}, count=1).count == 1  # given: not read
    assert is_set(Declared, "count", {"EXAMPLE_COUNT": ""})
    assert not is_set(Declared, "count", {})
    assert sorted(declared_variables(Declared)) == [
        ("EXAMPLE_COUNT", "Declared.count"), ("EXAMPLE_TWICE", "Declared.twice"),
        ("EXAMPLE_WORD", "Declared.word")]
    refuse_retired({"EXAMPLE_OLD": ""}, "EXAMPLE_OLD", "use EXAMPLE_COUNT")
    with pytest.raises(ValueError, match=r"^EXAMPLE_OLD is gone: use EXAMPLE_COUNT$"):
        refuse_retired({"EXAMPLE_OLD": "1"}, "EXAMPLE_OLD", "use EXAMPLE_COUNT")
