"""The generated document is valid AsyncAPI 3.0 by the specification's own JSON Schema,
from the npm package the AsyncAPI initiative publishes (`@asyncapi/specs`), fetched with
`npm pack` (nothing vendored). Skipped, saying why, where npm or its registry is away."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft7Validator

from intentroute.docs.asyncapi import document

pytestmark = pytest.mark.integration

# Pinned: a newer release may tighten the schema; move it on purpose.
SPECS = "@asyncapi/specs@6.11.1"
# The bundled schema (every definition inline) of AsyncAPI 3.0.0, draft-07.
MEMBER = "package/schemas/3.0.0-without-$id.json"


@pytest.fixture(scope="module")
def asyncapi_3_schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"npm is not installed: the AsyncAPI 3.0 schema comes from npm {SPECS}")
    dest = tmp_path_factory.mktemp("asyncapi-specs")
    proc = subprocess.run(
        [npm, "pack", SPECS, "--pack-destination", str(dest), "--prefer-offline", "--silent"],
        capture_output=True, text=True, timeout=180, check=False)
    tarballs = list(Path(dest).glob("*.tgz"))
    if proc.returncode != 0 or not tarballs:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"npm pack {SPECS} failed (registry unreachable?): {last}")
    with tarfile.open(tarballs[0]) as tar:
        member = tar.extractfile(MEMBER)
        assert member is not None, MEMBER
        schema: dict[str, Any] = json.load(member)
    return schema


def test_the_document_is_valid_asyncapi_3(asyncapi_3_schema: dict[str, Any]) -> None:
    validator = Draft7Validator(asyncapi_3_schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
              for e in validator.iter_errors(document())]
    assert not errors


def test_the_official_schema_refuses_a_broken_document(
    asyncapi_3_schema: dict[str, Any]
) -> None:
    """The check has teeth: what AsyncAPI 3 changed from 2 is refused."""
    validator = Draft7Validator(asyncapi_3_schema)
    doc = document()
    doc["operations"]["sendRequest"]["action"] = "publish"  # AsyncAPI 2's verb
    assert not validator.is_valid(doc)
    doc = document()
    doc["channels"]["agentRequest"]["parameters"]["agentId"] = {"schema": {"type": "string"}}
    assert not validator.is_valid(doc)
