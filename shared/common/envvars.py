"""Settings fields declared with the environment variable they are read from, and the one
helper that reads them.

A settings class is a frozen msgspec.Struct whose fields name the environment variable
they are read from in their annotation, next to their one default:

    batch_size: Annotated[int, env("EXAMPLE_BATCH")] = 16

`read_env(cls, environ)` builds it: each declared variable that is set is converted to
its field's type (str, int, float, bool as on/off, Path, Path | None, an enum) or by the
declaration's `parse`; an unset one keeps the field's default (or the declaration's
`unset` derivation), and so does a blank number or switch. A value that does not convert
is a SettingError (a ValueError) naming the variable, the form expected and the value
(`STAGE_ACK_WAIT: expected seconds as a number, got '2s'`). A secret is declared with
`secret_env("NAME")`: unset, it is read from the file NAME_FILE names (a mounted secret,
out of the environment). The settings classes themselves live in each service's
`settings.py`; the common ones in shared.common.settings, which re-exports these names.
"""

from __future__ import annotations

import enum
import os
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import msgspec

S = TypeVar("S", bound=msgspec.Struct)


class SettingError(ValueError):
    """A setting's value that cannot be used; the message names the variable and the
    form it takes (the CLI prints it as one line, exit 2)."""


@dataclass(frozen=True)
class Env:
    """Annotation metadata of a settings field: the variable it is read from."""

    name: str
    # Converts a set value instead of the field's type (custom forms such as "off").
    parse: Callable[[str], Any] | None = None
    # The value when the variable is unset, derived from the settings read so far and the
    # environment, for defaults that depend on other settings; the field's own default
    # is then what direct construction gets.
    unset: Callable[[Any, Mapping[str, str]], Any] | None = None
    # Whether an empty value counts as unset; None: for numbers and switches (a value of
    # spaces too), not for strings and paths ("" is then the value).
    blank_is_unset: bool | None = None
    # What a number counts ("seconds", "days"), said when a value does not convert.
    unit: str = ""


def env(
    name: str,
    *,
    parse: Callable[[str], Any] | None = None,
    unset: Callable[[Any, Mapping[str, str]], Any] | None = None,
    blank_is_unset: bool | None = None,
    unit: str = "",
) -> Env:
    """Declare the variable a field is read from: `x: Annotated[int, env("X")] = 3`."""
    return Env(name, parse=parse, unset=unset, blank_is_unset=blank_is_unset, unit=unit)


@dataclass(frozen=True)
class SecretFile:
    """The `unset` of a secret's declaration (`secret_env`): the contents of the file the
    variable `variable` names (trailing whitespace dropped), "" when it names none."""

    variable: str

    def __call__(self, _: Any, environ: Mapping[str, str]) -> str:
        path = environ.get(self.variable, "")
        if not path:
            return ""
        try:
            return Path(path).read_text(encoding="utf-8").rstrip()
        except OSError as exc:
            raise SettingError(f"{self.variable}: {exc.strerror}: {path}") from None


def secret_env(name: str) -> Env:
    """Declare a secret's variable: its value, or when it is unset (or empty) the
    contents of the file `<name>_FILE` names, e.g. a mounted Kubernetes or compose
    secret, so the secret itself need not sit in the environment."""
    return env(name, blank_is_unset=True, unset=SecretFile(f"{name}_FILE"))


@dataclass(frozen=True)
class EnvGroup:
    """Annotation metadata of a nested struct some of whose fields are read from
    variables (a struct of a lower layer, which cannot declare them itself)."""

    names: tuple[tuple[str, str], ...]  # (field of the nested struct, variable)


def env_group(**names: str) -> EnvGroup:
    """Declare the variables of a nested struct's fields: `env_group(field="VAR", ...)`;
    its other fields, and the unset ones, keep the nested struct's defaults."""
    return EnvGroup(tuple(names.items()))


def read_env(cls: type[S], environ: Mapping[str, str] | None = None, /, **given: Any) -> S:
    """`cls` read from `environ` (default: the process environment). Fields in `given`
    are taken as they are (nested settings built once, a caller's choice); fields that
    declare no variable keep their defaults."""
    environ = os.environ if environ is None else environ
    values = dict(given)
    derived: dict[str, Callable[[Any, Mapping[str, str]], Any]] = {}
    for field in msgspec.structs.fields(cls):
        if field.name in given:
            continue
        kind, declared = _declaration(field.type)
        if isinstance(declared, EnvGroup):
            values[field.name] = _read_group(kind, declared, environ)
        elif isinstance(declared, Env):
            value = _read(declared, kind, environ)
            if value is not _UNSET:
                values[field.name] = value
            elif declared.unset is not None:
                derived[field.name] = declared.unset
    settings = cls(**values)
    if derived:
        settings = msgspec.structs.replace(
            settings, **{name: unset(settings, environ) for name, unset in derived.items()})
    return settings


