"""What hardens the Kubernetes manifests (k8s.py renders them with it): the pods'
security contexts and writable volumes, secrets as files, a NetworkPolicy per component
and a PodDisruptionBudget per Deployment, with the ports and labels they name.

Every container runs as the image's non-root user (UID) with a read-only root
filesystem, no capabilities, no privilege escalation and the runtime's seccomp profile;
no pod gets a service account token (none calls the Kubernetes API). A pod writes only
to emptyDirs (WRITABLE: its state directory, where caches and the classifier's heads
go, and /tmp) and the ingest Job to the index volume. Secrets reach a pod as files of
one read-only projected volume (SECRET_DIR), named by `*_FILE` settings
(shared.common.envvars.secret_env, DATABASE_PASSWORD_FILE), never as environment values.

One NetworkPolicy per component (each worker, the parser, each Job) denies its pods all
traffic in and out except the paths the architecture uses:

    component       in                                 out
    every worker    metrics (9464) from pods of the    DNS (53), NATS (NATS_URL's ports),
                    cluster (Prometheus)               Postgres (PG_ADDRESS's port)
    doors           also HTTP (8080), gRPC (50052)
                    from anywhere
    classifier,                                        also the model server
    retriever,                                         (OLLAMA_HOST's port)
    generators
    validator                                          also the parser (50051)
    parser          gRPC (50051) from the validator    nothing
    migrate         nothing                            DNS, Postgres
    streams         nothing                            DNS, NATS
    ingest          nothing                            nothing

With Elasticsearch configured (`es_url`) the retriever and ingest also reach its port.
NATS, Postgres and the model server are outside the rendering's namespace, often outside
the cluster: those destinations are matched by port, not address (an overlay can add
`to:` once their addresses are known).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from intentroute.deploy.secrets import DeploySecrets
from intentroute.workers import WORKERS
from shared.auth.natsconn import read_credential
from shared.auth.permissions import ADMIN_USER, service_user
from shared.store.roles import ROLES

Doc = dict[str, Any]

APP = "intentroute"
HOME = "/var/lib/intentroute"
SECRET_DIR = "/var/run/secrets/intentroute"
# The image's user (Dockerfile); group `fsGroup` reads the mounted secrets.
UID = 10001
# Volume -> (mount path, size limit): the emptyDirs, a pod's only writable places
# besides the index volume (ingest).
WRITABLE = {"state": (HOME, "2Gi"), "tmp": ("/tmp", "1Gi")}
METRICS_PORT = 9464
# The doors' faces: HTTP (feedback, the OpenAI door, the dashboard, probes) and gRPC.
DOORS_HTTP_PORT = 8080
DOORS_GRPC_PORT = 50052
PARSER_PORT = 50051
# The stages that call the model server: the generators' answers, the classifier's
# Layer 3, the retriever's relevance judge.
MODEL_USERS = frozenset({"classifier", "retriever", "generator-main",
                         "generator-conversational"})


def labels(component: str) -> dict[str, str]:
    """The labels of a component's objects, which also select its pods."""
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": component}


def meta(name: str, component: str) -> Doc:
    return {"name": name, "labels": labels(component)}


def container_security() -> Doc:
    return {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]}}


def pod_security() -> Doc:
    """The pod spec's fields that harden it (container_security: each container's)."""
    return {"automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
                                "fsGroup": UID,
                                "seccompProfile": {"type": "RuntimeDefault"}}}


def writable_mounts() -> list[Doc]:
    return [{"name": volume, "mountPath": path} for volume, (path, _) in WRITABLE.items()]


def writable_volumes() -> list[Doc]:
    return [{"name": volume, "emptyDir": {"sizeLimit": size}}
            for volume, (_, size) in WRITABLE.items()]


NATS_SECRET = f"{APP}-nats"
NATS_AUTH_SECRET = f"{APP}-nats-auth"
ADMISSION_SECRET = f"{APP}-admission"
POSTGRES_SECRET = f"{APP}-postgres"
# The dashboard's token: the doors' (the Secret keeps the name it had when the dashboard
# was the gateway's).
GATEWAY_SECRET = f"{APP}-gateway"


