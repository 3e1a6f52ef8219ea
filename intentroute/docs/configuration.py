"""Every environment variable the code reads, rendered from the settings declarations
(`docs/reference/configuration.md`, `intentroute docs config`).

The variables are declared once, in the settings classes (a field annotated with
`env("NAME")`, `secret_env("NAME")` or, for a nested struct, `env_group(...)`:
shared.common.envvars). Each settings module (`settings.py` under services/, shared/
and intentroute/) is imported and every msgspec struct it defines is read: per variable
its field, default, the form a value takes, and its documentation, which is the comment
written above the field. A comment documents the fields under it up to the next blank
line or comment, as the settings modules are written; a field of a nested struct is
documented where that struct declares it. A secret's `NAME_FILE` (a file holding it) is
listed with it. Nothing is read from the environment: the page is the same on every
machine.
"""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import math
import types
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import msgspec

from intentroute.docs.markdown import GENERATED, code, table, text
from shared.common.envvars import Env, EnvGroup, SecretFile

DEFAULT_OUT = Path("docs/reference/configuration.md")
# The packages whose settings.py modules hold settings classes.
ROOTS = ("shared", "services", "intentroute")
# The class every worker reads comes first; the others by module.
FIRST = "shared.common.settings"


@dataclass(frozen=True)
class Variable:
    name: str
    field: str  # Class.field (Class.field.sub for a nested struct's)
    default: str  # Markdown
    form: str  # Markdown
    doc: str


@dataclass(frozen=True)
class Section:
    cls: type[msgspec.Struct]
    variables: tuple[Variable, ...]

    @property
    def module(self) -> str:
        return self.cls.__module__

    @property
    def path(self) -> str:
        return self.module.replace(".", "/") + ".py"


def settings_classes() -> list[type[msgspec.Struct]]:
    """Every msgspec struct defined in a settings module, the common ones first."""
    found: list[type[msgspec.Struct]] = []
    for module in settings_modules():
        loaded = importlib.import_module(module)
        found += sorted((obj for _, obj in inspect.getmembers(loaded, inspect.isclass)
                         if issubclass(obj, msgspec.Struct) and obj.__module__ == module),
                        key=lambda c: c.__name__)
    return found


def settings_modules() -> list[str]:
    names = []
    for root in ROOTS:
        base = Path(importlib.import_module(root).__file__ or "").parent
        names += [".".join((root, *p.relative_to(base).with_suffix("").parts))
                  for p in base.rglob("settings.py")]
    return sorted(names, key=lambda n: (n != FIRST, n))


def sections() -> list[Section]:
    found = []
    for cls in settings_classes():
        variables = tuple(_variables(cls))
        if variables:
            found.append(Section(cls, variables))
    return found


def _variables(cls: type[msgspec.Struct]) -> Iterator[Variable]:
    docs = field_docs(cls)
    for field in msgspec.structs.fields(cls):
        if get_origin(field.type) is not Annotated:
            continue
        kind, *metadata = get_args(field.type)
        for declared in metadata:
            if isinstance(declared, Env):
                yield from _declared(declared, kind, field.default,
                                     f"{cls.__name__}.{field.name}", docs.get(field.name, ""))
            elif isinstance(declared, EnvGroup):
                nested = {f.name: f for f in msgspec.structs.fields(kind)}
                nested_docs = field_docs(kind)
                for sub, name in declared.names:
                    info = nested[sub]
                    yield from _declared(Env(name), info.type, info.default,
                                         f"{cls.__name__}.{field.name}.{sub}",
                                         nested_docs.get(sub) or docs.get(field.name, ""))


def _declared(declared: Env, kind: Any, default: Any, where: str,
              doc: str) -> Iterator[Variable]:
    secret = isinstance(declared.unset, SecretFile)
    derived = declared.unset is not None and not secret
    shown = "derived when unset" if derived else _default(default)
    yield Variable(declared.name, where, shown, _form(declared, kind), doc)
    if isinstance(declared.unset, SecretFile):
        yield Variable(declared.unset.variable, where, "unset", "path",
                       f"A file holding `{declared.name}`, read when that is unset or "
                       "empty (a mounted secret: the value need not sit in the "
                       "environment).")


def _default(value: Any) -> str:
    if value is msgspec.NODEFAULT:
        return "required"
    if value is None:
        return "unset"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return code("on" if value else "off")
    if isinstance(value, float):
        if math.isnan(value):
            return code("nan")
        return code(f"{value:g}")
    if isinstance(value, Path):
        return code(value.as_posix())
    if value == "":
        return code('""')
    return code(str(value))


