"""Offline checks of deploy/kubernetes, the distributed form of seqcls (validated, not run, here).

Every manifest is validated with kubernetes-validate's bundled schemas in strict mode (an unknown
field fails) for the oldest and the newest Kubernetes version we claim — no cluster, no network
(the socket is blocked for this module). Then the semantics a schema cannot see, which seqcls
relies on: the headless Service selects the Triton pods, so its name resolves to every replica;
one ReadWriteMany claim is what Triton (read-only) and the Airflow task pods (read-write) mount at
``SEQCLS_TRITON_REPOSITORY``; the Triton command is docker-compose's; airflow-values.yaml uses only
chart keys (``schema/airflow-values.schema.json``), real ``SEQCLS_*`` names and the ``dns:///``
endpoints of that Service; Triton's model control needs the key of one Secret (not in the repository)
that the Triton pods and every Airflow container read.
"""

from __future__ import annotations

import copy
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

from seqcls import settings
from seqcls.localtriton import keys

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "kubernetes"
KUSTOMIZATION = DEPLOY / "kustomization.yaml"
AIRFLOW_VALUES = DEPLOY / "airflow-values.yaml"
VALUES_SCHEMA = DEPLOY / "schema" / "airflow-values.schema.json"
AIRFLOW_K8S_DOCKERFILE = DEPLOY / "airflow.Dockerfile"
COMPOSE_FILE = ROOT / "docker-compose.airflow.yml"
TRITON_DOCKERFILE = ROOT / "docker" / "triton.Dockerfile"
AIRFLOW_DOCKERFILE = ROOT / "docker" / "airflow.Dockerfile"
REQUIREMENTS = ROOT / "requirements.txt"

#: Oldest and newest Kubernetes the manifests are claimed for (both bundled by kubernetes-validate).
K8S_VERSIONS = ("1.31.0", "1.37.0")
NAMESPACE = "seqcls"
TRITON = "seqcls-triton"  # Deployment, headless Service and PDB
MODEL_REPOSITORY_CLAIM = "seqcls-model-repository"
TRITON_BASE_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
CLUSTER_DOMAIN = "svc.cluster.local"
NOT_NAMESPACED = {"Namespace"}
CONTROL_KEY_SECRET = "seqcls-triton-control-key"  # created with kubectl, never in the repository
#: How compose (interpolation, mandatory) and Kubernetes (the kubelet's $(VAR) expansion) write the key.
COMPOSE_KEY_REF = re.compile(r"\$\{SEQCLS_TRITON_CONTROL_KEY:\?[^}]*\}")
K8S_KEY_REF = f"$({settings.ENV_TRITON_CONTROL_KEY})"


# ----------------------------------------------------------------------------- loading


def _kustomization() -> dict[str, Any]:
    return yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))


def _manifests() -> list[str]:
    """The kustomization's resources that are manifest files (not other kustomization directories:
    ``../../docker`` only generates the monitoring ConfigMaps, checked in test_monitoring_rules.py)."""
    return [name for name in _kustomization()["resources"] if not (DEPLOY / name).is_dir()]


def _load_docs() -> list[tuple[str, dict[str, Any]]]:
    """(file name, object) for every object of every manifest the kustomization lists."""
    docs = []
    for name in _manifests():
        for doc in yaml.safe_load_all((DEPLOY / name).read_text(encoding="utf-8")):
            if doc:
                docs.append((name, doc))
    return docs


DOCS = _load_docs()


def _doc_id(item: tuple[str, dict[str, Any]]) -> str:
    name, doc = item
    return f"{name}:{doc['kind']}/{doc['metadata']['name']}"


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation must work with no route to a schema host: any connection attempt fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for _, doc in DOCS:
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in found, f"{key} defined twice"
        found[key] = doc
    return found


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    return yaml.safe_load(AIRFLOW_VALUES.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def values_env(values: dict[str, Any]) -> dict[str, str]:
    names = [e["name"] for e in values["env"]]
    assert len(names) == len(set(names)), f"duplicate env names in airflow-values.yaml: {names}"
    return {e["name"]: e["value"] for e in values["env"]}


@pytest.fixture(scope="module")
def compose_triton() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))["services"]["triton"]


def _container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert name in containers, f"no container {name!r} in {deployment['metadata']['name']}"
    return containers[name]


