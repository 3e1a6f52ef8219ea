"""Kubernetes manifests, rendered from the code's own tables (`intentroute deploy k8s`).

Plain manifests and a kustomization, not a Helm chart: they render here without any
binary (no helm or kustomize is on PyPI), from the same data the workers run on, so the
stream and consumer each KEDA ScaledObject reads are `WORKER_GRANTS`' and each worker's
Postgres role is `WORKER_ROLES`' (a renamed consumer renders anew; `--check` fails until
it is committed). Users adapt them with kustomize overlays (image, namespace, replicas,
addresses: the ConfigMap).

Per worker type and model slot one Deployment; the parser a Deployment and a Service;
the doors a Service for their HTTP and gRPC faces. NATS (e.g. the NATS Helm chart,
given `auth.conf` of the `intentroute-nats-auth` Secret) and Postgres (a managed one) are
external, named in the ConfigMap. Scaling (KEDA): each pipeline stage on its JetStream
consumer's lag (`nats-jetstream` scaler: pending + ack pending); the gateway (one
consumer per agent, which the scaler cannot sum), the doors and the parser (no queue) on
CPU.
Hardened (k8s_hardening.py): non-root, read-only, capability-less pods writing only to
emptyDirs, secrets as files, a NetworkPolicy per component, a PodDisruptionBudget per
Deployment.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import yaml

from intentroute.deploy.k8s_hardening import (
    ADMISSION_KEY,
    APP,
    DASHBOARD_TOKEN,
    DOORS_GRPC_PORT,
    DOORS_HTTP_PORT,
    HOME,
    METRICS_PORT,
    PARSER_PORT,
    POSTGRES_SECRET,
    SECRET_DIR,
    Peers,
    container_security,
    db_password,
    disruption_budget,
    labels,
    meta,
    nats_password,
    network_policy,
    pod_security,
    secret_docs,
    secrets_mount,
    secrets_volume,
    writable_mounts,
    writable_volumes,
)
from intentroute.deploy.secrets import NATS_MONITOR_PORT
from intentroute.workers import WORKERS
from shared.auth.natsconn import inbox_prefix
from shared.auth.permissions import ADMIN_USER, WORKER_GRANTS, service_user
from shared.store.roles import OWNER_ROLE, worker_role

Doc = dict[str, Any]

CONFIG = f"{APP}-config"
INDEX_CLAIM = f"{APP}-index"
SECRETS_FILE = "secrets.yaml"
INDEX_DIR = "/data/index"

# Lag (pending + ack pending) per replica over which KEDA adds one: the messages one
# replica pulls and handles at once (StageSpec.max_inflight: CLASSIFIER_BATCH,
# RETRIEVER_BATCH, GENERATOR_CONCURRENCY, VALIDATOR_BATCH defaults). Beyond it a message
# waits for a free replica. tests/unit/test_k8s_manifests.py keeps them equal.
LAG_THRESHOLD: dict[str, int] = {
    "classifier": 32, "retriever": 16, "generator-main": 16,
    "generator-conversational": 16, "validator": 16,
}
# CPU utilisation target of the gateway, the doors and the parser (of their requests).
CPU_TARGET = 70


class K8sOptions(NamedTuple):
    image: str = "intentroute:latest"
    # The NATS Helm chart's client service and its headless one (the monitoring port,
    # which KEDA's scaler reads: /jsz, and /varz of each node in a cluster).
    nats_url: str = "nats://nats.nats.svc.cluster.local:4222"
    nats_monitoring: str = f"nats-headless.nats.svc.cluster.local:{NATS_MONITOR_PORT}"
    stream_replicas: int = 3
    postgres: str = "postgres.example.internal:5432"
    database: str = "intentroute"
    superuser: str = "postgres"
    ollama_host: str = "http://ollama.ollama.svc.cluster.local:11434"
    # Elasticsearch for the retriever and ingest ("": the embedded index, a volume).
    es_url: str = ""
    max_replicas: int = 10


def render(options: K8sOptions | None = None) -> dict[str, str]:
    """File name -> YAML text of every manifest and the kustomization."""
    options = options or K8sOptions()
    files: dict[str, list[Doc]] = {
        "config.yaml": [_config(options)],
        "index.yaml": [_index_claim()],
        "jobs.yaml": [*_migrate_job(options), *_streams_job(options), *_ingest_job(options)],
        "parser.yaml": [*_parser(options)],
    }
    for worker in WORKERS:
        files[f"{worker}.yaml"] = _worker(worker, options)
    out = {name: _dump(docs) for name, docs in files.items()}
    out["kustomization.yaml"] = _dump([{
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "labels": [{"pairs": {"app.kubernetes.io/part-of": APP}}],
        # secrets.yaml: `intentroute deploy k8s --secrets DIR` writes it (never commit it).
        "resources": [*sorted(out), SECRETS_FILE],
    }])
    return out


def render_secrets(secrets_dir: Path) -> str:
    """The Secrets from `intentroute deploy init`'s directory (stringData)."""
    return _dump(secret_docs(secrets_dir))


