"""Static checks of docker-compose.airflow.yml and the images it builds (no Docker engine needed).

The YAML is read with PyYAML (anchors/merge keys resolved) and checked against the contract with
the project: service set, health checks, loopback-only ports, the shared Triton repository
volume, Connections the hooks read, SEQCLS_* names that exist in ``seqcls.settings``, and Triton's
model control restricted to the key ``SEQCLS_TRITON_CONTROL_KEY`` — the Triton Connection's password
and the Airflow containers' setting, from the environment / ``.env`` only. Issue 14: the Airflow
image installs seqcls as a package (a wheel built in a first stage, ``--no-deps`` over the pinned
requirements; the build fails unless Airflow lists the provider and the plugin), nothing is
bind-mounted over the plugins folder, the Connections are of the provider's types, and a
``prometheus`` service scrapes Triton's metrics port (``docker/prometheus.yml``, job ``triton``;
issue 27: its rules, the ``grafana`` service and the dashboard are checked in test_monitoring_rules.py).
Then Debian's ``docker-compose`` (1.29, engine-less) validates the file for real, must reject a
broken copy of it, and must refuse the file without the key (default-deny).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from seqcls import settings
from seqcls.localtriton import keys

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.airflow.yml"
REQUIREMENTS = ROOT / "requirements.txt"
TRITON_REQUIREMENTS = ROOT / "docker" / "requirements-triton.txt"
PROMETHEUS_CONFIG = ROOT / "docker" / "prometheus.yml"

EXPECTED_SERVICES = {
    "postgres",
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
    "redis",
    "mlflow",
    "triton",
    "prometheus",
    "grafana",
}
ONE_SHOT_SERVICES = {"airflow-init"}
AIRFLOW_SERVICES = sorted(s for s in EXPECTED_SERVICES if s.startswith("airflow-"))
AIRFLOW_LONG_RUNNING = [s for s in AIRFLOW_SERVICES if s not in ONE_SHOT_SERVICES]
LOOPBACK = "127.0.0.1"
COMPOSE_TIMEOUT_S = 60
#: The one way the file may name the control key: a mandatory reference (compose fails without it).
CONTROL_KEY_REF = re.compile(r"\$\{SEQCLS_TRITON_CONTROL_KEY:\?[^}]+\}")
TEST_KEY = "compose-test-key-" + "0123456789abcdef" * 2
#: The team stack's MLflow secrets: the basic-auth password (server admin, Connection, CLI) and Flask's key.
MLFLOW_SECRETS = {"MLFLOW_ADMIN_PASSWORD": "compose-test-mlflow-pw", "MLFLOW_SECRET_KEY": "compose-test-flask"}
MLFLOW_PASSWORD_REF = re.compile(r"\$\{MLFLOW_ADMIN_PASSWORD:\?[^}]+\}")


# ----------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def compose() -> dict:
    data = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), "no services: mapping"
    return data


@pytest.fixture(scope="module")
def services(compose: dict) -> dict:
    return compose["services"]


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # KEY=VALUE list form
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _command(service: dict) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def _options(argv: list[str]) -> dict[str, str]:
    """``--key=value`` and ``--key value`` options of a command line."""
    options: dict[str, str] = {}
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        if "=" in arg:
            key, value = arg.split("=", 1)
        else:
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            key, value = arg, ("" if nxt.startswith("--") else nxt)
        options[key] = value
    return options


def _volume_mounts(service: dict) -> dict[str, str]:
    """Container target -> source (named volume or host path) of a service's volumes."""
    mounts: dict[str, str] = {}
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            mounts[entry["target"]] = str(entry.get("source", ""))
            continue
        parts = str(entry).split(":")
        if len(parts) == 1:  # anonymous volume
            mounts[parts[0]] = ""
        else:
            mounts[parts[1]] = parts[0]
    return mounts


def _published_ports(service: dict) -> list[tuple[str | None, str, str]]:
    """(host_ip, published, target) for each ``ports`` entry."""
    result = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            result.append((entry.get("host_ip"), str(entry.get("published", "")), str(entry["target"])))
            continue
        spec = str(entry).split("/", 1)[0]
        parts = spec.rsplit(":", 2)
        if len(parts) == 3:
            result.append((parts[0], parts[1], parts[2]))
        elif len(parts) == 2:
            result.append((None, parts[0], parts[1]))
        else:
            result.append((None, "", parts[0]))
    return result