def secret_docs(secrets_dir: Path) -> list[Doc]:
    """The Secrets from `intentroute deploy init`'s directory (stringData)."""
    found = DeploySecrets(secrets_dir)
    files = found.auth
    nats = {user: read_credential(files.credential(user)).nats["password"]
            for user in (ADMIN_USER, *(service_user(w) for w in WORKERS))}
    postgres = {role: (found.postgres / "roles" / role).read_text(encoding="utf-8").strip()
                for role in ROLES}
    postgres["superuser"] = found.superuser.read_text(encoding="utf-8").strip()
    dashboard = found.gateway_env.read_text(encoding="utf-8").strip().split("=", 1)[1]
    return [
        _secret(NATS_SECRET, nats),
        # For the NATS servers: include it in their config (docs/guides/deploy/kubernetes.md).
        _secret(NATS_AUTH_SECRET, {"auth.conf": files.auth.read_text(encoding="utf-8")}),
        _secret(ADMISSION_SECRET,
                {"key": files.admission_key.read_text(encoding="utf-8").strip()}),
        _secret(POSTGRES_SECRET, postgres),
        _secret(GATEWAY_SECRET, {"dashboard-token": dashboard}),
    ]


def _secret(name: str, data: Mapping[str, str]) -> Doc:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta(name, "secrets"),
            "type": "Opaque", "stringData": dict(data)}


class SecretFile(NamedTuple):
    """A key of a Secret, mounted as SECRET_DIR/<path> (secrets_volume)."""

    secret: str
    key: str
    path: str

    @property
    def file(self) -> str:
        return f"{SECRET_DIR}/{self.path}"


def db_password(role: str) -> SecretFile:
    return SecretFile(POSTGRES_SECRET, role, "db-password")


def nats_password(user: str) -> SecretFile:
    return SecretFile(NATS_SECRET, user, "nats-password")


ADMISSION_KEY = SecretFile(ADMISSION_SECRET, "key", "admission-key")
DASHBOARD_TOKEN = SecretFile(GATEWAY_SECRET, "dashboard-token", "dashboard-token")


def secrets_volume(files: list[SecretFile]) -> Doc:
    """One read-only volume of the pod's secret files, readable by group `fsGroup`."""
    return {"name": "secrets", "projected": {"defaultMode": 0o440, "sources": [
        {"secret": {"name": f.secret, "items": [{"key": f.key, "path": f.path}]}}
        for f in files]}}


def secrets_mount() -> Doc:
    return {"name": "secrets", "mountPath": SECRET_DIR, "readOnly": True}


class Peers(NamedTuple):
    """The ports of the services outside the rendering that pods reach (0: none)."""

    nats: tuple[int, ...]
    postgres: int
    model: int
    elasticsearch: int

    @classmethod
    def of(cls, nats_url: str, postgres: str, model_url: str, es_url: str) -> Peers:
        nats = tuple(sorted({urlsplit(part.strip()).port or 4222
                             for part in nats_url.split(",") if part.strip()}))
        return cls(nats, urlsplit(f"//{postgres}").port or 5432,
                   _url_port(model_url), _url_port(es_url))


def _url_port(url: str) -> int:
    if not url:
        return 0
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def _tcp(*ports: int) -> list[Doc]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def network_policy(component: str, peers: Peers) -> Doc:
    ingress: list[Doc] = []
    egress: list[Doc] = []
    if component == "doors":  # clients and an ingress controller, wherever they are
        ingress.append({"ports": _tcp(DOORS_HTTP_PORT, DOORS_GRPC_PORT)})
    if component in WORKERS:  # the scrape endpoint, for pods of any namespace
        ingress.append({"from": [{"namespaceSelector": {}}], "ports": _tcp(METRICS_PORT)})
    if component == "parser":
        ingress.append({"from": [{"podSelector": {"matchLabels": labels("validator")}}],
                        "ports": _tcp(PARSER_PORT)})
    out: set[int] = set()
    if component in WORKERS or component == "streams":
        out.update(peers.nats)
    if component in WORKERS or component == "migrate":
        out.add(peers.postgres)
    if component in MODEL_USERS and peers.model:
        out.add(peers.model)
    if component in ("retriever", "ingest") and peers.elasticsearch:
        out.add(peers.elasticsearch)
    if out:
        egress += [{"ports": [{"protocol": "UDP", "port": 53}, *_tcp(53)]},
                   {"ports": _tcp(*sorted(out))}]
    if component == "validator":
        egress.append({"to": [{"podSelector": {"matchLabels": labels("parser")}}],
                       "ports": _tcp(PARSER_PORT)})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": meta(f"{APP}-{component}", component),
            "spec": {"podSelector": {"matchLabels": labels(component)},
                     # Both listed: what no rule below allows is denied, in and out.
                     "policyTypes": ["Ingress", "Egress"],
                     "ingress": ingress, "egress": egress}}


def disruption_budget(component: str) -> Doc:
    """One pod of the Deployment at a time through a voluntary disruption (a drain):
    `maxUnavailable`, not `minAvailable`, so a single replica can still be moved (its
    stage's messages wait in JetStream meanwhile) and a drain never blocks."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": meta(f"{APP}-{component}", component),
            "spec": {"maxUnavailable": 1,
                     "selector": {"matchLabels": labels(component)}}}