class _Dumper(yaml.SafeDumper):
    """Every repeated mapping written out again: no `&id001` anchors for a reader."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(docs: list[Doc]) -> str:
    header = ("# Generated by `intentroute deploy k8s` (intentroute/deploy/k8s.py): change\n"
              "# the renderer or patch with a kustomize overlay, not this file.\n")
    body = "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=100)
                        for d in docs)
    return header + body


def _config(o: K8sOptions) -> Doc:
    data = {
        "NATS_URL": o.nats_url,
        "NATS_STREAM_REPLICAS": str(o.stream_replicas),
        # host:port of Postgres; each pod's DATABASE_URL names its role and database.
        "PG_ADDRESS": o.postgres,
        "OLLAMA_HOST": o.ollama_host,
        "OLLAMA_MODEL_NAME": "qwen3:1.7b",
        "OLLAMA_MODEL_NAME_CONVERSATIONAL": "qwen3:0.6b",
        "INTENTROUTE_HOME": HOME,
        "HOME": HOME,
        "HF_HUB_OFFLINE": "1",
        "METRICS_PORT": str(METRICS_PORT),
        "METRICS_HOST": "0.0.0.0",
        "LOG_FORMAT": "json",
    }
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(CONFIG, "config"),
            "data": data}


def _index_claim() -> Doc:
    # The embedded index, written by the ingest Job, read by every retriever (each
    # re-reads it within a second of a change): a storage class with ReadWriteMany.
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": meta(INDEX_CLAIM, "retriever"),
            "spec": {"accessModes": ["ReadWriteMany"],
                     "resources": {"requests": {"storage": "1Gi"}}}}


def _db_env(role: str, o: K8sOptions) -> list[Doc]:
    return [{"name": "DATABASE_URL",
             "value": f"postgresql://{role}@$(PG_ADDRESS)/{o.database}"},
            {"name": "DATABASE_PASSWORD_FILE", "value": db_password(role).file}]


def _nats_env(user: str) -> list[Doc]:
    # The inbox prefix too: the only reply subjects the user may subscribe to.
    return [{"name": "NATS_USER", "value": user},
            {"name": "NATS_PASSWORD_FILE", "value": nats_password(user).file},
            {"name": "NATS_INBOX_PREFIX", "value": inbox_prefix(user)}]


def _container(name: str, args: list[str], o: K8sOptions, *, env: list[Doc],
               mounts: list[Doc], cpu: str, memory: str) -> Doc:
    return {
        "name": name, "image": o.image, "args": args,
        "envFrom": [{"configMapRef": {"name": CONFIG}}], "env": env,
        "volumeMounts": [*writable_mounts(), *mounts],
        "resources": {"requests": {"cpu": cpu, "memory": memory},
                      "limits": {"memory": memory}},
        "securityContext": container_security(),
    }


def _pod(containers: list[Doc], volumes: list[Doc], *, restart: str = "Always",
         init: list[Doc] | None = None) -> Doc:
    return {
        **pod_security(),
        "restartPolicy": restart,
        **({"initContainers": init} if init else {}),
        "containers": containers,
        "volumes": [*writable_volumes(), *volumes],
    }


def _deployment(name: str, component: str, pod: Doc) -> Doc:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name, component),
            # No `replicas`: its ScaledObject's HPA owns the count (an apply keeps it).
            "spec": {"selector": {"matchLabels": labels(component)},
                     "template": {"metadata": {"labels": labels(component)}, "spec": pod}}}


def _probe(path: str, port: str, *, period: int, failures: int) -> Doc:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period,
            "timeoutSeconds": 3, "failureThreshold": failures}


def _peers(o: K8sOptions) -> Peers:
    return Peers.of(o.nats_url, o.postgres, o.ollama_host, o.es_url)


def _worker(worker: str, o: K8sOptions) -> list[Doc]:
    role = worker_role(worker)
    user = service_user(worker)
    files = [db_password(role), nats_password(user)]
    env = [*_db_env(role, o), *_nats_env(user)]
    if worker != "doors":  # the doors stamp no envelope: no admission key
        files.append(ADMISSION_KEY)
        env.append({"name": "INTENTROUTE_ADMISSION_KEY_FILE", "value": ADMISSION_KEY.file})
    mounts = [secrets_mount()]
    volumes: list[Doc] = []
    ports = [{"name": "metrics", "containerPort": METRICS_PORT}]
    # The scrape endpoint opens once the models are loaded (up to 5 min on a small node).
    health = "/metrics"
    ready = _probe("/metrics", "metrics", period=10, failures=3)
    if worker == "doors":
        files.append(DASHBOARD_TOKEN)
        env += [{"name": "GATEWAY_HTTP_LISTEN", "value": f"0.0.0.0:{DOORS_HTTP_PORT}"},
                {"name": "GATEWAY_GRPC_LISTEN", "value": f"0.0.0.0:{DOORS_GRPC_PORT}"},
                {"name": "GATEWAY_DASHBOARD_TOKEN_FILE", "value": DASHBOARD_TOKEN.file}]
        ports += [{"name": "http", "containerPort": DOORS_HTTP_PORT},
                  {"name": "grpc", "containerPort": DOORS_GRPC_PORT}]
        health = "/healthz"
        ready = _probe("/readyz", "http", period=5, failures=2)
    if worker == "retriever":
        env += _index_env(o)
        mounts.append({"name": "index", "mountPath": INDEX_DIR, "readOnly": True})
        volumes.append({"name": "index", "persistentVolumeClaim": {"claimName": INDEX_CLAIM}})
    if worker == "validator":
        env.append({"name": "AVAP_PARSER_URL", "value": f"{APP}-parser:{PARSER_PORT}"})
    heavy = worker in ("classifier", "retriever")
    container = _container(worker, ["worker", worker], o, env=env, mounts=mounts,
                           cpu="1" if heavy else "250m", memory="2Gi" if heavy else "1Gi")
    port = "http" if worker == "doors" else "metrics"
    container.update(
        ports=ports,
        startupProbe=_probe(health, port, period=5, failures=60),
        livenessProbe=_probe(health, port, period=10, failures=3),
        readinessProbe=ready)
    name = f"{APP}-{worker}"
    pod = _pod([container], [secrets_volume(files), *volumes])
    docs = [_deployment(name, worker, pod)]
    if worker == "doors":
        docs.append(_service(name, worker, {"http": DOORS_HTTP_PORT,
                                            "grpc": DOORS_GRPC_PORT}))
    if worker in ("gateway", "doors"):
        docs.append(_scaled_object(name, worker, o, _cpu_trigger()))
    else:
        docs.append(_scaled_object(name, worker, o, _lag_trigger(worker, o)))
    return [*docs, network_policy(worker, _peers(o)), disruption_budget(worker)]


def _index_env(o: K8sOptions) -> list[Doc]:
    return [{"name": "INDEX_DIR", "value": INDEX_DIR},
            *([{"name": "ES_URL", "value": o.es_url}] if o.es_url else [])]


def _lag_trigger(worker: str, o: K8sOptions) -> Doc:
    grant = WORKER_GRANTS[worker]
    return {"type": "nats-jetstream", "metadata": {
        "natsServerMonitoringEndpoint": o.nats_monitoring,
        # Users in `authorization`, no accounts: everything is in the global account.
        "account": "$G",
        "stream": grant.stream,
        "consumer": grant.durable,
        "lagThreshold": str(LAG_THRESHOLD[worker]),
        "activationLagThreshold": "0",
    }}


def _cpu_trigger() -> Doc:
    return {"type": "cpu", "metricType": "Utilization", "metadata": {"value": str(CPU_TARGET)}}


def _scaled_object(name: str, component: str, o: K8sOptions, trigger: Doc) -> Doc:
    return {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": meta(name, component),
        "spec": {
            "scaleTargetRef": {"name": name},
            # Never to zero: a replica loads its models for minutes before it pulls.
            "minReplicaCount": 1,
            "maxReplicaCount": o.max_replicas,
            "pollingInterval": 10,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                # Out at once, in after five quiet minutes (no flapping on bursts).
                "scaleDown": {"stabilizationWindowSeconds": 300},
                "scaleUp": {"stabilizationWindowSeconds": 0}}}},
            "triggers": [trigger],
        },
    }


def _service(name: str, component: str, ports: Mapping[str, int]) -> Doc:
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(name, component),
            "spec": {"selector": labels(component), "ports": [
                {"name": port_name, "port": port, "targetPort": port_name}
                for port_name, port in ports.items()]}}


def _parser(o: K8sOptions) -> list[Doc]:
    name = f"{APP}-parser"
    container = _container("parser", ["parser", "--host", "0.0.0.0", "--port",
                                      str(PARSER_PORT)], o,
                           env=[], mounts=[], cpu="250m", memory="512Mi")
    grpc = {"grpc": {"port": PARSER_PORT}, "periodSeconds": 10, "timeoutSeconds": 3,
            "failureThreshold": 3}
    container.update(ports=[{"name": "grpc", "containerPort": PARSER_PORT}],
                     livenessProbe=grpc, readinessProbe=grpc)
    return [_deployment(name, "parser", _pod([container], [])),
            _service(name, "parser", {"grpc": PARSER_PORT}),
            _scaled_object(name, "parser", o, _cpu_trigger()),
            network_policy("parser", _peers(o)), disruption_budget("parser")]


def _job(component: str, pod: Doc, o: K8sOptions) -> list[Doc]:
    """The Job (its pods labelled as its component) and its pods' NetworkPolicy."""
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": meta(f"{APP}-{component}", component),
           "spec": {"backoffLimit": 10, "template": {
               "metadata": {"labels": labels(component)}, "spec": pod}}}
    return [job, network_policy(component, _peers(o))]


