"""The team stack's rehearsal reads the compose file itself: what it maps, and that drift is an error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from seqcls_tools.teamstack import (
    COMPOSE_FILE,
    STAND_INS,
    compose_airflow_env,
    compose_seqcls_env,
    compose_worker_replicas,
    localize,
)

HOSTS = {"postgres:5432": "127.0.0.1:15432", "redis:6379": "127.0.0.1:16379", "mlflow:5000": "127.0.0.1:15000"}


def _copy(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    edit(data)
    out = tmp_path / "docker-compose.airflow.yml"
    out.write_text(yaml.safe_dump(data), encoding="utf-8")
    return out


def test_localize_maps_service_hosts_only() -> None:
    assert localize("db+postgresql+psycopg2://airflow:airflow@postgres:5432/airflow", HOSTS) == (
        "db+postgresql+psycopg2://airflow:airflow@127.0.0.1:15432/airflow"
    )
    assert localize("redis://redis:6379/0", HOSTS) == "redis://127.0.0.1:16379/0"
    assert localize("http://mlflow-other:5000", HOSTS) == "http://mlflow-other:5000"


def test_the_compose_files_executor_settings_with_local_hosts() -> None:
    env = compose_airflow_env(HOSTS)
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CELERY__BROKER_URL"] == "redis://127.0.0.1:16379/0"
    assert "@127.0.0.1:15432/airflow" in env["AIRFLOW__CELERY__RESULT_BACKEND"]
    assert "@127.0.0.1:15432/airflow" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert not any("postgres:" in v or "redis:6379" in v for v in env.values()), env
    assert env["AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL"] == "1"  # a worker is free 1 s after its task, not 5
    assert compose_worker_replicas() >= 2


def test_a_compose_file_on_another_executor_is_refused(tmp_path: Path) -> None:
    def local(data: dict) -> None:
        data["services"]["airflow-worker"]["environment"]["AIRFLOW__CORE__EXECUTOR"] = "LocalExecutor"

    with pytest.raises(ValueError, match="LocalExecutor"):
        compose_airflow_env(HOSTS, _copy(tmp_path, local))


LOCAL = {
    "SEQCLS_HOME": "/h",
    "SEQCLS_CHECKPOINTS_ROOT": "/c",
    "SEQCLS_TRITON_REPOSITORY": "/m",
    "SEQCLS_TRITON_GRPC": "127.0.0.1:1",
    "SEQCLS_TRITON_HTTP": "127.0.0.1:2",
    "SEQCLS_TRITON_METRICS": "127.0.0.1:3",
    "SEQCLS_MLFLOW_TRACKING_URI": "http://127.0.0.1:4",
    "MLFLOW_TRACKING_USERNAME": "u",
    "MLFLOW_TRACKING_PASSWORD": "p",
}


def test_every_seqcls_variable_of_the_compose_file_is_mapped_or_stood_in_for() -> None:
    local = LOCAL
    env = compose_seqcls_env(local)
    assert env["SEQCLS_TRITON_REPOSITORY"] == "/m" and env["SEQCLS_RUNTIME"] == "python-onnxruntime"
    assert "SEQCLS_TRITON_CONTROL_KEY" not in env  # the local Triton's key file stands in
    assert set(STAND_INS) | set(local) >= set(env)


def test_a_new_compose_variable_the_rehearsal_cannot_map_is_an_error(tmp_path: Path) -> None:
    def new_var(data: dict) -> None:
        data["services"]["airflow-worker"]["environment"]["SEQCLS_SOMETHING_NEW"] = "x"

    with pytest.raises(ValueError, match="SEQCLS_SOMETHING_NEW"):
        compose_seqcls_env(LOCAL, _copy(tmp_path, new_var))


# ----------------------------------------------------------------------------- Prometheus


def test_prometheus_is_the_compose_configuration_with_one_target_per_local_triton(tmp_path: Path) -> None:
    import shutil
    import subprocess

    from seqcls_tools.teamstack import local_prometheus_argv, local_prometheus_config
    from seqcls_tools.teamstack.monitoring import PROMETHEUS_CONFIG

    targets = ["127.0.0.1:18002", "127.0.0.1:18012", "127.0.0.1:18022"]
    data = local_prometheus_config(targets)
    compose = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    assert data["global"] == compose["global"]  # the compose file's intervals, not the rehearsal's
    (job,) = data["scrape_configs"]
    assert job["job_name"] == "triton" and job["static_configs"][0]["targets"] == targets
    assert job["static_configs"][0]["labels"] == compose["scrape_configs"][0]["static_configs"][0]["labels"]
    (rules,) = data["rule_files"]
    assert Path(rules).is_absolute() and Path(rules).is_file() and rules.endswith("seqcls.rules.yml")
    argv = local_prometheus_argv("prometheus", tmp_path / "p.yml", tmp_path / "data", 19090)
    assert argv[1:] == [
        f"--config.file={tmp_path / 'p.yml'}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        "--storage.tsdb.retention.time=15d",
        "--web.listen-address=127.0.0.1:19090",
    ]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not on PATH (scripts/system-deps.sh installs Debian's prometheus)")
    config = tmp_path / "p.yml"
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    checked = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_prometheus_target_the_rehearsal_cannot_map_is_an_error(tmp_path: Path) -> None:
    from seqcls_tools.teamstack import local_prometheus_config
    from seqcls_tools.teamstack.monitoring import PROMETHEUS_CONFIG

    data = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    data["scrape_configs"][0]["static_configs"][0]["targets"] = ["triton-b:8002"]
    edited = tmp_path / "prometheus.yml"
    edited.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ValueError, match=r"scrapes \['triton-b:8002'\], which the local team stack does not map"):
        local_prometheus_config(["127.0.0.1:1"], edited)


def test_make_stack_runs_the_compose_files_celery_stack_unless_told_the_local_variant() -> None:
    from seqcls.cli import build_parser

    default = build_parser().parse_args(["team-stack"])
    assert (default.executor, default.tritons, default.no_prometheus) == ("celery", 3, False)
    assert build_parser().parse_args(["team-stack", "--executor", "local"]).executor == "local"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["team-stack", "--executor", "kubernetes"])


def test_the_local_executor_variant_has_no_worker_no_broker_settings(tmp_path: Path) -> None:
    from seqcls_tools.teamstack import ComposeAirflow, MlflowServer, Postgres, Redis
    from seqcls_tools.teamstack.airflow_stack import EXECUTORS

    class _NoInit(Postgres):
        def run_init_scripts(self, compose_file: Path = COMPOSE_FILE) -> None:
            pass

    from seqcls.settings import Settings

    pg = _NoInit(port=15432)
    settings = Settings(home=tmp_path / "home", triton_repository=tmp_path / "repo")
    kw = {
        "postgres": pg,
        "redis": Redis(tmp_path / "redis", port=16379),
        "mlflow": MlflowServer(pg, tmp_path / "mlflow"),
    }
    local = ComposeAirflow(tmp_path / "airflow", settings, executor="local", **kw)
    assert (local.executor, local.workers, local.stack.extra_commands) == ("LocalExecutor", 0, {})
    assert local.compose_env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert not [k for k in local.compose_env if k.startswith("AIRFLOW__CELERY__")]
    assert local.compose_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].endswith("@127.0.0.1:15432/airflow")
    celery = ComposeAirflow(tmp_path / "airflow", settings, **kw)
    assert (celery.executor, celery.workers) == ("CeleryExecutor", 2) and set(celery.stack.extra_commands) == {
        "worker-1",
        "worker-2",
    }
    assert EXECUTORS == ("celery", "local")
    with pytest.raises(ValueError, match="executor='kubernetes'"):
        ComposeAirflow(tmp_path / "airflow", settings, executor="kubernetes", **kw)
