"""The Kubernetes manifests (deploy/k8s), checked offline: the committed files are what
`intentroute deploy k8s` renders; every object validates against the Kubernetes 1.30
schemas (kubernetes-validate, strict: an unknown field fails) and each ScaledObject
against KEDA's own CRD schema (deploy/schemas, strict as the API server's field
validation); each stage scales on its own JetStream consumer; each worker's container
environment, resolved from the ConfigMap and the secret files `deploy init` material
renders, gives it every setting it needs. Hardened: every pod non-root, read-only, with
no capabilities and no token, writing only where its component must; no secret in an
environment value; each component's NetworkPolicy allows exactly the paths the
architecture uses; each Deployment has a PodDisruptionBudget."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from intentroute.deploy.k8s import LAG_THRESHOLD, K8sOptions, options_from, render, write
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
DOCKERFILE = REPO / "Dockerfile"
Doc = dict[str, Any]
Rendered = dict[str, list[Doc]]

# KEDA's nats-jetstream scaler (pkg/scalers/nats_jetstream_scaler.go, v2.20.1): the
# metadata it parses; account or accountID is required, so are the others listed.
JETSTREAM_KEYS = {"account", "accountID", "stream", "consumer", "lagThreshold",
                  "activationLagThreshold", "useHttps", "natsServerMonitoringEndpoint"}
JETSTREAM_REQUIRED = {"stream", "consumer", "natsServerMonitoringEndpoint"}


def render_all(root: Path, options: K8sOptions) -> Rendered:
    """Every manifest, the Secrets included (from fresh `deploy init` material)."""
    secrets = init_secrets(root / "secrets").root
    write(root / "out", options, secrets)
    return {path.name: [d for d in yaml.safe_load_all(path.read_text()) if d]
            for path in sorted((root / "out").glob("*.yaml"))}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    return render_all(tmp_path_factory.mktemp("k8s"), K8sOptions())


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
                       "Service", "NetworkPolicy", "PodDisruptionBudget"}


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
        if worker in ("gateway", "doors", "parser"):  # per-agent consumers / no queue: CPU
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


def _secret_files(container: Doc, pod: Doc, rendered: Rendered) -> dict[str, str]:
    """Path -> contents of each secret file mounted in the container, as the kubelet
    writes them from the rendered Secrets (secret and projected volumes)."""
    secrets = {d["metadata"]["name"]: d["stringData"] for d in objects(rendered, "Secret")}
    volumes = {v["name"]: v for v in pod["volumes"]}
    files: dict[str, str] = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        sources = ([s["secret"] for s in volume["projected"]["sources"]]
                   if "projected" in volume else
                   [{"name": volume["secret"]["secretName"], **volume["secret"]}]
                   if "secret" in volume else [])
        for source in sources:
            data = secrets[source["name"]]
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            files.update({f"{mount['mountPath']}/{item['path']}": data[item["key"]]
                          for item in items})
    return files


def _container_env(container: Doc, rendered: Rendered) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom, then env with
    $(VAR) expanded."""
    configs = {d["metadata"]["name"]: d["data"] for d in objects(rendered, "ConfigMap")}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(configs[source["configMapRef"]["name"]])
    for var in container.get("env", []):
        env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], var["value"])
    return env


# Read by the settings from the file NAME_FILE names (shared.common.envvars.secret_env),
# which tests/helpers/deploy_env does not know: resolved to NAME for its check.
SECRET_FILE_SETTINGS = {"NATS_PASSWORD", "INTENTROUTE_ADMISSION_KEY", "GATEWAY_DASHBOARD_TOKEN"}