def is_set(cls: type[msgspec.Struct], field: str,
           environ: Mapping[str, str] | None = None) -> bool:
    """Whether `environ` sets the variable `cls.field` is read from (for a setting that
    means something else when it is not given at all)."""
    environ = os.environ if environ is None else environ
    for info in msgspec.structs.fields(cls):
        if info.name == field:
            _, declared = _declaration(info.type)
            if isinstance(declared, Env):
                return declared.name in environ
    raise KeyError(f"{cls.__name__}.{field} declares no variable")


def refuse_retired(environ: Mapping[str, str] | None, name: str, instead: str) -> None:
    """A SettingError when a variable that no longer exists is set (silence would hide
    it)."""
    environ = os.environ if environ is None else environ
    if environ.get(name, ""):
        raise SettingError(f"{name} is gone: {instead}")


def declared_variables(cls: type[msgspec.Struct]) -> Iterator[tuple[str, str]]:
    """(variable, "Class.field") for each variable `cls` declares (nested structs'
    declarations belong to their own class)."""
    for field in msgspec.structs.fields(cls):
        _, declared = _declaration(field.type)
        if isinstance(declared, Env):
            yield declared.name, f"{cls.__name__}.{field.name}"
        elif isinstance(declared, EnvGroup):
            for sub, name in declared.names:
                yield name, f"{cls.__name__}.{field.name}.{sub}"


_UNSET: Any = object()  # what reading an unset variable gives


def _declaration(annotation: Any) -> tuple[Any, Env | EnvGroup | None]:
    """(the field's type, its declaration) from an `Annotated[type, env(...)]`."""
    if get_origin(annotation) is not Annotated:
        return annotation, None
    kind, *metadata = get_args(annotation)
    found = [m for m in metadata if isinstance(m, (Env, EnvGroup))]
    return kind, (found[0] if found else None)


def _read(declared: Env, kind: Any, environ: Mapping[str, str]) -> Any:
    convert, expected, blank_is_unset = _converter(declared, kind)
    if declared.name not in environ:
        return _UNSET
    raw = environ[declared.name]
    if declared.blank_is_unset is not None:
        blank_is_unset = declared.blank_is_unset
    if blank_is_unset and not (raw.strip() if convert in _NUMBERS else raw):
        return _UNSET
    try:
        return convert(raw)
    except ValueError as exc:
        shown = raw.strip().lower() if convert is _on_off else raw
        if declared.unit and expected.startswith("expected a"):  # "a number", "an integer"
            expected = f"expected {declared.unit} as {expected.removeprefix('expected ')}"
        raise SettingError(f"{declared.name}: {expected or exc}, got {shown!r}") from None


def _read_group(kind: Any, declared: EnvGroup, environ: Mapping[str, str]) -> Any:
    fields = {f.name: f for f in msgspec.structs.fields(kind)}
    values = {}
    for sub, name in declared.names:
        value = _read(Env(name), fields[sub].type, environ)
        if value is not _UNSET:
            values[sub] = value
    return kind(**values)


def _on_off(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def _optional_path(raw: str) -> Path | None:
    return Path(raw) if raw else None


_NUMBERS: tuple[Callable[[str], Any], ...] = (int, float, _on_off)


def _converter(declared: Env, kind: Any) -> tuple[Callable[[str], Any], str, bool]:
    """(conversion, what a bad value should have been, whether blank means unset)."""
    if declared.parse is int or declared.parse is float:  # a plain number, said as one
        convert, expected, _ = _converter(Env(declared.name), declared.parse)
        return convert, expected, False
    if declared.parse is not None:
        return declared.parse, "", False
    if kind is bool:
        return _on_off, "expected on/off", True
    if kind is int:
        return int, "expected an integer", True
    if kind is float:
        return float, "expected a number", True
    if kind is str:
        return str, "", False
    if kind is Path:
        return Path, "", False
    if get_origin(kind) in (Union, types.UnionType) and set(get_args(kind)) == {Path, type(None)}:
        return _optional_path, "", False
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        *others, last = [str(member.value) for member in kind]
        return kind, "expected " + (f"{', '.join(others)} or {last}" if others else last), False
    raise TypeError(f"{declared.name}: no conversion to {kind!r} (declare a parse)")
