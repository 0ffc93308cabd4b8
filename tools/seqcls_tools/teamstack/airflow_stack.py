"""The rest of the compose file's stack as local processes: Redis, Airflow on the CeleryExecutor with its
workers, and :class:`TeamStack`, which starts everything (see :mod:`seqcls_tools.teamstack`).

Why from the compose file: the executor, the broker, the result backend, the metadata database and
every ``SEQCLS_*`` variable are read from ``docker-compose.airflow.yml`` with hosts mapped to local
ports, so the rehearsal and the compose file cannot drift apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from seqcls.localtriton import free_port
from seqcls_tools.teamstack.monitoring import Prometheus
from seqcls_tools.teamstack.registry import COMPOSE_FILE, MlflowServer, Postgres, compose_service

log = logging.getLogger(__name__)


@dataclass
class Redis:
    """Debian's ``redis-server`` on 127.0.0.1, nothing persisted: the compose file's Celery broker."""

    root: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30) -> Redis:
        binary = shutil.which("redis-server")
        if not binary:
            raise FileNotFoundError(
                "redis-server was not found (Debian: apt-get install redis-server; `make system-deps`)"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        argv = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"]
        argv += ["--dir", str(self.root), "--protected-mode", "yes"]
        out = open(self.root / "redis.log", "ab")  # noqa: SIM115 (the server owns it)
        self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        import redis

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2).ping():
                    log.info("Redis on 127.0.0.1:%d", self.port)
                    return self
            except redis.RedisError:
                time.sleep(0.2)
            if self.proc.poll() is not None:
                raise RuntimeError((self.root / "redis.log").read_text(errors="replace")[-2000:])
        raise TimeoutError(f"redis-server did not answer PING on 127.0.0.1:{self.port} in {timeout:.0f}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None


#: What the rehearsal takes from the compose file's Airflow environment (``x-airflow-common``), hosts mapped:
#: the executor and everything Celery, the metadata database, the task supervisors' wake-up. Paths, secrets
#: (``*_CMD`` files of the airflow-init volume) and the API URL are the local stack's own.
COMPOSE_AIRFLOW_KEYS = (
    "AIRFLOW__CORE__EXECUTOR",
    "AIRFLOW__CORE__PARALLELISM",
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION",
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
)
COMPOSE_AIRFLOW_PREFIXES = ("AIRFLOW__CELERY__",)


def localize(value: str, hosts: dict[str, str]) -> str:
    """``value`` with each compose ``service:port`` (after ``//`` or ``@``) replaced by its local address."""
    for service, local in hosts.items():
        for lead in ("//", "@"):
            value = value.replace(f"{lead}{service}/", f"{lead}{local}/").replace(f"{lead}{service}", f"{lead}{local}")
    return value


def compose_airflow_env(
    hosts: dict[str, str], compose_file: Path = COMPOSE_FILE, service: str = "airflow-worker"
) -> dict[str, str]:
    """The compose file's Airflow settings of :data:`COMPOSE_AIRFLOW_KEYS` / ``_PREFIXES`` for ``service``, with
    the container hosts mapped through ``hosts`` (``{"postgres:5432": "127.0.0.1:54321", ...}``)."""
    env = compose_service(service, compose_file).get("environment") or {}
    out = {}
    for key, value in env.items():
        key, value = str(key), str(value)
        if key in COMPOSE_AIRFLOW_KEYS or key.startswith(COMPOSE_AIRFLOW_PREFIXES):
            out[key] = localize(value, hosts)
    if out.get("AIRFLOW__CORE__EXECUTOR") != "CeleryExecutor":
        raise ValueError(
            f"{compose_file}: {service} runs {out.get('AIRFLOW__CORE__EXECUTOR')!r}, expected CeleryExecutor"
        )
    return out


def compose_worker_replicas(compose_file: Path = COMPOSE_FILE) -> int:
    """``services.airflow-worker.deploy.replicas`` (1 when unset, as compose does)."""
    return int((compose_service("airflow-worker", compose_file).get("deploy") or {}).get("replicas", 1))


#: ``executor``: the compose file's CeleryExecutor, or its documented LocalExecutor variant
#: (``AIRFLOW__CORE__EXECUTOR=LocalExecutor``, ``--scale airflow-worker=0``: the scheduler runs the tasks).
EXECUTORS = ("celery", "local")


class ComposeAirflow:
    """The compose file's Airflow on this machine: api-server, scheduler, dag-processor, triggerer and its
    Celery workers (as many as ``deploy.replicas``), each worker in a working directory of its own, on the
    local PostgreSQL and Redis, with the compose file's executor settings (:func:`compose_airflow_env`).
    ``executor="local"``: the compose file's documented LocalExecutor variant — no worker, no broker.

    The release tasks of one run land on whichever worker takes them, as on a deployment; what they
    share is what the compose volumes stand for: ``SEQCLS_HOME``, the Triton repository, the checkpoints
    root, the task-log folder. The Connections point at the local MLflow server (login + password) and
    Triton."""

    def __init__(
        self,
        root: Path,
        settings,
        *,
        postgres: Postgres,
        redis: Redis,
        mlflow: MlflowServer,
        port: int | None = None,
        password: str | None = None,
        models_file: Path | None = None,
        compose_file: Path = COMPOSE_FILE,
        executor: str = "celery",
    ) -> None:
        from seqcls_tools.demo.stack import AirflowStack

        if executor not in EXECUTORS:
            raise ValueError(f"executor={executor!r}: expected one of {', '.join(EXECUTORS)}")

        self.root = Path(root)
        self.stack = AirflowStack(self.root, settings, port=port or free_port(), password=password)
        hosts = {
            "postgres:5432": f"127.0.0.1:{postgres.port}",
            "redis:6379": f"127.0.0.1:{redis.port}",
            "mlflow:5000": f"127.0.0.1:{mlflow.port}",
        }
        self.compose_env = compose_airflow_env(hosts, compose_file)
        self.workers = compose_worker_replicas(compose_file)
        self.executor = self.compose_env["AIRFLOW__CORE__EXECUTOR"]
        if executor == "local":  # the documented variant: the common environment's executor, the workers scaled to 0
            self.executor, self.workers = "LocalExecutor", 0
            self.compose_env = {k: v for k, v in self.compose_env.items() if not k.startswith("AIRFLOW__CELERY__")}
            self.compose_env["AIRFLOW__CORE__EXECUTOR"] = self.executor
        env = self.stack.env
        env.update(self.compose_env)
        env.update(mlflow.client_env())  # the compose file's MLFLOW_TRACKING_* for the CLI in the containers
        env["SEQCLS_MODELS_FILE"] = str(models_file) if models_file else "none"
        mlflow_conn = self.stack.connections["mlflow_default"]
        mlflow_conn.update({"login": mlflow.username, "password": mlflow.password})
        mlflow_conn["description"] = "The team stack's MLflow server (basic auth), rewritten on every start"
        postgres.run_init_scripts(compose_file)  # Airflow's role and database, as the image makes them
        airflow = str(Path(sys.executable).parent / "airflow")
        self.stack.extra_commands = {
            f"worker-{i}": [airflow, "celery", "worker", "--skip-serve-logs", "--celery-hostname", f"worker-{i}@%h"]
            for i in range(1, self.workers + 1)
        }
        for i in range(1, self.workers + 1):
            cwd = self.root / "workers" / f"worker-{i}"
            cwd.mkdir(parents=True, exist_ok=True)
            self.stack.cwd[f"worker-{i}"] = cwd

    @property
    def url(self) -> str:
        return self.stack.url

    def start(self, timeout: float = 240) -> ComposeAirflow:
        t0 = time.perf_counter()
        self.stack.start(timeout=timeout)
        log.info(
            "Airflow (%s, %d workers, metadata on PostgreSQL) at %s after %.0fs",
            self.executor,
            self.workers,
            self.url,
            time.perf_counter() - t0,
        )
        return self

    def worker_log(self, index: int) -> Path:
        return self.stack.logs / f"worker-{index}.log"

    def restart(self, name: str, extra_env: dict[str, str] | None = None) -> None:
        """Start component ``name`` again (after :meth:`kill` or :meth:`stop_one`): same command, environment
        (plus ``extra_env``, e.g. a drill's fault plan) and working directory."""
        self.stack.spawn(name, extra_env)

    def stop_one(self, name: str, timeout: float = 120) -> None:
        """SIGTERM to one component (a Celery worker's warm shutdown: it finishes its task, takes no more)."""
        proc = self.stack.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(name)

    def kill(self, name: str) -> None:
        """kill -9 one component's process group (``worker-1``, ``scheduler``, ...)."""
        proc = self.stack.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        self.stack.stop()


#: The compose file's ``SEQCLS_*`` settings the local rehearsal replaces instead of mapping, and why.
STAND_INS = {
    "SEQCLS_RUNTIME": ("python-onnxruntime", "the NGC image's native ORT backend: the python backend here"),
    "SEQCLS_DEVICE": ("cpu", "no GPU here"),
    "SEQCLS_TRITON_CONTROL_KEY": (None, "the local Triton's key file in the repository (read by every seqcls process)"),
    "SEQCLS_MODEL_REPOSITORY_SOURCE": (None, "the source tree's model_repository/ (no image)"),
}


def compose_seqcls_env(
    local: dict[str, str], compose_file: Path = COMPOSE_FILE, service: str = "airflow-worker"
) -> dict[str, str]:
    """The compose file's ``SEQCLS_*`` and ``MLFLOW_TRACKING_*`` variables of ``service`` with their local values:
    ``local`` (what :meth:`TeamStack.cli_env` says) or a :data:`STAND_INS` value. A variable the compose
    file sets and the rehearsal cannot map is an error: the two must not drift apart."""
    env = compose_service(service, compose_file).get("environment") or {}
    out: dict[str, str] = {}
    for key in map(str, env):
        if not key.startswith(("SEQCLS_", "MLFLOW_TRACKING_")):
            continue
        if key in STAND_INS:
            value = STAND_INS[key][0]
        elif key in local:
            value = local[key]
        else:
            raise ValueError(f"{compose_file}: {service} sets {key}, which the local team stack does not map")
        if value is not None:
            out[key] = value
    return out


class TeamStack:
    """Everything the compose file runs, as local processes on loopback (containers cannot run here):
    PostgreSQL (Airflow's metadata and MLflow's store), the MLflow server (basic auth, proxied
    artifacts), Redis, ``tritons`` local Tritons on one shared repository (the python runtime standing in
    for the NGC image's native ORT backend; every release goes to each, as to a fleet's replicas),
    Prometheus scraping them with the project's rules (``prometheus=True``) and Airflow with the
    CeleryExecutor and its workers (``executor="local"``: the compose file's LocalExecutor variant, no Redis,
    no worker). ``root/shared`` stands for the compose volumes every Airflow container
    mounts: ``home`` (SEQCLS_HOME), ``models`` (the Triton repository), ``checkpoints``
    (SEQCLS_CHECKPOINTS_ROOT)."""

    def __init__(
        self,
        root: Path,
        *,
        models_file: Path | None = None,
        password: str | None = None,
        airflow_env: dict[str, str] | None = None,
        tritons: int = 1,
        prometheus: bool = False,
        executor: str = "celery",
    ) -> None:
        if executor not in EXECUTORS:
            raise ValueError(f"executor={executor!r}: expected one of {', '.join(EXECUTORS)}")
        if tritons < 1:
            raise ValueError(f"tritons={tritons}: the stack needs at least one Triton")
        self.root = Path(root)
        self.airflow_env = dict(airflow_env or {})  # e.g. a drill's shorter task-heartbeat timeout
        self.models_file = models_file
        self.password = password
        self.postgres = Postgres()
        self.redis = Redis(self.root / "redis")
        self.mlflow: MlflowServer | None = None
        self.tritons: list = []
        self.triton_count = tritons
        self.prometheus = Prometheus(self.root / "prometheus", []) if prometheus else None
        self.airflow: ComposeAirflow | None = None
        self.executor = executor
        self.settings = None

    @property
    def triton(self):
        """The first Triton (the one a single-replica stack has)."""
        return self.tritons[0] if self.tritons else None

    def start(self) -> TeamStack:
        from seqcls.localtriton import LocalTriton, TritonServerConfig
        from seqcls.settings import Settings

        t0 = time.perf_counter()
        try:
            self.postgres.start()
            self.mlflow = MlflowServer(self.postgres, self.root / "mlflow")
            self.mlflow.root.mkdir(parents=True, exist_ok=True)
            self.mlflow.prepare()
            ports = [(free_port(), free_port(), free_port()) for _ in range(self.triton_count)]
            shared = self.root / "shared"
            self.settings = Settings(
                home=shared / "home",
                triton_repository=shared / "models",
                triton_grpc=tuple(f"127.0.0.1:{grpc}" for _, grpc, _ in ports),
                triton_http=tuple(f"127.0.0.1:{http}" for http, _, _ in ports),
                mlflow_tracking_uri=self.mlflow.url,
                checkpoints_root=shared / "checkpoints",
            )
            for path in (self.settings.home, self.settings.triton_repository, self.settings.checkpoints_root):
                path.mkdir(parents=True, exist_ok=True)
            for i, (http, grpc, metrics) in enumerate(ports, start=1):
                config = TritonServerConfig.from_settings(
                    self.settings, http_port=http, grpc_port=grpc, metrics_port=metrics,
                    state_dir=self.root / "tritons" / f"triton-{i}",
                )  # fmt: skip
                self.tritons.append(LocalTriton(config))
            metrics_urls = tuple(t.config.metrics_url for t in self.tritons)
            self.settings = dataclasses.replace(self.settings, triton_metrics=metrics_urls)
            if self.prometheus is not None:
                self.prometheus.targets = list(metrics_urls)
            self.airflow = ComposeAirflow(
                self.root / "airflow",
                self.settings,
                postgres=self.postgres,
                redis=self.redis,
                mlflow=self.mlflow,
                password=self.password,
                models_file=self.models_file,
                executor=self.executor,
            )
            self.airflow.stack.env.update(compose_seqcls_env(self.cli_env()))
            self.airflow.stack.env.update(self.airflow_env)
            # Every service after PostgreSQL waits only for itself to answer, so they start at once: Airflow's
            # migration, MLflow's, the Tritons' copies of the server and Redis overlap (a task needs them all
            # only when it runs). Leaving the pool waits for every start, failed or not, before the cleanup.
            starts = [self.mlflow.start, *(t.start for t in self.tritons), self.airflow.start]
            if self.airflow.workers:  # the Celery broker (the LocalExecutor variant has none)
                starts.append(self.redis.start)
            if self.prometheus is not None:
                starts.append(self.prometheus.start)
            with ThreadPoolExecutor(max_workers=len(starts), thread_name_prefix="stack-start") as pool:
                futures = [pool.submit(start) for start in starts]
            for future in futures:
                future.result()
        except BaseException:
            self.stop()
            raise
        log.info("team stack up in %.0fs under %s", time.perf_counter() - t0, self.root)
        return self

    def cli_env(self) -> dict[str, str]:
        """The environment of a ``seqcls`` CLI pointed at this stack (what the containers' variables say)."""
        assert self.settings is not None and self.mlflow is not None and self.tritons
        s = self.settings
        return {
            "SEQCLS_HOME": str(s.home),
            "SEQCLS_TRITON_REPOSITORY": str(s.triton_repository),
            "SEQCLS_TRITON_GRPC": ",".join(s.triton_grpc),
            "SEQCLS_TRITON_HTTP": ",".join(s.triton_http),
            "SEQCLS_TRITON_METRICS": ",".join(t.config.metrics_url for t in self.tritons),
            "SEQCLS_CHECKPOINTS_ROOT": str(s.checkpoints_root),
            **self.mlflow.client_env(),
        }

    def stop(self) -> None:
        """Airflow first (no task starts against a service going away), then the services at once, PostgreSQL
        last (MLflow and Airflow hold connections to it)."""
        if self.airflow is not None:
            self.airflow.stop()
        stops = [self.redis.stop, *(triton.stop for triton in self.tritons)]
        if self.prometheus is not None:
            stops.append(self.prometheus.stop)
        if self.mlflow is not None:
            stops.append(self.mlflow.kill)
        with ThreadPoolExecutor(max_workers=len(stops), thread_name_prefix="stack-stop") as pool:
            futures = [pool.submit(stop) for stop in stops]
        self.postgres.stop()
        for future in futures:
            future.result()

    def __enter__(self) -> TeamStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