def _migrate_job(o: K8sOptions) -> list[Doc]:
    """db-init (the superuser: roles, database) then migrate (the owner role)."""
    folder = f"{SECRET_DIR}/postgres"
    init = _container("db-init", ["db-init", "--passwords", folder], o, env=[
        {"name": "DATABASE_URL",
         "value": f"postgresql://{o.superuser}@$(PG_ADDRESS)/{o.database}"},
        {"name": "DATABASE_PASSWORD_FILE", "value": f"{folder}/superuser"}],
        mounts=[{"name": "postgres", "mountPath": folder, "readOnly": True}],
        cpu="100m", memory="512Mi")
    migrate = _container("migrate", ["migrate"], o, env=_db_env(OWNER_ROLE, o),
                         mounts=[secrets_mount()], cpu="100m", memory="512Mi")
    volumes = [{"name": "postgres", "secret": {"secretName": POSTGRES_SECRET,
                                               "defaultMode": 0o440}},
               secrets_volume([db_password(OWNER_ROLE)])]
    return _job("migrate", _pod([migrate], volumes, restart="OnFailure", init=[init]), o)


def _streams_job(o: K8sOptions) -> list[Doc]:
    streams = _container("streams", ["deploy", "streams"], o, env=_nats_env(ADMIN_USER),
                         mounts=[secrets_mount()], cpu="100m", memory="512Mi")
    volumes = [secrets_volume([nats_password(ADMIN_USER)])]
    return _job("streams", _pod([streams], volumes, restart="OnFailure"), o)


