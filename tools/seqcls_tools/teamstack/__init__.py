"""The team stack run for real on this machine: the services of ``docker-compose.airflow.yml`` as local
processes on loopback (containers cannot run here) — PostgreSQL and the MLflow server
(:mod:`.registry`), Redis and Airflow on the CeleryExecutor with its workers (:mod:`.airflow_stack`),
Prometheus with the project's rules (:mod:`.monitoring`)."""

from seqcls_tools.teamstack.airflow_stack import (
    COMPOSE_AIRFLOW_KEYS,
    EXECUTORS,
    STAND_INS,
    ComposeAirflow,
    Redis,
    TeamStack,
    compose_airflow_env,
    compose_seqcls_env,
    compose_worker_replicas,
    localize,
)
from seqcls_tools.teamstack.monitoring import Prometheus, local_prometheus_argv, local_prometheus_config
from seqcls_tools.teamstack.registry import (
    COMPOSE_FILE,
    ROOT,
    MlflowServer,
    Postgres,
    compose_service,
    local_database_url,
    pg_bindir,
)

__all__ = [
    "COMPOSE_AIRFLOW_KEYS",
    "COMPOSE_FILE",
    "EXECUTORS",
    "ROOT",
    "STAND_INS",
    "ComposeAirflow",
    "MlflowServer",
    "Postgres",
    "Prometheus",
    "Redis",
    "TeamStack",
    "compose_airflow_env",
    "compose_seqcls_env",
    "compose_service",
    "compose_worker_replicas",
    "local_database_url",
    "local_prometheus_argv",
    "local_prometheus_config",
    "localize",
    "pg_bindir",
]