def _form(declared: Env, kind: Any) -> str:
    """What a value of the variable looks like."""
    unit = f" ({declared.unit})" if declared.unit else ""
    if declared.parse is int:
        return "integer"
    if declared.parse is float:
        return "number"
    if declared.parse is not None:
        first = (inspect.getdoc(declared.parse) or "").split("\n\n")[0]
        return text(first) if first and declared.parse.__name__ != "<lambda>" else "text"
    if get_origin(kind) in (Union, types.UnionType):
        kind = next(k for k in get_args(kind) if k is not type(None))
    if kind is bool:
        return "on / off"
    if kind is int:
        return "integer" + unit
    if kind is float:
        return "number" + unit
    if kind is Path:
        return "path"
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return " \\| ".join(code(str(m.value)) for m in kind)
    return "text"


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Field -> the comment above it: a comment documents the fields under it up to the
    next blank line or comment (the settings modules' convention)."""
    source = Path(inspect.getsourcefile(cls) or "").read_text(encoding="utf-8")
    lines = source.splitlines()
    node = next(n for n in ast.walk(ast.parse(source))
                if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs: dict[str, str] = {}
    current, last_end = "", 0
    for statement in node.body:
        if not (isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)):
            current, last_end = "", 0
            continue
        above: list[str] = []
        at = statement.lineno - 2
        while at >= 0 and lines[at].strip().startswith("#"):
            above.insert(0, lines[at].strip().lstrip("#").strip())
            at -= 1
        if above:
            current = " ".join(above)
        elif statement.lineno - 1 != last_end:  # a blank line ends the comment's group
            current = ""
        docs[statement.target.id] = current
        last_end = statement.end_lineno or statement.lineno
    return docs


def render() -> str:
    found = sections()
    count = sum(len(s.variables) for s in found)
    lines = [
        GENERATED.format(command="config", source="a settings declaration"), "",
        "# Configuration reference", "",
        f"Every environment variable intentroute reads ({count}), generated from the "
        "settings declarations: each is declared once, on a field of a settings class "
        "(`env(\"NAME\")` in its annotation, `shared/common/envvars.py`), and read by one "
        "helper, `read_env`. A value that does not convert stops the process with one "
        "line naming the variable and the form it takes. The guide "
        "[Configuring a deployment](../guides/configuration.md) says which to set for "
        "what; OpenTelemetry's own variables that the SDK reads itself (endpoints, "
        "headers, the sampler) are in [Observability](../guides/operations/observability.md).",
        "",
        "Default: the value when the variable is unset (*derived when unset*: computed "
        "from other settings, as its description says). Form: what a value looks like "
        "(on / off also takes `1`/`0`, `true`/`false`, `yes`/`no`).",
        "",
    ]
    cli = cli_variables()
    for section in found:
        summary = (inspect.getdoc(section.cls) or "").split("\n\n")[0]
        lines += [f"## {section.cls.__name__}", "",
                  f"Declared in `{section.path}`." + (f" {text(summary)}" if summary else ""),
                  ""]
        lines += table(("variable", "default", "form", "what it does", "field"),
                       _rows(section.variables))
        lines.append("")
    if cli:
        lines += ["## Options of the CLI", "",
                  "Declared on a command's option (`envvar=`): the option wins over the "
                  "variable.", ""]
        lines += table(("variable", "default", "form", "what it does", "option"), cli)
        lines.append("")
    return "\n".join(lines)


def _rows(variables: tuple[Variable, ...]) -> list[tuple[str, ...]]:
    """Table rows; a field documented by the comment of the field above it says so
    rather than repeat it (a secret's file variable keeps its own line)."""
    rows: list[tuple[str, ...]] = []
    first: Variable | None = None
    for v in variables:
        if first is not None and v.doc and v.doc == first.doc:
            what = f"See `{first.name}` above."
        else:
            what = text(v.doc) or "—"
            if not v.name.endswith("_FILE"):
                first = v
        rows.append((code(v.name), v.default, v.form, what, code(v.field)))
    return rows


def cli_variables() -> list[tuple[str, ...]]:
    """Rows for the variables a CLI option reads (`intentroute --debug`'s
    INTENTROUTE_DEBUG), from the commands themselves."""
    from intentroute.docs.cli_reference import PROGRAM, commands

    rows: list[tuple[str, ...]] = []
    for path, command, _ in commands():
        for param in command.params:
            names = param.envvar if isinstance(param.envvar, (list, tuple)) else \
                [param.envvar] if param.envvar else []
            for name in names:
                option = " ".join((PROGRAM, *path, param.opts[0]))
                form = "on / off" if getattr(param, "is_flag", False) else "text"
                rows.append((code(name), _default(param.default), form,
                             text(param.help or ""), code(option)))
    return rows


def undocumented() -> list[str]:
    """Variables whose declaration has no comment (their row says nothing)."""
    return [v.name for s in sections() for v in s.variables if not v.doc]
