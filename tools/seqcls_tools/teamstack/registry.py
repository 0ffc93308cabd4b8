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

ROOT = Path(__file__).resolve().parents[3]
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