def _claim_volumes(volumes: list[dict[str, Any]]) -> dict[str, str]:
    """Volume name → claim name, for the PVC-backed volumes."""
    return {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v}


def _mounts_by_claim(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Claim name → its volumeMount, so manifests and chart values can be compared by claim."""
    claims = _claim_volumes(volumes)
    return {claims[m["name"]]: m for m in mounts if m["name"] in claims}


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _same_key(argv: list[str]) -> list[str]:
    """``argv`` with either file's reference to the control key as one placeholder (for comparing them)."""
    return [COMPOSE_KEY_REF.sub("<control key>", a).replace(K8S_KEY_REF, "<control key>") for a in argv]


def _iter_deployments(objects: dict[tuple[str, str], dict[str, Any]]) -> Iterator[dict[str, Any]]:
    return (doc for (kind, _), doc in objects.items() if kind == "Deployment")


# ----------------------------------------------------------------------------- schema validity


def test_kustomization_lists_every_manifest() -> None:
    """A manifest left out of kustomization.yaml would be neither applied nor validated here."""
    kustomization = _kustomization()
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources)), f"listed twice: {resources}"
    listed = _manifests()
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - {KUSTOMIZATION.name, AIRFLOW_VALUES.name}
    assert set(listed) == on_disk, f"kustomization resources {sorted(listed)} != manifests {sorted(on_disk)}"
    for directory in set(resources) - set(listed):  # another kustomization (the monitoring ConfigMaps)
        assert (DEPLOY / directory / "kustomization.yaml").is_file(), f"{directory} is no kustomization"
    assert kustomization["namespace"] == NAMESPACE


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("item", DOCS, ids=_doc_id)
def test_manifest_is_valid_kubernetes(item: tuple[str, dict[str, Any]], version: str) -> None:
    """Strict OpenAPI validation: a misspelt or misplaced field is an error, not silently dropped."""
    _, doc = item
    kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_rejects_unknown_fields(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    """The validator really is strict and offline: a typo'd field must fail, not pass silently."""
    broken = copy.deepcopy(objects[("Deployment", TRITON)])
    broken["spec"]["replica"] = broken["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(broken, K8S_VERSIONS[0], strict=True)
    broken = copy.deepcopy(objects[("Deployment", TRITON)])
    _container(broken, "tritonserver")["volumeMounts"][0]["readonly"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="readonly"):
        kubernetes_validate.validate(broken, K8S_VERSIONS[0], strict=True)


def test_everything_in_the_seqcls_namespace(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Claims are namespaced: Triton, MLflow and the Airflow release (helm -n seqcls) share one."""
    assert ("Namespace", NAMESPACE) in objects
    for (kind, name), doc in objects.items():
        if kind not in NOT_NAMESPACED:
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{kind}/{name} is not in {NAMESPACE}"


# ----------------------------------------------------------------------------- Triton


def test_triton_deployment_serves_the_shared_repository_in_explicit_mode(
    objects: dict[tuple[str, str], dict[str, Any]], compose_triton: dict[str, Any]
) -> None:
    deployment = objects[("Deployment", TRITON)]
    spec = deployment["spec"]
    assert spec["replicas"] >= 2, "one replica is not the distributed form"
    pod = spec["template"]["spec"]
    triton = _container(deployment, "tritonserver")
    argv = [*triton["command"], *triton.get("args", [])]
    # The same server as docker-compose's triton service, flag for flag (each file names the key its way).
    assert _same_key(argv) == _same_key([str(a) for a in compose_triton["command"]])
    assert "--model-control-mode=explicit" in argv
    assert "--load-model=*" in argv
    repository = next(a.split("=", 1)[1] for a in argv if a.startswith("--model-repository="))
    mounts = _mounts_by_claim(pod["volumes"], triton["volumeMounts"])
    assert MODEL_REPOSITORY_CLAIM in mounts, f"Triton does not mount the claim {MODEL_REPOSITORY_CLAIM}"
    mount = mounts[MODEL_REPOSITORY_CLAIM]
    assert mount["mountPath"] == repository == "/models"
    assert mount.get("readOnly") is True, "Triton only reads the repository; seqcls writes it"
    ports = {p["name"]: p["containerPort"] for p in triton["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    for flag, port in (("--http-port", 8000), ("--grpc-port", 8001), ("--metrics-port", 8002)):
        assert f"{flag}={port}" in argv
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert triton["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert triton[probe]["httpGet"]["port"] in ports, f"{probe} targets a port the container does not name"
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(triton["resources"][kind]), f"Triton resources.{kind} incomplete"
    assert triton["resources"]["limits"].get("nvidia.com/gpu"), "the NGC image's onnxruntime backend runs on a GPU"


def test_triton_model_control_needs_the_key_of_a_secret_airflow_reads_too(
    objects: dict[tuple[str, str], dict[str, Any]], values: dict[str, Any]
) -> None:
    triton = _container(objects[("Deployment", TRITON)], "tritonserver")
    prefix = f"{','.join(keys.RESTRICTED_APIS)}:{settings.CONTROL_HEADER}="
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in triton["args"] if "=" in a}
    for flag in keys.RESTRICTED_FLAGS:
        assert args.get(flag) == prefix + K8S_KEY_REF, f"{flag} does not restrict model control to the key"
    env = {e["name"]: e for e in triton["env"]}
    ref = env[settings.ENV_TRITON_CONTROL_KEY]["valueFrom"]["secretKeyRef"]
    assert "value" not in env[settings.ENV_TRITON_CONTROL_KEY], "a literal key in the manifest"
    assert ref["name"] == CONTROL_KEY_SECRET and not ref.get("optional"), "without the Secret Triton must not start"
    # the probes stay unauthenticated: health is not restricted
    assert not {"health", "metadata", "inference"} & set(keys.RESTRICTED_APIS)
    # every Airflow container (task pods included) gets the same Secret key as the setting seqcls reads
    shared = [s for s in values.get("secret", []) if s["envName"] == settings.ENV_TRITON_CONTROL_KEY]
    assert shared == [{"envName": settings.ENV_TRITON_CONTROL_KEY, "secretName": ref["name"], "secretKey": ref["key"]}]
    assert settings.ENV_TRITON_CONTROL_KEY not in {e["name"] for e in values["env"]}, "a literal key in the values"
    # the Secret itself is not in the repository: kubectl creates it (README)
    assert not [name for (kind, name) in objects if kind == "Secret"], "no Secret objects (no literal keys) here"
    assert f"create secret generic {CONTROL_KEY_SECRET} --from-literal=key=" in (DEPLOY / "README.md").read_text()


def test_triton_image_is_the_compose_image_built_on_ngc_24_10(
    objects: dict[tuple[str, str], dict[str, Any]], compose_triton: dict[str, Any]
) -> None:
    """The stock NGC image lacks `tokenizers` (the python tokenizer model): use the derived one."""
    image = _container(objects[("Deployment", TRITON)], "tritonserver")["image"]
    assert image == compose_triton["image"]
    base = re.findall(r"^FROM\s+(\S+)", TRITON_DOCKERFILE.read_text(encoding="utf-8"), re.MULTILINE)
    assert base == [TRITON_BASE_IMAGE]
    assert image.rsplit(":", 1)[1] == TRITON_BASE_IMAGE.rsplit(":", 1)[1].removesuffix("-py3")


def test_headless_service_resolves_to_every_triton_replica(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    deployment = objects[("Deployment", TRITON)]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert _selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    headless = objects[("Service", TRITON)]
    assert headless["spec"]["clusterIP"] == "None", "a virtual IP would hide the replicas behind one address"
    assert _selects(headless["spec"]["selector"], pod_labels), "the headless Service selects no Triton pod"
    container_ports = {p["name"]: p["containerPort"] for p in _container(deployment, "tritonserver")["ports"]}
    for port in headless["spec"]["ports"]:
        assert port["targetPort"] in container_ports
        assert port["port"] == container_ports[port["targetPort"]], "DNS gives pod IPs: port must equal the pod's"
    # No other Deployment's pods may answer under the same name.
    for other in _iter_deployments(objects):
        if other is not deployment:
            assert not _selects(headless["spec"]["selector"], other["spec"]["template"]["metadata"]["labels"])
    client = objects[("Service", "seqcls-inference")]
    assert client["spec"].get("clusterIP") != "None"
    assert _selects(client["spec"]["selector"], pod_labels)
    pdb = objects[("PodDisruptionBudget", TRITON)]
    assert _selects(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"], "a PDB this tight blocks every drain"


# ----------------------------------------------------------------------------- shared storage


def test_model_repository_is_one_rwx_claim_triton_reads_and_workers_write(
    objects: dict[tuple[str, str], dict[str, Any]], values: dict[str, Any], values_env: dict[str, str]
) -> None:
    claim = objects[("PersistentVolumeClaim", MODEL_REPOSITORY_CLAIM)]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    triton = objects[("Deployment", TRITON)]
    triton_mount = _mounts_by_claim(
        triton["spec"]["template"]["spec"]["volumes"], _container(triton, "tritonserver")["volumeMounts"]
    )[MODEL_REPOSITORY_CLAIM]
    workers = values["workers"]
    worker_mounts = _mounts_by_claim(workers["extraVolumes"], workers["extraVolumeMounts"])
    assert MODEL_REPOSITORY_CLAIM in worker_mounts, "the Airflow task pods do not mount the model repository"
    worker_mount = worker_mounts[MODEL_REPOSITORY_CLAIM]
    assert worker_mount["mountPath"] == triton_mount["mountPath"] == values_env[settings.ENV_TRITON_REPOSITORY]
    assert not worker_mount.get("readOnly"), "publish/reload write versions and the serving state"


def test_every_claim_mounted_exists_and_release_state_is_shared(
    objects: dict[tuple[str, str], dict[str, Any]], values: dict[str, Any], values_env: dict[str, str]
) -> None:
    """Each task is its own pod: the release home and the checkpoints must be RWX claims too."""
    claims = {name: doc for (kind, name), doc in objects.items() if kind == "PersistentVolumeClaim"}
    workers = values["workers"]
    used = set(_claim_volumes(workers["extraVolumes"]).values())
    for deployment in _iter_deployments(objects):
        used |= set(_claim_volumes(deployment["spec"]["template"]["spec"].get("volumes", [])).values())
    assert used <= set(claims), f"claims mounted but not defined: {sorted(used - set(claims))}"
    mounts = {
        c: m["mountPath"] for c, m in _mounts_by_claim(workers["extraVolumes"], workers["extraVolumeMounts"]).items()
    }
    for env_name in (settings.ENV_HOME, settings.ENV_CHECKPOINTS_ROOT, settings.ENV_TRITON_REPOSITORY):
        path = values_env[env_name]
        shared = [claim for claim, mount_path in mounts.items() if mount_path == path]
        assert shared, f"{env_name}={path} is not a mounted claim in the task pods"
        assert claims[shared[0]]["spec"]["accessModes"] == ["ReadWriteMany"], f"{env_name}: claim is not RWX"


# ----------------------------------------------------------------------------- Airflow values


def _values_validator(version: str = K8S_VERSIONS[0]) -> jsonschema.protocols.Validator:
    """The chart-key subset schema, its Kubernetes $refs resolved from kubernetes-validate (strict)."""
    definitions = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    defs = json.loads((definitions / f"v{version}-local-strict" / "_definitions.json").read_text(encoding="utf-8"))
    registry = Resource.from_contents(defs) @ Registry()
    schema = json.loads(VALUES_SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, registry=registry)


def test_airflow_values_use_only_checked_chart_keys(values: dict[str, Any]) -> None:
    _values_validator().validate(values)


def test_airflow_values_schema_rejects_what_the_chart_would_not_take(values: dict[str, Any]) -> None:
    """A typo'd chart key or a malformed volume must fail here, before `helm install` ignores it."""
    validator = _values_validator()
    typo = copy.deepcopy(values)
    typo["workers"]["extraVolumeMount"] = typo["workers"].pop("extraVolumeMounts")
    assert not validator.is_valid(typo)
    unknown_top = {**values, "executer": "KubernetesExecutor"}
    assert not validator.is_valid(unknown_top)
    secret_typo = copy.deepcopy(values)
    secret_typo["secret"][0]["secretname"] = secret_typo["secret"][0].pop("secretName")
    assert not validator.is_valid(secret_typo)
    bad_volume = copy.deepcopy(values)
    bad_volume["workers"]["extraVolumes"][0]["persistentVolumeClaim"]["claimname"] = MODEL_REPOSITORY_CLAIM
    assert not validator.is_valid(bad_volume)


def test_airflow_env_addresses_every_triton_replica_through_the_headless_service(
    objects: dict[tuple[str, str], dict[str, Any]], values_env: dict[str, str]
) -> None:
    headless = objects[("Service", TRITON)]
    host = f"{headless['metadata']['name']}.{headless['metadata']['namespace']}.{CLUSTER_DOMAIN}"
    ports = {p["name"]: p["port"] for p in headless["spec"]["ports"]}
    assert values_env[settings.ENV_TRITON_GRPC] == f"dns:///{host}:{ports['grpc']}"
    assert values_env[settings.ENV_TRITON_HTTP] == f"dns:///{host}:{ports['http']}"


def test_airflow_env_names_are_the_ones_seqcls_reads(values: dict[str, Any], values_env: dict[str, str]) -> None:
    known = {v for k, v in vars(settings).items() if k.startswith("ENV_") and isinstance(v, str)}
    seqcls_names = {name for name in values_env if name.startswith("SEQCLS_")}
    seqcls_names |= {s["envName"] for s in values.get("secret", []) if s["envName"].startswith("SEQCLS_")}
    assert seqcls_names <= known, f"not read by seqcls.settings: {sorted(seqcls_names - known)}"
    assert values_env[settings.ENV_RUNTIME] in settings.RUNTIMES
    assert values_env[settings.ENV_DEVICE] in settings.DEVICES


def test_mlflow_uri_is_the_mlflow_service_and_an_allowed_host(
    objects: dict[tuple[str, str], dict[str, Any]], values_env: dict[str, str]
) -> None:
    uri = urlsplit(values_env[settings.ENV_MLFLOW_URI])
    service = objects[("Service", "mlflow")]
    assert uri.scheme == "http"
    assert uri.hostname == f"mlflow.{service['metadata']['namespace']}.{CLUSTER_DOMAIN}"
    assert uri.port == service["spec"]["ports"][0]["port"]
    mlflow = objects[("Deployment", "mlflow")]
    pod_labels = mlflow["spec"]["template"]["metadata"]["labels"]
    assert _selects(service["spec"]["selector"], pod_labels)
    argv = _container(mlflow, "mlflow")["command"]
    allowed = next(a.split("=", 1)[1] for a in argv if a.startswith("--allowed-hosts=")).split(",")
    assert uri.netloc in allowed, "MLflow's host check would answer the task pods 403"
    container = _container(mlflow, "mlflow")
    for probe in ("readinessProbe", "livenessProbe"):
        headers = {h["name"]: h["value"] for h in container[probe]["httpGet"].get("httpHeaders", [])}
        assert headers.get("Host") in allowed, f"{probe}: the kubelet's Host would be rejected"
    assert f"--port={uri.port}" in argv
    assert mlflow["spec"]["replicas"] == 1 and mlflow["spec"]["strategy"]["type"] == "Recreate", "one sqlite writer"


def test_airflow_runs_tasks_as_pods_of_the_pinned_airflow(values: dict[str, Any]) -> None:
    assert values["executor"] == "KubernetesExecutor"
    pin = re.search(r"^apache-airflow==(\S+)", REQUIREMENTS.read_text(encoding="utf-8"), re.MULTILINE)
    assert pin, "requirements.txt pins no apache-airflow"
    assert values["airflowVersion"] == values["defaultAirflowTag"] == pin.group(1)
    base = re.search(r"^FROM apache/airflow:(\S+?)-python", AIRFLOW_DOCKERFILE.read_text(encoding="utf-8"), re.M)
    assert base and base.group(1) == pin.group(1)


def test_dags_are_baked_where_the_image_and_the_chart_look(values: dict[str, Any]) -> None:
    """DAG and library from one commit: the DAG is generated from the plugin's step table."""
    image_env = dict(
        re.findall(r"(AIRFLOW__CORE__\w+)=(\S+)", AIRFLOW_DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " "))
    )
    core = values["config"]["core"]
    assert core["dags_folder"] == image_env["AIRFLOW__CORE__DAGS_FOLDER"]
    assert core["plugins_folder"] == image_env["AIRFLOW__CORE__PLUGINS_FOLDER"]
    copies = re.findall(
        r"^COPY\s+(?:--\S+\s+)*dags/\s+(\S+?)/?$", AIRFLOW_K8S_DOCKERFILE.read_text(encoding="utf-8"), re.M
    )
    assert copies == [core["dags_folder"]], "deploy/kubernetes/airflow.Dockerfile does not bake dags/ there"
    assert values["dags"]["gitSync"]["enabled"] is False and values["dags"]["persistence"]["enabled"] is False