def _container_ports(service: dict) -> set[int]:
    ports = {int(target) for _, _, target in _published_ports(service)}
    ports |= {int(str(p).split("/", 1)[0]) for p in service.get("expose") or []}
    return ports


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;]+)", line)
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def _settings_env_names() -> set[str]:
    return {value for name, value in vars(settings).items() if name.startswith("ENV_") and isinstance(value, str)}


def _host_port(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.strip().rpartition(":")
    assert host and port.isdigit(), f"endpoint {endpoint!r} is not host:port"
    return host, int(port)


def _docker_compose(*args: str, cwd: Path = ROOT, key: str | None = TEST_KEY) -> subprocess.CompletedProcess[str]:
    """``docker-compose`` with ``SEQCLS_TRITON_CONTROL_KEY=key`` in its environment (None: unset), and the
    MLflow secrets."""
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose binary not installed (Debian: apt-get install -y docker-compose)")
    env = {k: v for k, v in os.environ.items() if k != settings.ENV_TRITON_CONTROL_KEY}
    env.update(MLFLOW_SECRETS)
    if key is not None:
        env[settings.ENV_TRITON_CONTROL_KEY] = key
    return subprocess.run(
        [binary, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMPOSE_TIMEOUT_S,
        check=False,
    )


# ----------------------------------------------------------------------------- services


def test_expected_services_exist(services: dict) -> None:
    missing = EXPECTED_SERVICES - services.keys()
    assert not missing, f"docker-compose.airflow.yml lacks services {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(EXPECTED_SERVICES - ONE_SHOT_SERVICES))
def test_long_running_service_has_healthcheck(services: dict, name: str) -> None:
    check = services[name].get("healthcheck") or {}
    assert not check.get("disable"), f"{name}: healthcheck disabled"
    test = check.get("test")
    assert test and test != ["NONE"], f"{name}: no healthcheck test"


def test_healthchecks_probe_the_documented_endpoints(services: dict) -> None:
    def probe(name: str) -> str:
        test = services[name]["healthcheck"]["test"]
        return " ".join(test) if isinstance(test, list) else str(test)

    assert "pg_isready" in probe("postgres")
    assert "/api/v2/monitor/health" in probe("airflow-apiserver")
    assert "8974/health" in probe("airflow-scheduler") or "SchedulerJob" in probe("airflow-scheduler")
    assert "DagProcessorJob" in probe("airflow-dag-processor")
    assert "TriggererJob" in probe("airflow-triggerer")
    assert "inspect ping" in probe("airflow-worker")
    assert "redis-cli ping" in probe("redis")
    assert "/health" in probe("mlflow")
    assert "/v2/health/live" in probe("triton")
    assert "/-/healthy" in probe("prometheus")
    assert "/api/health" in probe("grafana")


def test_scheduler_health_server_enabled(services: dict) -> None:
    if "8974/health" in " ".join(services["airflow-scheduler"]["healthcheck"]["test"]):
        env = _env(services["airflow-scheduler"])
        assert env.get("AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK", "").lower() == "true"


def test_every_published_port_binds_loopback(services: dict) -> None:
    offenders = [
        f"{name}: {host_ip}:{published}->{target}"
        for name, service in services.items()
        for host_ip, published, target in _published_ports(service)
        if host_ip != LOOPBACK
    ]
    assert not offenders, f"ports must be published on {LOOPBACK} only: {offenders}"


def test_expected_ports_are_published(services: dict) -> None:
    assert {p for _, _, p in _published_ports(services["airflow-apiserver"])} == {"8080"}
    assert {p for _, _, p in _published_ports(services["mlflow"])} == {"5000"}
    assert {p for _, _, p in _published_ports(services["triton"])} == {"8000", "8001", "8002"}
    assert {p for _, _, p in _published_ports(services["prometheus"])} == {"9090"}
    assert {p for _, _, p in _published_ports(services["grafana"])} == {"3000"}
    assert not _published_ports(services["postgres"]), "postgres must stay inside the network"


# ----------------------------------------------------------------------------- Triton


def test_triton_explicit_model_control(services: dict) -> None:
    triton = services["triton"]
    argv = _command(triton)
    assert argv and argv[0] == "tritonserver", f"triton command is {argv}"
    options = _options(argv)
    assert options.get("--model-control-mode") == "explicit"
    assert options.get("--strict-readiness") == "false"
    assert options.get("--http-port", "8000") == "8000"
    assert options.get("--grpc-port", "8001") == "8001"
    assert options.get("--metrics-port", "8002") == "8002"
    # a restarted container comes back serving the recorded state (seqcls_sync converges the rest)
    assert "--load-model=*" in services["triton"]["command"]


def test_triton_model_control_requires_the_key(services: dict) -> None:
    """Both protocols restrict the APIs seqcls's local Triton restricts, to the header it sends."""
    options = _options(_command(services["triton"]))
    prefix = f"{','.join(keys.RESTRICTED_APIS)}:{settings.CONTROL_HEADER}="
    for flag in keys.RESTRICTED_FLAGS:
        value = options.get(flag, "")
        assert value.startswith(prefix), f"triton {flag}={value!r} does not restrict {prefix!r}"
        assert CONTROL_KEY_REF.fullmatch(value[len(prefix) :]), (
            f"{flag}: the key must be ${{SEQCLS_TRITON_CONTROL_KEY:?...}}"
        )
    assert "model-repository" in keys.RESTRICTED_APIS
    assert not {"health", "metadata", "inference"} & set(keys.RESTRICTED_APIS), "clients must stay unauthenticated"
    # the health check still works without the key
    assert "/v2/health/live" in " ".join(services["triton"]["healthcheck"]["test"])


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_gets_the_key_as_the_connection_password_and_the_setting(services: dict, name: str) -> None:
    env = _env(services[name])
    password = json.loads(env["AIRFLOW_CONN_TRITON_DEFAULT"]).get("password", "")
    assert CONTROL_KEY_REF.fullmatch(password), f"{name}: the Triton Connection's password must be the key reference"
    assert env.get(settings.ENV_TRITON_CONTROL_KEY) == password, f"{name}: CLI and DAG must use the same key"


def test_no_literal_key_and_no_default_in_the_file() -> None:
    """The key comes from the environment / .env only: no value, no ``:-default`` a deployment would run with."""
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    references = re.findall(r"\$\{SEQCLS_TRITON_CONTROL_KEY[^}]*\}", text)
    assert len(references) == 4, references  # 2 flags, the Connection's password, the setting
    assert all(CONTROL_KEY_REF.fullmatch(r) for r in references), references
    flags = re.findall(r"triton-control-key=(\$\{[^}]*\}|[^\s\"']+)", text)
    for value in flags + re.findall(r'"password": "([^"]*)"', text):
        ok = CONTROL_KEY_REF.fullmatch(value) or MLFLOW_PASSWORD_REF.fullmatch(value)
        assert ok, f"literal password in the compose file: {value[:4]}…"


def test_mlflow_runs_on_postgres_with_basic_auth(services: dict) -> None:
    """The team registry: MLflow's store and its auth database on the stack's postgres (created by the init
    script the postgres service mounts), basic auth on, one password for the server's admin, the Airflow
    Connection and the CLI — from .env only."""
    mlflow = services["mlflow"]
    options = _options(_command(mlflow))
    env = _env(mlflow)
    assert options["--backend-store-uri"].startswith("postgresql+psycopg2://mlflow:")
    assert "@postgres:5432/" in options["--backend-store-uri"]
    assert env["MLFLOW_AUTH_DATABASE_URI"].startswith("postgresql+psycopg2://mlflow:")
    assert options["--app-name"] == "basic-auth"
    assert MLFLOW_PASSWORD_REF.fullmatch(env["MLFLOW_ADMIN_PASSWORD"])
    assert mlflow["depends_on"]["postgres"]["condition"] == "service_healthy"
    init = _volume_mounts(services["postgres"]).get("/docker-entrypoint-initdb.d", "")
    sql = (ROOT / init.removeprefix("./").split(":")[0]).glob("*.sql")
    created = " ".join(p.read_text(encoding="utf-8") for p in sql)
    for database in ("mlflow", "mlflow_auth"):
        assert f"CREATE DATABASE {database} OWNER mlflow" in created
    for name in AIRFLOW_SERVICES:
        airflow = _env(services[name])
        conn = json.loads(airflow["AIRFLOW_CONN_MLFLOW_DEFAULT"])
        assert conn["login"] == airflow["MLFLOW_TRACKING_USERNAME"] == env["MLFLOW_ADMIN_USERNAME"]
        assert conn["password"] == airflow["MLFLOW_TRACKING_PASSWORD"] == env["MLFLOW_ADMIN_PASSWORD"]


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_triton_repository_is_one_named_volume_shared_with_airflow(compose: dict, services: dict, name: str) -> None:
    repository = _options(_command(services["triton"]))["--model-repository"]
    airflow_env = _env(services[name])
    assert airflow_env.get(settings.ENV_TRITON_REPOSITORY) == repository, (
        f"{name}: {settings.ENV_TRITON_REPOSITORY} must equal Triton's --model-repository {repository}"
    )
    triton_source = _volume_mounts(services["triton"]).get(repository)
    airflow_source = _volume_mounts(services[name]).get(repository)
    named_volumes = set(compose.get("volumes") or {})
    assert triton_source in named_volumes, f"triton: {repository} is not a named volume ({triton_source})"
    assert airflow_source == triton_source, (
        f"{name} mounts {airflow_source!r} at {repository}, Triton mounts {triton_source!r}"
    )


def test_triton_gpu_reservation_and_shm(services: dict) -> None:
    triton = services["triton"]
    devices = triton["deploy"]["resources"]["reservations"]["devices"]
    gpu = [d for d in devices if d.get("driver") == "nvidia" and "gpu" in (d.get("capabilities") or [])]
    assert gpu, f"no nvidia gpu reservation in {devices}"
    count = gpu[0].get("count")
    assert count == "all" or (isinstance(count, int) and count >= 1) or gpu[0].get("device_ids"), gpu[0]
    shm = str(triton.get("shm_size", ""))
    match = re.fullmatch(r"(\d+)\s*([kmg]?)b?", shm.lower())
    assert match, f"triton shm_size {shm!r} not set"
    size = int(match.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[match.group(2)]
    assert size >= 256 * 2**20, f"shm_size {shm} too small for the python backend"


# ----------------------------------------------------------------------------- Airflow env


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_environment(services: dict, name: str) -> None:
    env = _env(services[name])
    assert env.get("AIRFLOW__CORE__EXECUTOR") == "CeleryExecutor"
    assert env.get("AIRFLOW__CORE__LOAD_EXAMPLES", "").lower() == "false"
    assert 1 <= int(env.get("AIRFLOW__CORE__PARALLELISM", "32")) <= 8, "keep parallelism small"
    assert "@postgres" in env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
    assert env.get(settings.ENV_RUNTIME) == "onnxruntime"
    assert env.get(settings.ENV_RUNTIME) in settings.RUNTIMES
    assert env.get(settings.ENV_DEVICE) == "gpu"
    assert env.get(settings.ENV_DEVICE) in settings.DEVICES
    metrics_host, _, metrics_port = env.get(settings.ENV_TRITON_METRICS, "").rpartition(":")
    assert metrics_host == "triton" and int(metrics_port) in _container_ports(services["triton"])
    # every component must agree on the JWT secret, or tasks cannot talk to the execution API
    assert "AIRFLOW__API_AUTH__JWT_SECRET" in env or "AIRFLOW__API_AUTH__JWT_SECRET_CMD" in env
    execution_api = urlsplit(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert execution_api.hostname == "airflow-apiserver"
    assert execution_api.port in _container_ports(services["airflow-apiserver"])


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_state_volumes(compose: dict, services: dict, name: str) -> None:
    env = _env(services[name])
    mounts = _volume_mounts(services[name])
    named = set(compose.get("volumes") or {})
    for var in (settings.ENV_HOME, settings.ENV_CHECKPOINTS_ROOT):
        path = env.get(var)
        assert path, f"{name}: {var} not set"
        assert mounts.get(path) in named, f"{name}: {var}={path} is not a named-volume mount"
    assert mounts.get(env[settings.ENV_HOME]) != mounts.get(env[settings.ENV_TRITON_REPOSITORY])


def test_connections_point_at_compose_services(services: dict) -> None:
    for name in AIRFLOW_SERVICES:
        env = _env(services[name])
        triton = json.loads(env["AIRFLOW_CONN_TRITON_DEFAULT"])
        mlflow = json.loads(env["AIRFLOW_CONN_MLFLOW_DEFAULT"])

        assert triton["host"] in services and int(triton["port"]) in _container_ports(services["triton"])
        extra = triton["extra"]
        assert extra["repository"] == env[settings.ENV_TRITON_REPOSITORY]
        grpc = [_host_port(e) for e in extra["grpc_endpoints"].split(",")]
        http = [_host_port(e) for e in extra["http_endpoints"].split(",")]
        assert len(grpc) == len(http), "one gRPC and one HTTP endpoint per Triton replica"
        for host, port in grpc + http:
            assert host in services, f"{host} is not a compose service"
            assert port in _container_ports(services[host]), f"{host} does not expose {port}"
        assert extra["grpc_endpoints"] == env[settings.ENV_TRITON_GRPC]
        assert extra["http_endpoints"] == env[settings.ENV_TRITON_HTTP]

        assert mlflow["host"] in services and int(mlflow["port"]) in _container_ports(services["mlflow"])
        uri = urlsplit(mlflow["extra"]["tracking_uri"])
        assert uri.scheme == mlflow.get("schema", "http")
        assert (uri.hostname, uri.port) == (mlflow["host"], int(mlflow["port"]))
        assert mlflow["extra"]["tracking_uri"] == env[settings.ENV_MLFLOW_URI]


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_connections_are_of_the_providers_types(services: dict, name: str) -> None:
    """The UI shows their forms (and Test); every extra is one of the form's fields."""
    from seqcls.airflow.provider import CONNECTION_TYPES

    types = {t["connection-type"]: t for t in CONNECTION_TYPES}
    env = _env(services[name])
    for var, conn_type in (("AIRFLOW_CONN_TRITON_DEFAULT", "triton"), ("AIRFLOW_CONN_MLFLOW_DEFAULT", "mlflow")):
        conn = json.loads(env[var])
        assert conn["conn_type"] == conn_type, f"{name}: {var} is {conn['conn_type']!r}, not the provider's type"
        unknown = set(conn.get("extra") or {}) - set(types[conn_type]["conn-fields"])
        assert not unknown, f"{name}: {var} extras {sorted(unknown)} are not fields of the {conn_type} form"


def test_mlflow_server_serves_artifacts_inside_the_network(services: dict) -> None:
    mlflow = services["mlflow"]
    options = _options(_command(mlflow))
    assert options.get("--host") == "0.0.0.0"
    assert options.get("--port", "5000") == "5000"
    artifacts = options.get("--artifacts-destination", "")
    mounts = _volume_mounts(mlflow)
    assert any(artifacts.startswith(target.rstrip("/") + "/") for target in mounts), (
        f"--artifacts-destination {artifacts} is not on a volume"
    )
    allowed = options.get("--allowed-hosts")
    if allowed is not None:  # host-header check: the name the Airflow containers use must pass
        assert "mlflow:5000" in allowed.split(",")


def test_seqcls_env_vars_are_settings_names() -> None:
    used = set(re.findall(r"\bSEQCLS_[A-Z0-9_]+", COMPOSE_FILE.read_text(encoding="utf-8")))
    known = _settings_env_names()
    assert used, "compose file sets no SEQCLS_* variable"
    unknown = used - known
    assert not unknown, f"SEQCLS_* names not defined in seqcls.settings: {sorted(unknown)}"


# ----------------------------------------------------------------------------- Prometheus


def test_prometheus_scrapes_tritons_metrics_port(services: dict) -> None:
    prometheus = services["prometheus"]
    assert re.fullmatch(r"prom/prometheus:v\d+\.\d+\.\d+", prometheus["image"]), "pin a Prometheus release"
    options = _options(_command(prometheus))
    config_path = options.get("--config.file", "/etc/prometheus/prometheus.yml")
    mounts = {entry.split(":")[1]: entry for entry in prometheus["volumes"] if isinstance(entry, str)}
    entry = mounts.get(config_path, "")
    assert entry.endswith(":ro"), f"prometheus: {config_path} must be mounted read-only, got {entry!r}"
    assert (ROOT / entry.split(":")[0]).resolve() == PROMETHEUS_CONFIG.resolve()
    data = _volume_mounts(prometheus).get(options.get("--storage.tsdb.path", "/prometheus"))
    assert data in (yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8")).get("volumes") or {}), data

    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    triton = jobs["triton"]
    assert triton.get("metrics_path", "/metrics") == "/metrics" and triton.get("scheme", "http") == "http"
    targets = [t for group in triton["static_configs"] for t in group["targets"]]
    metrics_port = int(_options(_command(services["triton"]))["--metrics-port"])
    assert targets == [f"triton:{metrics_port}"], targets
    for target in targets:
        host, port = _host_port(target)
        assert host in services and port in _container_ports(services[host]), f"{target} is not a compose service port"
    for key in ("scrape_interval", "scrape_timeout"):
        assert re.fullmatch(r"\d+[smh]", config["global"][key]), f"{key}: {config['global'][key]!r}"
    assert "depends_on" not in prometheus, "a Triton that is down (no GPU) is a target down, not a blocked stack"


# ----------------------------------------------------------------------------- dependencies


def test_depends_on_targets_and_conditions(services: dict) -> None:
    allowed = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        if isinstance(depends, list):
            depends = {d: {"condition": "service_started"} for d in depends}
        assert name not in depends, f"{name} depends on itself"
        for target, spec in depends.items():
            assert target in services, f"{name} depends on unknown service {target}"
            condition = (spec or {}).get("condition", "service_started")
            assert condition in allowed, f"{name} -> {target}: condition {condition}"
            if condition == "service_healthy":
                assert services[target].get("healthcheck"), f"{name} waits for {target}'s health"


def test_airflow_startup_chain(services: dict) -> None:
    init = services["airflow-init"]["depends_on"]
    assert init["postgres"]["condition"] == "service_healthy"
    init_argv = " ".join(_command(services["airflow-init"]))
    assert "db migrate" in init_argv
    for name in AIRFLOW_LONG_RUNNING:
        depends = services[name]["depends_on"]
        assert depends["airflow-init"]["condition"] == "service_completed_successfully", name
        assert depends["postgres"]["condition"] == "service_healthy", name
        assert depends["redis"]["condition"] == "service_healthy", name
    for runner in ("airflow-scheduler", "airflow-worker"):  # the worker runs the tasks; LocalExecutor: the scheduler
        depends = services[runner]["depends_on"]
        for target in ("airflow-apiserver", "mlflow", "triton"):
            assert depends[target]["condition"] == "service_healthy", (runner, target)


def test_celery_executor_on_redis_with_two_workers(services: dict) -> None:
    """The official compose's convention: CeleryExecutor, a Redis broker, the result backend on the
    metadata database, and at least two workers so one run's tasks can land on different workers."""
    env = _env(services["airflow-scheduler"])
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    broker = urlsplit(env["AIRFLOW__CELERY__BROKER_URL"])
    assert (broker.scheme, broker.hostname, broker.port) == ("redis", "redis", 6379)
    backend = urlsplit(env["AIRFLOW__CELERY__RESULT_BACKEND"])
    database = urlsplit(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert backend.scheme == "db+postgresql+psycopg2" and backend.hostname == database.hostname == "postgres"
    assert backend.path == database.path
    worker = services["airflow-worker"]
    assert _command(worker) == ["celery", "worker"]
    assert worker["deploy"]["replicas"] >= 2
    assert _env(worker)["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"  # the common environment, merged
    assert int(_env(worker)["AIRFLOW__CELERY__WORKER_CONCURRENCY"]) >= 1


# ----------------------------------------------------------------------------- images


def test_build_contexts_and_dockerfiles_exist(services: dict) -> None:
    built = 0
    for name, service in services.items():
        build = service.get("build")
        if build is None:
            continue
        if isinstance(build, str):
            build = {"context": build}
        context = (ROOT / build.get("context", ".")).resolve()
        assert context.is_dir(), f"{name}: build context {context} missing"
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        assert ROOT in (context, *context.parents), f"{name}: context outside the repository"
        built += 1
    assert built >= 2


def _dockerfile(services: dict, name: str) -> tuple[Path, str]:
    build = services[name]["build"]
    context = (ROOT / build["context"]).resolve()
    path = context / build.get("dockerfile", "Dockerfile")
    return context, path.read_text(encoding="utf-8")


def _copied_sources(text: str) -> list[str]:
    """Build-context sources of COPY/ADD (not ``COPY --from=<stage>``: those come from another stage)."""
    sources = []
    for line in text.splitlines():
        words = line.split()
        if words and words[0].upper() in {"COPY", "ADD"} and not any(w.startswith("--from=") for w in words):
            args = [w for w in words[1:] if not w.startswith("--")]
            sources.extend(args[:-1])
    return sources


def _stages(text: str) -> list[str]:
    """The Dockerfile's stages, each from its FROM line (continuation lines joined)."""
    text = text.replace("\\\n", " ")
    return ["FROM" + part for part in re.split(r"^FROM", text, flags=re.M)[1:]]


def test_airflow_dockerfile_installs_the_project(services: dict) -> None:
    """A wheel built from the repository, installed --no-deps over the pins: no editable install,
    nothing in the plugins folder, and the build fails unless Airflow sees the provider and the plugin."""
    context, text = _dockerfile(services, "airflow-scheduler")
    airflow_pin = _pins(REQUIREMENTS)["apache-airflow"]
    wheel, image = _stages(text)
    for stage in (wheel, image):
        assert re.match(rf"FROM apache/airflow:{re.escape(airflow_pin)}-python3\.11\b", stage), (
            f"airflow.Dockerfile must build FROM apache/airflow:{airflow_pin}-python3.11 (requirements.txt pin)"
        )
    stage_name = re.match(r"FROM \S+ AS (\S+)", wheel).group(1)
    for needed in ("pyproject.toml", "README.md", "plugins/", "model_repository/common/"):
        assert needed in _copied_sources(wheel), f"the wheel stage does not copy {needed}"
    assert re.search(r"pip wheel[^\n]*--no-deps[^\n]*\s\.\s*$", wheel, re.M), "the wheel stage builds no wheel of ."

    assert "requirements.txt" in _copied_sources(image)
    assert re.search(r"pip install[^\n]*-r\s+\S*requirements", image), "requirements.txt not pip-installed"
    assert re.search(rf"COPY --from={stage_name}\b", image), "the image does not take the built wheel"
    assert re.search(r"pip install[^\n]*--no-deps[^\n]*seqcls-\*\.whl", image), "the wheel is not installed --no-deps"
    assert not re.search(r"pip install[^\n]*\s-e\s", text), "an editable install imports from the source tree"
    assert "plugins/" not in _copied_sources(image), "the image's plugins folder must stay empty"
    assert re.search(r"airflow providers get seqcls", image) and re.search(r"airflow plugins[^\n]*seqcls", image)
    for source in _copied_sources(text):
        if any(ch in source for ch in "*?["):
            continue
        assert (context / source).exists(), f"airflow.Dockerfile copies missing {source}"
    # the model repository template: where the image copies it is where the settings look
    env = dict(re.findall(r"(SEQCLS_\w+|AIRFLOW__CORE__\w+)=(\S+)", image))
    workdir = re.findall(r"^WORKDIR (\S+)", image.split("model_repository/")[0], re.M)[-1]
    assert re.search(r"^COPY [^\n]*model_repository/ \./model_repository/", image, re.M)
    assert env[settings.ENV_MODEL_REPOSITORY_SOURCE] == f"{workdir}/model_repository"
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == "/opt/seqcls/plugins" and "/opt/seqcls/plugins" in image
    for name in AIRFLOW_SERVICES:
        assert services[name]["build"] == services["airflow-scheduler"]["build"], name


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_runs_the_installed_package_not_the_source_tree(services: dict, name: str) -> None:
    env = _env(services[name])
    mounts = _volume_mounts(services[name])
    plugins_folder = env["AIRFLOW__CORE__PLUGINS_FOLDER"]
    host_sources = {target: src for target, src in mounts.items() if src.startswith((".", "/"))}
    assert plugins_folder not in host_sources, f"{name}: {host_sources.get(plugins_folder)} over the plugins folder"
    assert not any(Path(src).parts[-1:] == ("plugins",) for src in host_sources.values()), f"{name}: {host_sources}"
    assert set(host_sources.values()) == {"./dags", "./model_repository"}, host_sources
    source = env.get(settings.ENV_MODEL_REPOSITORY_SOURCE)
    assert mounts.get(source) == "./model_repository", f"{name}: {settings.ENV_MODEL_REPOSITORY_SOURCE}={source}"


def test_triton_dockerfile_installs_requirements_triton(services: dict) -> None:
    context, text = _dockerfile(services, "triton")
    assert re.search(r"^FROM nvcr\.io/nvidia/tritonserver:24\.10-py3\s*$", text, re.M)
    assert "requirements-triton.txt" in _copied_sources(text)
    assert (context / "requirements-triton.txt").resolve() == TRITON_REQUIREMENTS.resolve()
    assert re.search(r"pip install[^\n]*-r\s+\S*requirements-triton\.txt", text)


def test_triton_requirements_agree_with_requirements_txt() -> None:
    main, triton = _pins(REQUIREMENTS), _pins(TRITON_REQUIREMENTS)
    for package in ("tokenizers", "numpy"):
        assert package in triton, f"requirements-triton.txt must pin {package}"
    disagree = {p: (v, main[p]) for p, v in triton.items() if p in main and main[p] != v}
    assert not disagree, f"requirements-triton.txt vs requirements.txt: {disagree}"


def test_gpu_requirements_keep_the_cpu_pins() -> None:
    main, gpu = _pins(REQUIREMENTS), _pins(ROOT / "requirements-gpu.txt")
    swapped = {"paddlepaddle": "paddlepaddle-gpu", "onnxruntime": "onnxruntime-gpu"}
    assert gpu.get("paddlepaddle-gpu") == main["paddlepaddle"]
    assert "paddlepaddle" not in gpu and "onnxruntime" not in gpu, "CPU and GPU builds clash"
    assert gpu.get("onnxruntime-gpu"), "requirements-gpu.txt must pin onnxruntime-gpu"
    differ = {p: (v, gpu.get(p)) for p, v in main.items() if p not in swapped and gpu.get(p) != v}
    assert not differ, f"requirements-gpu.txt drifted from requirements.txt: {differ}"


# ----------------------------------------------------------------------------- docker-compose


def test_docker_compose_config_accepts_the_file() -> None:
    result = _docker_compose("-f", COMPOSE_FILE.name, "config")
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    resolved = yaml.safe_load(result.stdout)
    assert set(resolved["services"]) >= EXPECTED_SERVICES
    assert resolved["services"]["triton"]["deploy"]["resources"]["reservations"]["devices"]
    # one key, interpolated into Triton's flags, the Connection's password and the setting
    options = _options(_command(resolved["services"]["triton"]))
    for flag in keys.RESTRICTED_FLAGS:
        assert options[flag].endswith(f":{settings.CONTROL_HEADER}={TEST_KEY}")
    for name in AIRFLOW_SERVICES:
        env = _env(resolved["services"][name])
        assert json.loads(env["AIRFLOW_CONN_TRITON_DEFAULT"])["password"] == TEST_KEY
        assert env[settings.ENV_TRITON_CONTROL_KEY] == TEST_KEY


def test_docker_compose_refuses_the_file_without_the_key(tmp_path: Path) -> None:
    """Default-deny: no SEQCLS_TRITON_CONTROL_KEY (environment or .env) → nothing starts, and the error says why."""
    empty = tmp_path / "empty.env"
    empty.write_text("", encoding="utf-8")
    result = _docker_compose("-f", COMPOSE_FILE.name, "--env-file", str(empty), "config", "--quiet", key=None)
    assert result.returncode != 0, "docker-compose accepted the file without SEQCLS_TRITON_CONTROL_KEY"
    assert "set SEQCLS_TRITON_CONTROL_KEY in .env" in result.stderr, result.stderr[-2000:]
    assert _docker_compose("-f", COMPOSE_FILE.name, "--env-file", str(empty), "config", "--quiet").returncode == 0


def test_docker_compose_config_rejects_a_broken_file(tmp_path: Path) -> None:
    data = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    good, bad = tmp_path / "good.yml", tmp_path / "bad.yml"
    good.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    data["services"]["mlflow"]["ports"] = {"5000": "5000"}  # must be a list
    bad.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    project = ("--project-directory", str(ROOT))

    control = _docker_compose("-f", str(good), *project, "config", "--quiet", cwd=tmp_path)
    assert control.returncode == 0, f"the unbroken copy should pass:\n{control.stderr}"
    broken = _docker_compose("-f", str(bad), *project, "config", "--quiet", cwd=tmp_path)
    assert broken.returncode != 0, "docker-compose accepted `ports` as a mapping"
    assert "ports" in broken.stderr, broken.stderr
