"""The team stack's registry, run for real on this machine: PostgreSQL and the ``mlflow server`` of
``docker-compose.airflow.yml``, as local processes on loopback.

Why: a team's MLflow is a tracking server on a database, behind basic auth, with a proxied artifact
store — not the sqlite file of the embedded default. Containers cannot run here, so the compose
file's ``mlflow`` service is rehearsed from the compose file itself (:func:`mlflow_command`): its
command-line flags and environment, with the container host names mapped to local ports and its
volumes to local directories — the rehearsal and the compose file cannot drift apart. PostgreSQL
is Debian's ``postgresql`` package, started from a throwaway data directory (``initdb`` +
``pg_ctl``, loopback only, a port of its own); as root (CI) it runs as the ``postgres`` user, which
PostgreSQL requires.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import yaml

from seqcls.localtriton import free_port

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.airflow.yml"
#: Where Debian's packages put the server binaries (``pg_config --bindir`` is in -dev only).
PG_BINDIRS = "/usr/lib/postgresql/*/bin"


def pg_bindir() -> Path:
    """The directory of ``initdb`` / ``pg_ctl`` (the newest Debian cluster version, else ``PATH``)."""
    found = sorted(Path("/").glob(PG_BINDIRS.lstrip("/")), key=lambda p: int(p.parent.name), reverse=True)
    for candidate in found:
        if (candidate / "initdb").is_file():
            return candidate
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise FileNotFoundError(
        "PostgreSQL's initdb was not found (Debian: apt-get install postgresql; `make system-deps` installs it)"
    )


def compose_service(name: str, compose_file: Path = COMPOSE_FILE) -> dict:
    """One service of the compose file, as written (no interpolation)."""
    data = yaml.safe_load(compose_file.read_text(encoding="utf-8"))
    return data["services"][name]


@dataclass
class Postgres:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (scram-sha-256 passwords, fsync off: a test database)."""

    port: int = field(default_factory=free_port)
    superuser: str = "seqcls"
    password: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    root: Path | None = None
    proc_log: Path | None = None
    initialized: bool = False

    def _as_owner(self, argv: list[str]) -> list[str]:
        """PostgreSQL refuses to run as root: as root, run it as Debian's ``postgres`` user."""
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    def start(self) -> Postgres:
        t0 = time.perf_counter()
        bindir = pg_bindir()
        # under /tmp (not a 0700 pytest directory) so the postgres user can reach it when we are root
        self.root = Path(tempfile.mkdtemp(prefix="seqcls-pg-"))
        pwfile, data, sock = self.root / "pw", self.root / "data", self.root / "sock"
        pwfile.write_text(self.password + "\n", encoding="utf-8")
        sock.mkdir()
        if os.geteuid() == 0:
            for path in (self.root, pwfile, sock):
                shutil.chown(path, "postgres")
        initdb = [str(bindir / "initdb"), "-D", str(data), "-U", self.superuser, "--auth=scram-sha-256"]
        initdb += [f"--pwfile={pwfile}", "-E", "UTF8", "--no-locale", "-N"]
        subprocess.run(self._as_owner(initdb), check=True, capture_output=True, text=True, timeout=120)
        pwfile.unlink()
        self.proc_log = self.root / "postgres.log"
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={sock} -c fsync=off"
        pg_ctl = [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(self.proc_log), "-o", options, "-w", "start"]
        subprocess.run(self._as_owner(pg_ctl), check=True, capture_output=True, text=True, timeout=120)
        log.info("PostgreSQL %s on 127.0.0.1:%d (%s), started in %.1fs", bindir.parent.name, self.port, data,
                 time.perf_counter() - t0)  # fmt: skip
        return self

    def run_init_scripts(self, compose_file: Path = COMPOSE_FILE) -> None:
        """What the postgres image does on an empty volume, once per cluster: the role and database of its
        ``POSTGRES_USER`` / ``POSTGRES_PASSWORD`` / ``POSTGRES_DB`` (Airflow's metadata database), then the
        ``*.sql`` files the compose file mounts at ``/docker-entrypoint-initdb.d``, in name order."""
        if self.initialized:
            return
        service = compose_service("postgres", compose_file)
        env = {str(k): str(v) for k, v in (service.get("environment") or {}).items()}
        source = ""
        for entry in service.get("volumes") or []:
            parts = str(entry).split(":")
            if len(parts) > 1 and parts[1] == "/docker-entrypoint-initdb.d":
                source = parts[0]
        conn = self.connect("postgres")
        conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
        try:
            user, database = env.get("POSTGRES_USER"), env.get("POSTGRES_DB")
            if user:
                from psycopg2 import sql

                with conn.cursor() as cur:
                    cur.execute(
                        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                            sql.Identifier(user), sql.Literal(env.get("POSTGRES_PASSWORD", ""))
                        )
                    )
                    cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(database or user), sql.Identifier(user)))  # fmt: skip
            for script in sorted((compose_file.parent / source).glob("*.sql")) if source else []:
                with conn.cursor() as cur:
                    for statement in _statements(script.read_text(encoding="utf-8")):
                        cur.execute(statement)
                log.info("PostgreSQL: ran %s", script.name)
        finally:
            conn.close()
        self.initialized = True

    def connect(self, database: str):
        """A psycopg2 connection to ``database`` as the superuser."""
        import psycopg2

        return psycopg2.connect(
            host="127.0.0.1", port=self.port, user=self.superuser, password=self.password, dbname=database
        )

    def query(self, database: str, sql: str) -> list[tuple]:
        conn = self.connect(database)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall())
        finally:
            conn.close()

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is cut, the data stays (a drill's database restart)."""
        assert self.root is not None, "not started"
        data, sock = self.root / "data", self.root / "sock"
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={sock} -c fsync=off"
        pg_ctl = [str(pg_bindir() / "pg_ctl"), "-D", str(data), "-l", str(self.proc_log), "-o", options]
        subprocess.run(self._as_owner([*pg_ctl, "-m", "fast", "-w", "restart"]), check=True, capture_output=True,
                       timeout=120)  # fmt: skip

    def stop(self) -> None:
        if self.root is None:
            return
        data = self.root / "data"
        if data.exists():
            pg_ctl = [str(pg_bindir() / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]
            subprocess.run(self._as_owner(pg_ctl), capture_output=True, timeout=120)
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None


def _statements(sql: str) -> list[str]:
    """The statements of a plain SQL script (``--`` comments, one statement per ``;``)."""
    lines = [line.split("--", 1)[0] for line in sql.splitlines()]
    return [part.strip() for part in "\n".join(lines).split(";") if part.strip()]


def _flag(argv: list[str], name: str) -> str | None:
    for arg in argv:
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return None


def _replace_flag(argv: list[str], name: str, value: str) -> list[str]:
    return [f"{name}={value}" if a.startswith(f"{name}=") else a for a in argv]


def local_database_url(compose_url: str, postgres: Postgres) -> str:
    """The compose file's ``postgresql+psycopg2://user:pw@postgres:5432/db`` on the local cluster's port."""
    parts = urlsplit(compose_url)
    if parts.hostname != "postgres":
        raise ValueError(f"{compose_url!r}: expected the compose service postgres as its host")
    netloc = f"{parts.username}:{parts.password}@127.0.0.1:{postgres.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass
class MlflowServer:
    """The compose file's ``mlflow`` service as a local process: same flags and environment, its database
    on the local :class:`Postgres`, its artifact volume a local directory, basic auth on.

    ``kill`` / ``start`` keep the port and the store, so a drill can kill -9 it and bring it back."""

    postgres: Postgres
    root: Path
    username: str = "seqcls"
    password: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client_env(self) -> dict[str, str]:
        """What a client (the seqcls CLI) needs: the URI and MLflow's own credential variables."""
        return {
            "SEQCLS_MLFLOW_TRACKING_URI": self.url,
            "MLFLOW_TRACKING_USERNAME": self.username,
            "MLFLOW_TRACKING_PASSWORD": self.password,
        }

    def prepare(self, compose_file: Path = COMPOSE_FILE) -> MlflowServer:
        """The compose file's mlflow service made local: its databases created by the postgres service's init
        scripts, its command line and environment with hosts, volumes and ``${…}`` secrets mapped."""
        self.postgres.run_init_scripts(compose_file)
        service = compose_service("mlflow", compose_file)
        command = [str(a) for a in service["command"]]
        if command[:2] != ["mlflow", "server"]:
            raise ValueError(f"{compose_file}: services.mlflow.command starts {command[:2]}, expected mlflow server")
        store = local_database_url(_flag(command, "--backend-store-uri") or "", self.postgres)
        argv = _replace_flag(command, "--backend-store-uri", store)
        argv = _replace_flag(argv, "--artifacts-destination", str(self.root / "artifacts"))
        argv = _replace_flag(argv, "--host", "127.0.0.1")
        argv = _replace_flag(argv, "--port", str(self.port))
        allowed = _flag(argv, "--allowed-hosts")
        if allowed is not None:
            argv = _replace_flag(argv, "--allowed-hosts", f"{allowed},127.0.0.1:{self.port}")
        self.argv = [sys.executable, "-m", "mlflow", *argv[1:]]
        generated = {"MLFLOW_ADMIN_PASSWORD": self.password, "MLFLOW_SECRET_KEY": secrets.token_hex(16)}
        env = {}
        for key, value in (service.get("environment") or {}).items():
            value = str(value)
            if value.startswith("${"):  # a secret the compose file takes from .env: generated here
                value = generated[value[2:].split(":", 1)[0].rstrip("}")]
            elif value.startswith("postgresql"):
                value = local_database_url(value, self.postgres)
            env[str(key)] = value
        env["MLFLOW_AUTH_CONFIG_PATH"] = str(self.root / "basic_auth.ini")
        self.username = env.get("MLFLOW_ADMIN_USERNAME", self.username)
        self.env = env
        if _flag(argv, "--app-name") == "basic-auth":
            from seqcls_tools.compose_mlflow import auth_ini

            path = Path(env["MLFLOW_AUTH_CONFIG_PATH"])
            path.write_text(auth_ini(env), encoding="utf-8")
            path.chmod(0o600)
        return self

    def start(self) -> None:
        if not self.argv:
            self.prepare()
        out = open(self.root / "mlflow.log", "ab")  # noqa: SIM115 (the server owns it)
        self.proc = subprocess.Popen(
            self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **self.env}
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if urllib.request.urlopen(f"{self.url}/health", timeout=2).status == 200:
                    return
            except OSError:
                time.sleep(0.5)
            if self.proc.poll() is not None:
                raise RuntimeError((self.root / "mlflow.log").read_text(errors="replace")[-3000:])
        raise TimeoutError("mlflow server did not become healthy in 120 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


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
#: the executor and everything Celery, the metadata database. Paths, secrets (``*_CMD`` files of the
#: airflow-init volume) and the API URL are the local stack's own.
COMPOSE_AIRFLOW_KEYS = (
    "AIRFLOW__CORE__EXECUTOR",
    "AIRFLOW__CORE__PARALLELISM",
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION",
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


class CeleryAirflow:
    """The compose file's Airflow on this machine: api-server, scheduler, dag-processor, triggerer and its
    Celery workers (as many as ``deploy.replicas``), each worker in a working directory of its own, on the
    local PostgreSQL and Redis, with the compose file's executor settings (:func:`compose_airflow_env`).

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
    ) -> None:
        from seqcls_tools.demo.stack import AirflowStack

        self.root = Path(root)
        self.stack = AirflowStack(self.root, settings, port=port or free_port(), password=password)
        hosts = {
            "postgres:5432": f"127.0.0.1:{postgres.port}",
            "redis:6379": f"127.0.0.1:{redis.port}",
            "mlflow:5000": f"127.0.0.1:{mlflow.port}",
        }
        self.compose_env = compose_airflow_env(hosts, compose_file)
        self.workers = compose_worker_replicas(compose_file)
        env = self.stack.env
        env.update(self.compose_env)
        env.update(mlflow.client_env())  # the compose file's MLFLOW_TRACKING_* for the CLI in the containers
        env["SEQCLS_MODELS_FILE"] = str(models_file) if models_file else "none"
        mlflow_conn = self.stack.connections["mlflow_default"]
        mlflow_conn.update({"login": mlflow.username, "password": mlflow.password})
        mlflow_conn["description"] = "The team stack's MLflow server (basic auth), rewritten on every start"
        postgres.run_init_scripts(compose_file)  # Airflow's role and database, as the image makes them
        base = self.stack.commands

        def commands() -> dict[str, list[str]]:
            airflow = str(Path(sys.executable).parent / "airflow")
            workers = {
                f"worker-{i}": [airflow, "celery", "worker", "--skip-serve-logs", "--celery-hostname", f"worker-{i}@%h"]
                for i in range(1, self.workers + 1)
            }
            return {**base(), **workers}

        self.stack.commands = commands  # type: ignore[method-assign]
        for i in range(1, self.workers + 1):
            cwd = self.root / "workers" / f"worker-{i}"
            cwd.mkdir(parents=True, exist_ok=True)
            self.stack.cwd[f"worker-{i}"] = cwd

    @property
    def url(self) -> str:
        return self.stack.url

    def start(self, timeout: float = 240) -> CeleryAirflow:
        t0 = time.perf_counter()
        self.stack.start(timeout=timeout)
        log.info(
            "Airflow (CeleryExecutor, %d workers, metadata on PostgreSQL) at %s after %.0fs",
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
        cmd = self.stack.commands()[name]
        with open(self.stack.logs / f"{name}.log", "ab") as out:
            self.stack.procs[name] = subprocess.Popen(
                cmd, env={**self.stack.env, **(extra_env or {})}, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=self.stack.cwd.get(name),
            )  # fmt: skip

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
    artifacts), Redis, a local Triton (the python runtime standing in for the NGC image's native ORT
    backend) and Airflow with the CeleryExecutor and its workers. ``root/shared`` stands for the compose
    volumes every Airflow container mounts: ``home`` (SEQCLS_HOME), ``models`` (the Triton
    repository), ``checkpoints`` (SEQCLS_CHECKPOINTS_ROOT)."""

    def __init__(
        self,
        root: Path,
        *,
        models_file: Path | None = None,
        password: str | None = None,
        airflow_env: dict[str, str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.airflow_env = dict(airflow_env or {})  # e.g. a drill's shorter task-heartbeat timeout
        self.models_file = models_file
        self.password = password
        self.postgres = Postgres()
        self.redis = Redis(self.root / "redis")
        self.mlflow: MlflowServer | None = None
        self.triton = None
        self.airflow: CeleryAirflow | None = None
        self.settings = None

    def start(self) -> TeamStack:
        from seqcls.localtriton import LocalTriton, TritonServerConfig
        from seqcls.settings import Settings

        t0 = time.perf_counter()
        try:
            self.postgres.start()
            self.mlflow = MlflowServer(self.postgres, self.root / "mlflow")
            self.mlflow.root.mkdir(parents=True, exist_ok=True)
            self.mlflow.prepare().start()
            self.redis.start()
            http, grpc = free_port(), free_port()
            shared = self.root / "shared"
            self.settings = Settings(
                home=shared / "home",
                triton_repository=shared / "models",
                triton_grpc=(f"127.0.0.1:{grpc}",),
                triton_http=(f"127.0.0.1:{http}",),
                mlflow_tracking_uri=self.mlflow.url,
                checkpoints_root=shared / "checkpoints",
            )
            for path in (self.settings.home, self.settings.triton_repository, self.settings.checkpoints_root):
                path.mkdir(parents=True, exist_ok=True)
            self.triton = LocalTriton(TritonServerConfig.from_settings(self.settings, metrics_port=free_port()))
            self.triton.start()
            self.settings = dataclasses.replace(self.settings, triton_metrics=(self.triton.config.metrics_url,))
            self.airflow = CeleryAirflow(
                self.root / "airflow",
                self.settings,
                postgres=self.postgres,
                redis=self.redis,
                mlflow=self.mlflow,
                password=self.password,
                models_file=self.models_file,
            )
            self.airflow.stack.env.update(compose_seqcls_env(self.cli_env()))
            self.airflow.stack.env.update(self.airflow_env)
            self.airflow.start()
        except BaseException:
            self.stop()
            raise
        log.info("team stack up in %.0fs under %s", time.perf_counter() - t0, self.root)
        return self

    def cli_env(self) -> dict[str, str]:
        """The environment of a ``seqcls`` CLI pointed at this stack (what the containers' variables say)."""
        assert self.settings is not None and self.mlflow is not None and self.triton is not None
        s = self.settings
        return {
            "SEQCLS_HOME": str(s.home),
            "SEQCLS_TRITON_REPOSITORY": str(s.triton_repository),
            "SEQCLS_TRITON_GRPC": ",".join(s.triton_grpc),
            "SEQCLS_TRITON_HTTP": ",".join(s.triton_http),
            "SEQCLS_TRITON_METRICS": self.triton.config.metrics_url,
            "SEQCLS_CHECKPOINTS_ROOT": str(s.checkpoints_root),
            **self.mlflow.client_env(),
        }

    def stop(self) -> None:
        if self.airflow is not None:
            self.airflow.stop()
        if self.triton is not None:
            self.triton.stop()
        self.redis.stop()
        if self.mlflow is not None:
            self.mlflow.kill()
        self.postgres.stop()

    def __enter__(self) -> TeamStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
