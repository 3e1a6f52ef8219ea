"""Secrets as files: a setting declared with `secret_env("NAME")` is NAME's value, or
when NAME is unset (or empty) the contents of the file NAME_FILE names, the way compose
and Kubernetes mount secrets (deploy/k8s, compose.yml) so none sits in the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import pytest

from services.doors.dashboard.settings import DashboardSettings
from shared.common.settings import CommonSettings, SettingError, read_env, secret_env


class Example(msgspec.Struct, frozen=True, kw_only=True):
    secret: Annotated[str, secret_env("EXAMPLE_SECRET")] = ""


def test_the_file_is_read_when_the_variable_is_unset(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("s3cret\n")  # `deploy init` ends its files with a newline
    assert read_env(Example, {"EXAMPLE_SECRET_FILE": str(path)}).secret == "s3cret"
    assert read_env(Example, {"EXAMPLE_SECRET": "", "EXAMPLE_SECRET_FILE": str(path)}
                    ).secret == "s3cret"
    # The value itself wins; neither given: the default.
    assert read_env(Example, {"EXAMPLE_SECRET": "v", "EXAMPLE_SECRET_FILE": str(path)}
                    ).secret == "v"
    assert read_env(Example, {}).secret == ""
    assert read_env(Example, {"EXAMPLE_SECRET_FILE": ""}).secret == ""


def test_a_missing_file_names_the_variable(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(SettingError, match=rf"^EXAMPLE_SECRET_FILE: .+: {missing}$"):
        read_env(Example, {"EXAMPLE_SECRET_FILE": str(missing)})


def test_the_deployments_secrets_can_be_files(tmp_path: Path) -> None:
    files = {}
    for name in ("NATS_PASSWORD", "INTENTROUTE_ADMISSION_KEY", "GATEWAY_DASHBOARD_TOKEN"):
        (tmp_path / name).write_text(f"{name.lower()}-value")
        files[f"{name}_FILE"] = str(tmp_path / name)
    common = CommonSettings.from_env(files)
    assert common.nats_password == "nats_password-value"
    assert common.admission_key == "intentroute_admission_key-value"
    assert DashboardSettings.from_env(files).token == "gateway_dashboard_token-value"
