"""NATS over TLS: a throw-away CA and certificates made at run time; a service user and an
agent talk through TLS, plain text is refused."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
import ssl
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import nats
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from intentroute.stack import NatsServer, ServerTls
from intentroute.stack.auth import admin_kwargs, auth_files, reload_server, write_auth
from shared import natsauth
from shared.consumer import StageConsumer, StageSpec, ensure_consumer
from shared.contracts import request
from shared.natsconn import credential_kwargs, tls_context
from shared.settings import CommonSettings
from shared.store.agents import hash_secret, new_credential
from tests.helpers.nats_auth import connect_eventually, declare_agent_scoped_streams

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
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(natsauth, "LEGACY_SUBJECTS", False)
        server = start_tls_server(state_dir, ServerTls(str(pki.server_cert), str(pki.server_key)))
        try:
            # An agent, as the stack's auth sync would write it from the agents table.
            cred = new_credential("tlsagent", "s3cret-for-the-tls-test")
            write_auth(auth_files(state_dir), [("tlsagent", hash_secret(cred.nats["password"]))])
            reload_server(server.pid)
            ca_only = {"tls": tls_context(str(pki.ca))}
            await declare_agent_scoped_streams(server.url, {**admin_kwargs(state_dir), **ca_only})
            yield TlsStack(server, pki, state_dir), dict(cred.nats)
        finally:
            server.stop()


async def test_a_request_and_its_answer_go_through_tls(
    tls_stack: tuple[TlsStack, dict[str, str]],
) -> None:
    stack, agent = tls_stack
    common = CommonSettings(nats_url=stack.server.url, nats_tls_ca=str(stack.pki.ca))
    assert stack.server.url.startswith("tls://")
    caller = await connect_eventually(
        stack.server.url,
        credential_kwargs(new_credential("tlsagent", agent["password"]), common))
    # The gateway's service user, connecting the way a worker does: from its settings.
    from intentroute.stack.auth import service_env
    from shared.natsconn import connect_kwargs

    env = service_env(stack.state_dir, "gateway")
    worker_settings = CommonSettings(
        nats_url=stack.server.url, nats_user=env["NATS_USER"],
        nats_password=env["NATS_PASSWORD"], nats_tls_ca=str(stack.pki.ca))
    gateway = await nats.connect(stack.server.url, **connect_kwargs(worker_settings))
    spec = StageSpec(stream=request.STREAM, subject=natsauth.AGENT_REQUEST_ANY,
                     durable="gateway", max_inflight=2, ack_wait=5, max_deliver=2)

    async def answer(msg: Any) -> None:  # StageConsumer hands a JetStream delivery
        rid = json.loads(msg.data)["request_id"]
        agent_id = msg.msg.subject.rsplit(".", 1)[1]
        await gateway.publish(f"agent.response.{agent_id}.{rid}", b"answered over TLS")

    await ensure_consumer(gateway.jetstream(), spec)
    consumer = StageConsumer(gateway, spec, answer)
    await consumer.start()
    try:
        rid = uuid.uuid4().hex
        sub = await caller.nc.subscribe(f"agent.response.tlsagent.{rid}")
        ack = await caller.nc.jetstream().publish(
            "agent.request.tlsagent", json.dumps({"request_id": rid}).encode())
        assert ack.stream == request.STREAM
        reply = await sub.next_msg(timeout=10)
        assert reply.data == b"answered over TLS"
        assert caller.refusals() == []
    finally:
        await consumer.stop()
        await gateway.drain()
        await caller.nc.close()


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