@pytest.mark.parametrize("worker", WORKERS)
def test_each_worker_gets_every_setting_it_needs(
        worker: str, rendered: Rendered, tmp_path: Path) -> None:
    (deployment,) = [d for d in objects(rendered, "Deployment")
                     if d["metadata"]["name"] == f"intentroute-{worker}"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["worker", worker]
    env = _container_env(container, rendered)
    files = _secret_files(container, pod, rendered)
    resolved = dict(env)
    for name in SECRET_FILE_SETTINGS & {n.removesuffix("_FILE") for n in env}:
        resolved[name] = files[resolved.pop(f"{name}_FILE")]
    problems = environment_problems(worker, resolved)
    assert not problems, "\n".join(problems)
    role = WORKER_ROLES[worker]
    assert env["DATABASE_URL"].startswith(f"postgresql://{role}@")
    assert env["NATS_USER"] == service_user(worker)
    # Its password file holds its own role's key of the Postgres Secret.
    secrets = {d["metadata"]["name"]: d["stringData"] for d in objects(rendered, "Secret")}
    assert files[env["DATABASE_PASSWORD_FILE"]] == secrets["intentroute-postgres"][role]
    # The worker reads each secret from its file (written here where the pod has it).
    for path, text in files.items():
        (tmp_path / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path.lstrip("/")).write_text(text)
    settings: Any = WORKER_SETTINGS[worker](
        {name: str(tmp_path / value.lstrip("/")) if value in files else value
         for name, value in env.items()})
    assert settings.common.nats_authenticated
    assert settings.common.nats_password == secrets["intentroute-nats"][service_user(worker)]
    if worker == "doors":  # no envelope to stamp: no admission key; the dashboard's token
        assert settings.common.admission_key == ""
        assert settings.dashboard.token == secrets["intentroute-gateway"]["dashboard-token"]
    else:
        assert settings.common.admission_key == secrets["intentroute-admission"]["key"]


def pods(rendered: Rendered) -> dict[str, Doc]:
    """Component -> the pod template of its Deployment or Job."""
    found = {}
    for doc in objects(rendered):
        if doc["kind"] in ("Deployment", "Job"):
            template = doc["spec"]["template"]
            component = template["metadata"]["labels"]["app.kubernetes.io/component"]
            assert component not in found
            found[component] = template
    assert set(found) == {*WORKERS, "parser", "migrate", "streams", "ingest"}
    return found


def containers(pod: Doc) -> list[Doc]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def test_every_pod_runs_as_the_images_non_root_user_read_only_without_privileges(
        rendered: Rendered) -> None:
    user = re.search(r"^USER (\d+):(\d+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert user, "the Dockerfile names its user by number"
    for component, template in pods(rendered).items():
        pod = template["spec"]
        assert pod["automountServiceAccountToken"] is False, component
        for container in containers(pod):
            context = {**pod["securityContext"], **container["securityContext"]}
            assert context["runAsNonRoot"] is True, component
            assert (context["runAsUser"], context["runAsGroup"]) == tuple(
                map(int, user.groups())), component
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, component
            assert context["readOnlyRootFilesystem"] is True, component
            assert context["allowPrivilegeEscalation"] is False, component
            assert context["capabilities"] == {"drop": ["ALL"]}, component
            assert not context.get("privileged"), component
            assert container["resources"]["limits"]["memory"], component


# What each component may write: its state directory (caches, the classifier's heads)
# and /tmp, emptyDirs; ingest also the index volume the retrievers read.
WRITABLE = {"/var/lib/intentroute": "emptyDir", "/tmp": "emptyDir"}
WRITES = {component: WRITABLE for component in (*WORKERS, "parser", "migrate", "streams")}
WRITES["ingest"] = {**WRITABLE, "/data/index": "persistentVolumeClaim"}


def test_each_component_writes_only_where_it_must(rendered: Rendered) -> None:
    for component, template in pods(rendered).items():
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        for container in containers(template["spec"]):
            writable = {m["mountPath"]: next(k for k in volumes[m["name"]] if k != "name")
                        for m in container["volumeMounts"] if not m.get("readOnly")}
            assert writable == WRITES[component], (component, container["name"])


def test_no_secret_is_an_environment_value(rendered: Rendered) -> None:
    values = {value for doc in objects(rendered, "Secret")
              for value in doc["stringData"].values()}
    for component, template in pods(rendered).items():
        for container in containers(template["spec"]):
            assert all("secretRef" not in source for source in container.get("envFrom", []))
            for var in container.get("env", []):
                assert "valueFrom" not in var, (component, var)
                assert var["value"] not in values, (component, var["name"])
    # Each secret setting is a *_FILE naming a file of the read-only secrets volume.
    for worker in WORKERS:
        (container,) = pods(rendered)[worker]["spec"]["containers"]
        names = {var["name"] for var in container["env"]}
        assert {f"{n}_FILE" for n in ("DATABASE_PASSWORD", "NATS_PASSWORD")} <= names
        assert ("INTENTROUTE_ADMISSION_KEY_FILE" in names) == (worker != "doors")
        assert ("GATEWAY_DASHBOARD_TOKEN_FILE" in names) == (worker == "doors")
        assert not names & {"NATS_PASSWORD", "INTENTROUTE_ADMISSION_KEY",
                            "GATEWAY_DASHBOARD_TOKEN"}


def _rules(rules: list[Doc], peers_key: str) -> set[tuple[str, str, int]]:
    """(peer, protocol, port) allowed: peer "any", "cluster" (pods of any namespace) or
    "pods:<component>"."""
    allowed = set()
    for rule in rules:
        peers = []
        for peer in rule.get(peers_key, [{}]):
            if peer == {}:
                peers.append("any")
            elif peer == {"namespaceSelector": {}}:
                peers.append("cluster")
            else:
                (key,) = peer
                assert key == "podSelector", peer
                labels = peer["podSelector"]["matchLabels"]
                assert labels["app.kubernetes.io/name"] == "intentroute"
                peers.append(f"pods:{labels['app.kubernetes.io/component']}")
        allowed |= {(peer, port["protocol"], port["port"])
                    for peer in peers for port in rule["ports"]}
    return allowed


def _policies(rendered: Rendered) -> dict[str, tuple[set[Any], set[Any]]]:
    """Component -> (ingress, egress) its pods' one NetworkPolicy allows."""
    policies = objects(rendered, "NetworkPolicy")
    found = {}
    for component, template in pods(rendered).items():
        labels = template["metadata"]["labels"]
        (policy,) = [p for p in policies
                     if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        spec = policy["spec"]
        # Both types: whatever no rule allows is denied, in and out.
        assert spec["policyTypes"] == ["Ingress", "Egress"]
        found[component] = (_rules(spec["ingress"], "from"), _rules(spec["egress"], "to"))
    assert len(policies) == len(found)
    return found


def _expected_paths(nats: int = 4222, postgres: int = 5432, model: int = 11434,
                    es: int = 0) -> dict[str, tuple[set[Any], set[Any]]]:
    """The architecture's paths: workers reach NATS, Postgres (and DNS); the model
    server is the generators', the classifier's Layer 3 and the retriever's judge; the
    validator calls the parser; the doors' faces and every scrape endpoint are
    reached; jobs: migrate Postgres, streams NATS, ingest nothing (Elasticsearch)."""
    dns = {("any", "UDP", 53), ("any", "TCP", 53)}
    core = dns | {("any", "TCP", nats), ("any", "TCP", postgres)}
    scrape = {("cluster", "TCP", 9464)}
    llm = {("any", "TCP", model)}
    search = {("any", "TCP", es)} if es else set()
    return {
        "gateway": (scrape, core),
        "doors": (scrape | {("any", "TCP", 8080), ("any", "TCP", 50052)}, core),
        "classifier": (scrape, core | llm),
        "retriever": (scrape, core | llm | search),
        "generator-main": (scrape, core | llm),
        "generator-conversational": (scrape, core | llm),
        "validator": (scrape, core | {("pods:parser", "TCP", 50051)}),
        "parser": ({("pods:validator", "TCP", 50051)}, set()),
        "migrate": (set(), dns | {("any", "TCP", postgres)}),
        "streams": (set(), dns | {("any", "TCP", nats)}),
        "ingest": (set(), (dns | search) if es else set()),
    }


def test_each_component_may_use_only_the_paths_of_the_architecture(
        rendered: Rendered, tmp_path: Path) -> None:
    assert _policies(rendered) == _expected_paths()
    # The ports follow the addresses the rendering is given.
    options = options_from({"nats_url": "nats://a:4223,nats://b:4223", "postgres": "db:6432",
                            "ollama_host": "https://models.internal",
                            "es_url": "http://es.search:9200"})
    assert _policies(render_all(tmp_path, options)) == _expected_paths(
        nats=4223, postgres=6432, model=443, es=9200)


def test_the_policies_ports_are_the_ones_the_pods_listen_on(rendered: Rendered) -> None:
    policies = _policies(rendered)
    for component, template in pods(rendered).items():
        if component not in (*WORKERS, "parser"):
            continue
        (container,) = template["spec"]["containers"]
        listening = {port["containerPort"] for port in container["ports"]}
        env = _container_env(container, rendered)
        said = {int(value.rsplit(":", 1)[1]) for name, value in env.items()
                if name in ("GATEWAY_HTTP_LISTEN", "GATEWAY_GRPC_LISTEN")}
        if component in WORKERS:
            said.add(int(env["METRICS_PORT"]))
        else:
            said.add(int(container["args"][container["args"].index("--port") + 1]))
        assert listening == said == {port for _, _, port in policies[component][0]}
    (validator,) = pods(rendered)["validator"]["spec"]["containers"]
    parser_url = _container_env(validator, rendered)["AVAP_PARSER_URL"]
    assert ("pods:parser", "TCP", int(parser_url.rsplit(":", 1)[1])) in policies["validator"][1]


def test_each_deployment_has_a_disruption_budget(rendered: Rendered) -> None:
    budgets = {d["metadata"]["name"]: d for d in objects(rendered, "PodDisruptionBudget")}
    deployments = objects(rendered, "Deployment")
    assert len(budgets) == len(deployments)
    for deployment in deployments:
        budget = budgets[deployment["metadata"]["name"]]["spec"]
        assert budget["selector"] == deployment["spec"]["selector"]
        # One at a time; a single replica can still be drained.
        assert budget["maxUnavailable"] == 1
        assert "minAvailable" not in budget
