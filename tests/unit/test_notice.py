"""NOTICE names every runtime dependency, and none of what `make install` brings in is
under a licence the project's Apache-2.0 could not ship beside."""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_COPYLEFT = re.compile(r"\b(A?GPL|LGPL|GNU (Affero |Lesser )?General Public)", re.I)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _runtime_dependencies() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [_NAME.match(dep).group(0) for dep in project["dependencies"]]  # type: ignore[union-attr]


def _licence(dist: md.Distribution) -> str:
    meta = dist.metadata
    classifiers = [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    return " ".join([meta.get("License-Expression") or "", *classifiers,
                     (meta.get("License") or "").split("\n")[0]])


def _closure(names: list[str]) -> dict[str, md.Distribution]:
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = _norm(todo.pop())
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[name] = dist
        todo += [_NAME.match(req).group(0) for req in dist.requires or []  # type: ignore[union-attr]
                 if "extra ==" not in req]
    return seen


def test_notice_names_every_runtime_dependency() -> None:
    notice = _norm((ROOT / "NOTICE").read_text())
    missing = [dep for dep in _runtime_dependencies() if _norm(dep) not in notice]
    assert missing == []


def test_no_runtime_dependency_is_under_a_gpl_family_licence() -> None:
    installed = _closure(_runtime_dependencies())
    assert len(installed) > 30  # the closure was really walked
    copyleft = {name: _licence(dist) for name, dist in installed.items()
                if _COPYLEFT.search(_licence(dist))}
    assert copyleft == {}


def test_the_project_declares_its_licence() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