def _ingest_job(o: K8sOptions) -> list[Doc]:
    ingest = _container("ingest", ["ingest", "/app/kb"], o, env=_index_env(o),
                        mounts=[{"name": "index", "mountPath": INDEX_DIR}],
                        cpu="1", memory="2Gi")
    volumes = [{"name": "index", "persistentVolumeClaim": {"claimName": INDEX_CLAIM}}]
    return _job("ingest", _pod([ingest], volumes, restart="OnFailure"), o)


def write(out: Path, options: K8sOptions | None = None,
          secrets_dir: Path | None = None) -> list[str]:
    """Write the manifests (and with `secrets_dir` the Secrets, 0600) into `out`."""
    from intentroute.stack.nats_users import write_private

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render(options).items():
        (out / name).write_text(text, encoding="utf-8")
        written.append(name)
    if secrets_dir is not None:
        write_private(out / SECRETS_FILE, render_secrets(secrets_dir))
        written.append(SECRETS_FILE)
    return written


def options_from(values: Mapping[str, str]) -> K8sOptions:
    """K8sOptions from `--set key=value` pairs (an unknown key is a ValueError)."""
    unknown = sorted(set(values) - set(K8sOptions._fields))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)}; known: "
                         f"{', '.join(K8sOptions._fields)}")
    typed = {}
    for key, value in values.items():
        kind = type(getattr(K8sOptions(), key))
        try:
            typed[key] = msgspec.convert(value, kind, strict=False)
        except msgspec.ValidationError:
            raise ValueError(f"{key}: expected {kind.__name__}, got {value!r}") from None
    return K8sOptions(**typed)
