"""NATS over TLS: a throw-away CA and certificates made at run time; a service user and an
agent talk through TLS, plain text is refused."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import NamedTuple

import nats
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from intentroute.stack import NatsServer, ServerTls
from intentroute.stack.nats_users import (
    admin_kwargs,
    apply_agents,
    auth_files,
    reload_server,
    write_auth,
)
from shared.auth.identity import hash_secret
from shared.auth.natsconn import credential_kwargs, tls_context
from shared.client.caller import assemble
from shared.common.settings import CommonSettings
from shared.store.agents import AgentStore, new_credential
from tests.helpers.nats_auth import connect_eventually, declare_streams
from tests.helpers.pipeline import ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration


class Pki(NamedTuple):
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def make_pki(directory: Path) -> Pki:
    now = dt.datetime.now(dt.UTC)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "intentroute test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(hours=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def issue(name: str, usage: x509.ObjectIdentifier, san: list[x509.GeneralName]
              ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = _key()
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(ca_name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(hours=1))
                .add_extension(x509.SubjectAlternativeName(san), critical=False)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        return cert, key

    server, server_key = issue("localhost", ExtendedKeyUsageOID.SERVER_AUTH,
                               [x509.DNSName("localhost"),
                                x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    client, client_key = issue("worker", ExtendedKeyUsageOID.CLIENT_AUTH,
                               [x509.DNSName("worker")])
    pem = serialization.Encoding.PEM
    pki = Pki(directory / "ca.pem", directory / "server.pem", directory / "server.key",
              directory / "client.pem", directory / "client.key")
    pki.ca.write_bytes(ca.public_bytes(pem))
    pki.server_cert.write_bytes(server.public_bytes(pem))
    pki.client_cert.write_bytes(client.public_bytes(pem))
    _write_key(server_key, pki.server_key)
    _write_key(client_key, pki.client_key)
    return pki


class TlsStack(NamedTuple):
    server: NatsServer
    pki: Pki
    state_dir: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def start_tls_server(state_dir: Path, tls: ServerTls) -> NatsServer:
    return NatsServer(state_dir / "nats", creds_dir=auth_files(state_dir).creds_dir,
                      tls=tls).start()


@pytest.fixture(scope="module")
async def tls_stack(
    tmp_path_factory: pytest.TempPathFactory, pki: Pki
) -> AsyncIterator[tuple[TlsStack, dict[str, str]]]:
    state_dir = tmp_path_factory.mktemp("tls")
    server = start_tls_server(state_dir, ServerTls(str(pki.server_cert), str(pki.server_key)))
    try:
        # An agent, as the stack's auth sync would write it from the agents table.
        cred = new_credential("tlsagent", "s3cret-for-the-tls-test")
        write_auth(auth_files(state_dir), [("tlsagent", hash_secret(cred.nats["password"]))])
        reload_server(server.pid)
        ca_only = {"tls": tls_context(str(pki.ca))}
        await declare_streams(server.url, {**admin_kwargs(state_dir), **ca_only})
        yield TlsStack(server, pki, state_dir), dict(cred.nats)
    finally:
        server.stop()


async def test_a_request_is_answered_by_the_pipeline_over_tls(
    tls_stack: tuple[TlsStack, dict[str, str]], database_url: str, kb_index: Path,
) -> None:
    """The gateway, classifier and conversational generator connect as their service
    users through TLS (settings only), an agent asks through TLS and gets its answer."""
    stack, _ = tls_stack
    store = await AgentStore.connect(database_url)
    try:
        agent = "tls-agent"
        cred = (await store.rotate(agent) if await store.get(agent) is not None
                else await store.add(agent))
        await apply_agents(store, stack.state_dir)  # as the stack's auth sync does
    finally:
        await store.close()
    common = CommonSettings(nats_url=stack.server.url, nats_tls_ca=str(stack.pki.ca))
    caller = await connect_eventually(stack.server.url, credential_kwargs(cred, common))
    env = base_env(stack.server.url, database_url, kb_index,
                   INTENTROUTE_HOME=str(stack.state_dir), NATS_TLS_CA=str(stack.pki.ca))
    try:
        async with running(env, ("gateway", "classifier", "generator-conversational")):
            chunks = await ask_all(caller.nc, make_request(
                "how many calls do I have left this month?", agent_id=agent,
                extra_context="calls_used=400 monthly_calls=2000"))
    finally:
        await caller.nc.close()
    assert chunks[-1].is_final
    assert chunks[-1].error is None
    assert chunks[-1].query_type == "PLATFORM"
    assert "calls_used=400" in assemble(chunks)
    assert caller.refusals() == []


def test_plain_text_is_refused(tls_stack: tuple[TlsStack, dict[str, str]]) -> None:
    stack, agent = tls_stack
    with socket.create_connection(("127.0.0.1", stack.server.port), timeout=5) as sock:
        info = json.loads(sock.recv(4096).decode().removeprefix("INFO ").strip())
        assert info["tls_required"] is True
        connect = {"user": agent["user"], "pass": agent["password"], "verbose": False}
        sock.sendall(f"CONNECT {json.dumps(connect)}\r\nPING\r\n".encode())
        received, closed = b"", False
        for _ in range(20):  # the server closes the connection (a timeout fails the test)
            try:
                chunk = sock.recv(4096)
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    assert closed
    assert b"PONG" not in received


async def test_a_client_that_cannot_verify_the_server_is_refused(
    tls_stack: tuple[TlsStack, dict[str, str]],
) -> None:
    stack, agent = tls_stack
    with pytest.raises((ssl.SSLError, nats.errors.Error, OSError)):
        await nats.connect(stack.server.url, allow_reconnect=False, max_reconnect_attempts=0,
                           tls=ssl.create_default_context(), **agent)


async def test_mutual_tls_requires_a_client_certificate(pki: Pki, tmp_path: Path) -> None:
    server = start_tls_server(
        tmp_path, ServerTls(str(pki.server_cert), str(pki.server_key), ca=str(pki.ca)))
    try:
        admin = admin_kwargs(tmp_path)
        with pytest.raises((ssl.SSLError, nats.errors.Error, OSError)):
            await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0,
                               tls=tls_context(str(pki.ca)), **admin)
        nc = await nats.connect(server.url, allow_reconnect=False,
                                tls=tls_context(str(pki.ca), str(pki.client_cert),
                                                str(pki.client_key)), **admin)
        assert nc.is_connected
        await nc.close()
    finally:
        server.stop()

