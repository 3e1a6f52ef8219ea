"""An agent's credential for any NATS client: the server URL(s) and CA it carries, the
NATS CLI's context and the environment variables rendered from it, the Python client
reading its URL when NATS_URL is unset; `up --grpc`'s pinned gRPC address and its
remembered port."""

from __future__ import annotations

import datetime as dt
import json
import ssl
from pathlib import Path

import msgspec
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from intentroute.stack.state import gateway_grpc_listen
from intentroute.stack.tcp_ports import StackPorts, Wanted, plan_ports, write_ports
from shared.auth.exports import CredentialFormat, env_vars, nats_context, render
from shared.auth.natsconn import (
    Credential,
    credential_kwargs,
    public_url,
    read_credential,
    user_credential,
    with_server,
    write_secret,
)
from shared.client.connect import agent_servers
from shared.common.settings import CommonSettings

# Every key `nats context save` writes (nats-io/jsm.go natscontext `settings`), in order.
NATS_CONTEXT_KEYS = [
    "description", "url", "socks_proxy", "token", "user", "password", "creds", "nkey",
    "cert", "key", "ca", "nsc", "jetstream_domain", "jetstream_api_prefix",
    "jetstream_event_prefix", "inbox_prefix", "user_jwt", "color_scheme", "tls_first",
]


def _ca_file(directory: Path) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    path = directory / "ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _bot() -> Credential:
    return user_credential("bot", "s3cret", token="bot.s3cret")


def test_the_credential_names_its_servers_without_another_users_secret() -> None:
    cred = with_server(_bot(), "nats://admin:pw@10.0.0.1:4222, nats://10.0.0.2:4222")
    assert cred.url == "nats://10.0.0.1:4222,nats://10.0.0.2:4222"
    assert (cred.ca, cred.ca_pem) == ("", "")
    assert public_url("tls://h:1") == "tls://h:1"
    # The old keys stay as they were for old readers; the new ones decode with defaults
    # from a file written before them.
    assert cred.nats == {"user": "bot", "password": "s3cret", "inbox_prefix": "_INBOX.bot"}
    old = b'{"agent_id": "bot", "nats": {"user": "bot"}, "token": "t"}'
    assert msgspec.json.decode(old, type=Credential).url == ""


def test_nats_context_has_every_key_the_nats_cli_writes(tmp_path: Path) -> None:
    ca = _ca_file(tmp_path)
    cred = with_server(_bot(), "tls://127.0.0.1:4222", str(ca))
    text = render(cred, CredentialFormat.NATS_CONTEXT)
    context = json.loads(text)
    assert list(context) == NATS_CONTEXT_KEYS
    assert context == nats_context(cred)
    assert {k: context[k] for k in ("url", "user", "password", "inbox_prefix", "ca")} == {
        "url": "tls://127.0.0.1:4222", "user": "bot", "password": "s3cret",
        "inbox_prefix": "_INBOX.bot", "ca": str(ca)}
    assert context["tls_first"] is False
    assert cred.ca_pem == ca.read_text()


def test_env_form_is_the_variables_intentroute_and_the_nats_cli_read(tmp_path: Path) -> None:
    plain = with_server(_bot(), "nats://127.0.0.1:4222")
    lines = render(plain, CredentialFormat.ENV).splitlines()
    assert lines == ["NATS_URL=nats://127.0.0.1:4222", "NATS_USER=bot",
                     "NATS_PASSWORD=s3cret", "NATS_INBOX_PREFIX=_INBOX.bot"]
    environ = dict(line.split("=", 1) for line in lines)
    common = CommonSettings.from_env(environ)
    assert (common.nats_url, common.nats_user, common.nats_password, common.inbox_prefix) == (
        "nats://127.0.0.1:4222", "bot", "s3cret", "_INBOX.bot")
    ca = _ca_file(tmp_path)
    tls = env_vars(with_server(_bot(), "tls://127.0.0.1:4222", str(ca)))
    assert tls["NATS_CA"] == tls["NATS_TLS_CA"] == str(ca)
    # A value a shell would split is quoted for it.
    odd = msgspec.structs.replace(plain, nats={**plain.nats, "password": "a b"})
    assert "NATS_PASSWORD='a b'" in render(odd, CredentialFormat.ENV)


def test_json_form_round_trips_and_is_written_owner_only(tmp_path: Path) -> None:
    cred = with_server(_bot(), "nats://127.0.0.1:4222")
    path = tmp_path / "creds" / "bot.json"
    write_secret(path, render(cred, CredentialFormat.JSON).encode())
    assert read_credential(path) == cred
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700


def test_the_python_client_takes_the_credentials_url_when_nats_url_is_unset() -> None:
    cred = with_server(_bot(), "nats://10.0.0.1:4222,nats://10.0.0.2:4222")
    assert agent_servers(cred, {}) == ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"]
    assert agent_servers(cred, {"NATS_URL": "nats://elsewhere:4222"}) == [
        "nats://elsewhere:4222"]
    assert agent_servers(_bot(), {}) == ["nats://127.0.0.1:4222"]  # NATS_URL's default


def test_the_credentials_ca_verifies_when_the_settings_name_none(tmp_path: Path) -> None:
    ca = _ca_file(tmp_path)
    cred = with_server(_bot(), "tls://127.0.0.1:4222", str(ca))
    kwargs = credential_kwargs(cred, CommonSettings())
    assert isinstance(kwargs["tls"], ssl.SSLContext)
    assert kwargs["tls"].get_ca_certs()[0]["subject"] == ((("commonName", "test CA"),),)
    assert kwargs["user"] == "bot"
    # Elsewhere (the CA file is not there), the PEM the credential carries.
    moved = msgspec.structs.replace(cred, ca=str(tmp_path / "gone.pem"))
    assert credential_kwargs(moved, CommonSettings())["tls"].get_ca_certs()
    assert "tls" not in credential_kwargs(_bot(), CommonSettings())


def test_up_pins_the_gateway_grpc_port_and_remembers_it(tmp_path: Path) -> None:
    assert gateway_grpc_listen("127.0.0.1:0", lambda: 43124) == (
        "127.0.0.1:43124", "127.0.0.1:43124")
    assert gateway_grpc_listen("0.0.0.0:50051", lambda: 1) == (
        "0.0.0.0:50051", "127.0.0.1:50051")
    assert gateway_grpc_listen("", lambda: 1) == ("", "")
    with pytest.raises(ValueError, match="GATEWAY_GRPC_LISTEN"):
        gateway_grpc_listen("50051", lambda: 1)
    write_ports(tmp_path, StackPorts(gateway_grpc=4305))
    picks = iter(range(7000, 7100))
    plan = plan_ports(tmp_path, Wanted(gateway_grpc=True), is_free=lambda _p: True,
                      pick=lambda: next(picks))
    assert plan.ports.gateway_grpc == 4305
    assert "gateway gRPC 4305" in plan.summary()
    off = plan_ports(tmp_path, Wanted(), is_free=lambda _p: True, pick=lambda: next(picks))
    assert off.ports.gateway_grpc == 0
