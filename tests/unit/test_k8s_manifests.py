"""The Kubernetes manifests (deploy/k8s), checked offline: the committed files are what
`intentroute deploy k8s` renders; every object validates against the Kubernetes 1.30
schemas (kubernetes-validate, strict: an unknown field fails) and each ScaledObject
against KEDA's own CRD schema (deploy/schemas, strict as the API server's field
validation); each stage scales on its own JetStream consumer; each worker's container
environment, resolved from the ConfigMap and the Secrets `deploy init` material renders,
gives it every setting it needs."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from intentroute.deploy.k8s import LAG_THRESHOLD, K8sOptions, render, write
from intentroute.deploy.secrets import init_secrets
from intentroute.rendered import folder_differences
from intentroute.workers import WORKERS
from shared.auth.permissions import WORKER_GRANTS, service_user
from shared.store.roles import WORKER_ROLES
from tests.helpers.deploy_env import WORKER_SETTINGS, environment_problems

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "deploy" / "k8s"
KEDA_CRD = REPO / "deploy" / "schemas" / "keda.sh_scaledobjects.yaml"
KUBERNETES = "1.30"

# KEDA's nats-jetstream scaler (pkg/scalers/nats_jetstream_scaler.go, v2.20.1): the
# metadata it parses; account or accountID is required, so are the others listed.
JETSTREAM_KEYS = {"account", "accountID", "stream", "consumer", "lagThreshold",
                  "activationLagThreshold", "useHttps", "natsServerMonitoringEndpoint"}
JETSTREAM_REQUIRED = {"stream", "consumer", "natsServerMonitoringEndpoint"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every manifest, the Secrets included (from fresh `deploy init` material)."""
    root = tmp_path_factory.mktemp("k8s")
    secrets = init_secrets(root / "secrets").root
    write(root / "out", K8sOptions(), secrets)
    return {path.name: [d for d in yaml.safe_load_all(path.read_text()) if d]
            for path in sorted((root / "out").glob("*.yaml"))}


def objects(rendered: dict[str, list[dict[str, Any]]], kind: str = "") -> list[dict[str, Any]]:
    return [d for docs in rendered.values() for d in docs
            if d["kind"] != "Kustomization" and (not kind or d["kind"] == kind)]


def test_the_committed_manifests_are_the_rendered_ones() -> None:
    assert folder_differences(render(), COMMITTED) == [], (
        "run `intentroute deploy k8s` and commit deploy/k8s")
    assert not (COMMITTED / "secrets.yaml").exists(), "secrets.yaml must not be committed"


def test_the_kustomization_lists_every_file(rendered: dict[str, list[dict[str, Any]]]) -> None:
    (kustomization,) = rendered["kustomization.yaml"]
    assert sorted(kustomization["resources"]) == sorted(set(rendered) - {"kustomization.yaml"})


def test_every_object_validates_against_the_kubernetes_schemas(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    checked = set()
    for doc in objects(rendered):
        if doc["kind"] == "ScaledObject":
            continue
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        checked.add(doc["kind"])
    assert checked == {"ConfigMap", "Deployment", "Job", "PersistentVolumeClaim", "Secret",
                       "Service"}


def test_the_kubernetes_validation_would_catch_a_mistake(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    deployment = copy.deepcopy(objects(rendered, "Deployment")[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRefs"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def _strict(schema: Any) -> Any:
    """The CRD's schema as the API server applies it with strict field validation: an
    object's unknown fields are errors (unless it preserves them)."""
    if isinstance(schema, dict):
        schema = {key: _strict(value) for key, value in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [_strict(item) for item in schema]
    return schema


@pytest.fixture(scope="module")
def keda_validator() -> jsonschema.Draft4Validator:
    crd = next(d for d in yaml.safe_load_all(KEDA_CRD.read_text()) if d)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: checked below
    return jsonschema.Draft4Validator(schema)


def test_scaled_objects_validate_against_kedas_crd(
        rendered: dict[str, list[dict[str, Any]]],
        keda_validator: jsonschema.Draft4Validator) -> None:
    scaled = objects(rendered, "ScaledObject")
    assert len(scaled) == len(WORKERS) + 1  # every worker and the parser
    for doc in scaled:
        assert doc["apiVersion"] == "keda.sh/v1alpha1"
        keda_validator.validate(doc)
        spec = doc["spec"]  # the CRD's CEL rule
        assert spec["minReplicaCount"] <= spec.get("maxReplicaCount", 100)
        broken = copy.deepcopy(doc)
        broken["spec"]["triggers"][0]["metadatas"] = {}
        with pytest.raises(jsonschema.ValidationError):
            keda_validator.validate(broken)


def test_each_stage_scales_on_its_own_consumers_lag(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    deployments = {d["metadata"]["name"]: d for d in objects(rendered, "Deployment")}
    for doc in objects(rendered, "ScaledObject"):
        target = doc["spec"]["scaleTargetRef"]["name"]
        assert target in deployments
        worker = target.removeprefix("intentroute-")
        (trigger,) = doc["spec"]["triggers"]
        if worker in ("gateway", "parser"):  # per-agent consumers / no queue: CPU
            assert trigger["type"] == "cpu"
            continue
        assert trigger["type"] == "nats-jetstream"
        meta = trigger["metadata"]
        assert set(meta) <= JETSTREAM_KEYS
        assert set(meta) >= JETSTREAM_REQUIRED
        assert meta["account"] == "$G"
        grant = WORKER_GRANTS[worker]
        assert (meta["stream"], meta["consumer"]) == (grant.stream, grant.durable)
        assert re.fullmatch(r"[^:/]+:\d+", meta["natsServerMonitoringEndpoint"])
        # One replica's pull: the worker's max_inflight default.
        settings: Any = WORKER_SETTINGS[worker]({})
        held = getattr(settings, "concurrency", None) or settings.batch_size
        assert int(meta["lagThreshold"]) == LAG_THRESHOLD[worker] == held


def test_one_deployment_per_worker_type_and_model_slot_and_the_parser(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    names = {d["metadata"]["name"] for d in objects(rendered, "Deployment")}
    assert names == {f"intentroute-{w}" for w in (*WORKERS, "parser")}


def _container_env(container: dict[str, Any], pod: dict[str, Any],
                   rendered: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom, then env with
    $(VAR) expanded and secretKeyRef read from the rendered Secrets."""
    configs = {d["metadata"]["name"]: d["data"] for d in objects(rendered, "ConfigMap")}
    secrets = {d["metadata"]["name"]: d["stringData"] for d in objects(rendered, "Secret")}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(configs[source["configMapRef"]["name"]])
    for var in container.get("env", []):
        if "valueFrom" in var:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]][ref["key"]]
        else:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], var["value"])
    return env


@pytest.mark.parametrize("worker", WORKERS)
def test_each_worker_gets_every_setting_it_needs(
        worker: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    (deployment,) = [d for d in objects(rendered, "Deployment")
                     if d["metadata"]["name"] == f"intentroute-{worker}"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["worker", worker]
    env = _container_env(container, pod, rendered)
    problems = environment_problems(worker, env)
    assert not problems, "\n".join(problems)
    role = WORKER_ROLES[worker]
    assert env["DATABASE_URL"].startswith(f"postgresql://{role}@")
    assert env["NATS_USER"] == service_user(worker)
    # Its password file is its own role's key of the Postgres Secret.
    mount = next(m for m in container["volumeMounts"]
                 if env["DATABASE_PASSWORD_FILE"].startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["items"] == [{"key": role, "path": "password"}]
    settings: Any = WORKER_SETTINGS[worker](env)
    assert settings.common.nats_authenticated
    assert settings.common.admission_key
