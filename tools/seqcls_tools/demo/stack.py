"""A local Airflow 3 UI stack (api-server, scheduler, dag-processor, triggerer, log server) on loopback.

For ``make airflow-ui`` and the browser tests: each component is its own process (stopping
``airflow standalone`` with SIGTERM orphans its children; SIGINT to each component stops it
cleanly), logs under ``<demo dir>/logs``, sqlite database, a SimpleAuthManager user ``admin``. The
local Triton and the MLflow sqlite store come from the same settings as ``seqcls demo``.

What keeps it to this machine and this user:

- **Loopback only.** The api-server binds 127.0.0.1. Airflow 3.3's scheduler and triggerer would
  each fork a task-log server bound to every interface (``serve_logs`` passes ``host=""``; there is
  no option for it), so they run with ``--skip-serve-logs`` and the stack runs Airflow's own
  log-server app itself (:func:`serve_logs`) on 127.0.0.1, on free ports unless given. The hostname
  the components record — the api-server fetches a running task's log from it — is the loopback
  address (:func:`loopback_hostname`), whatever the machine's name resolves to.
- **Per-home secrets.** The JWT secret, the API secret key (log-server requests), the Fernet key
  (Connections in the metadata database) and the UI password of ``seqcls airflow-ui`` are generated
  once into ``<AIRFLOW_HOME>/seqcls-stack-secrets.json`` (0600; refused, like ssh does, when others
  may read it) and reused by later starts, so sessions and encrypted Connections survive restarts.
  The Airflow home itself is made 0700 (database, logs, login file).
- **Real Connections.** ``triton_default`` and ``mlflow_default`` are written into the metadata
  database on every start (``airflow connections import --overwrite``), from the settings, so the
  Connections page lists them and *Test* tests them; no ``AIRFLOW_CONN_*`` variable shadows them.
"""

from __future__ import annotations

import base64
import configparser
import contextlib
import http.client
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from seqcls.errors import InputError, SeqclsError
from seqcls.files import check_private, create_private
from seqcls.localtriton.ports import check_port_free, port_listeners, process_label
from seqcls.settings import Settings
from seqcls_tools.demo.run import airflow_cli, airflow_env

log = logging.getLogger(__name__)

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
#: The stack's task-log server (Airflow's log-server app on loopback), a process beside the components.
LOG_SERVER = "serve-logs"
#: Components that would otherwise fork their own log server on every interface.
SKIP_SERVE_LOGS = ("scheduler", "triggerer")
LOOPBACK = "127.0.0.1"
USER = "admin"
#: The login of a stack built without a password (the tests'); ``seqcls airflow-ui`` uses the home's generated one.
DEFAULT_PASSWORD = "seqcls-demo"
#: The stack's generated secrets, in its Airflow home beside the database the Fernet key encrypts.
SECRETS_FILE = "seqcls-stack-secrets.json"
#: The Connections the stack writes (and rewrites on every start) into its metadata database.
CONNECTIONS = ("triton_default", "mlflow_default")
LOG_APP = "airflow.utils.serve_logs.log_server:get_app"
MODULE = "seqcls_tools.demo.stack"  # not __name__: the log-server process runs this module as __main__


def loopback_hostname() -> str:
    """``[core] hostname_callable`` of the stack: task logs are fetched from where the log server listens."""
    return LOOPBACK


@dataclass(frozen=True, repr=False)
class StackSecrets:
    """What the stack's components must share and nobody else may know (see :func:`stack_secrets`)."""

    jwt_secret: str  # [api_auth] jwt_secret: UI/API sessions and the tasks' execution-API tokens
    api_secret_key: str  # [api] secret_key: the api-server's requests to the log server
    fernet_key: str  # [core] fernet_key: Connection passwords and extras in the metadata database
    admin_password: str  # the UI login of `seqcls airflow-ui` (unless --password)

    def __repr__(self) -> str:  # never the values (assertion messages, logs)
        return "StackSecrets(***)"

    def env(self) -> dict[str, str]:
        return {
            "AIRFLOW__API_AUTH__JWT_SECRET": self.jwt_secret,
            "AIRFLOW__API__SECRET_KEY": self.api_secret_key,
            "AIRFLOW__CORE__FERNET_KEY": self.fernet_key,
        }


def stack_secrets(airflow_home: Path) -> StackSecrets:
    """The home's secrets: generated on first use (0600, created atomically), the same on every later start.

    A home from before this file keeps the Fernet key Airflow wrote into its ``airflow.cfg``, so what its
    database holds stays readable.
    """
    path = Path(airflow_home) / SECRETS_FILE
    if not path.exists():
        values = {
            "jwt_secret": secrets.token_urlsafe(64),  # HS512 wants a key of 64 bytes or more (RFC 7518 3.2)
            "api_secret_key": secrets.token_urlsafe(64),
            "fernet_key": _existing_fernet_key(Path(airflow_home)) or _new_fernet_key(),
            "admin_password": secrets.token_urlsafe(16),
        }
        create_private(path, json.dumps(values, indent=1))  # a concurrent first start may win: its secrets are used
        log.info("generated the local Airflow stack's secrets into %s (0600)", path)
    return _read_secrets(path)


def _read_secrets(path: Path) -> StackSecrets:
    fix = "delete it to have new ones generated (sessions end; Connection passwords saved since must be entered again)"
    check_private(path, "the Airflow stack's secrets", fix)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        values = {f: data[f] for f in StackSecrets.__dataclass_fields__}
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"the Airflow stack's secrets {path} are unreadable ({exc!r}); {fix}") from None
    if not all(isinstance(v, str) and v for v in values.values()):
        raise InputError(f"the Airflow stack's secrets {path} hold an empty value; {fix}")
    return StackSecrets(**values)


def _new_fernet_key() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii")  # what Fernet.generate_key() makes


def _existing_fernet_key(airflow_home: Path) -> str | None:
    """``[core] fernet_key`` of the home's ``airflow.cfg`` when it is a usable key (Airflow generated it there)."""
    cfg = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        cfg.read(airflow_home / "airflow.cfg", encoding="utf-8")
        key = cfg.get("core", "fernet_key", fallback="").strip()
        return key if key and len(base64.urlsafe_b64decode(key.encode("ascii"))) == 32 else None
    except (configparser.Error, ValueError, UnicodeError):
        return None


def local_connections(settings: Settings) -> dict[str, dict]:
    """``triton_default`` and ``mlflow_default`` for ``settings`` (``airflow connections import`` format).

    No password: the Triton hook falls back to ``SEQCLS_TRITON_CONTROL_KEY`` / the local server's key
    file, so the key is not copied into one more place."""
    grpc, http = settings.triton_grpc, settings.triton_http
    host, _, port = grpc[0].removeprefix("dns:///").rpartition(":")
    return {
        "triton_default": {
            "conn_type": "triton",
            "description": "The local Triton of seqcls airflow-ui (rewritten from the settings on every start)",
            "host": host,
            "port": int(port),
            "extra": {
                "grpc_endpoints": ",".join(grpc),
                "http_endpoints": ",".join(http),
                "repository": str(settings.triton_repository),
            },
        },
        "mlflow_default": {
            "conn_type": "mlflow",
            "description": "The MLflow store of seqcls airflow-ui (rewritten from the settings on every start)",
            "extra": {"tracking_uri": str(settings.mlflow_tracking_uri)},
        },
    }


def serve_logs(ports: Sequence[int], host: str = LOOPBACK) -> None:
    """Airflow's task-log server app (what ``serve-logs`` runs) on ``host`` only, one socket per port.

    The same app, the same JWT check against ``[api] secret_key``, the same log folder — only bound
    where the stack binds everything. Returns on SIGINT/SIGTERM."""
    import uvicorn

    socks = []
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        socks.append(sock)
    config = uvicorn.Config(LOG_APP, factory=True, log_level="info", access_log=False)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it handled
        uvicorn.Server(config).run(sockets=socks)


class AirflowStack:
    """Start/stop the Airflow components; ``with AirflowStack(...) as stack:`` for tests.

    ``password`` None: the home's generated one (:class:`StackSecrets`). ``log_ports`` (worker,
    triggerer) default to free ports. ``env`` may be changed before :meth:`start`."""

    def __init__(
        self,
        root: Path,
        settings: Settings,
        *,
        port: int = 8080,
        password: str | None = DEFAULT_PASSWORD,
        log_ports: tuple[int, int] | None = None,
    ) -> None:
        from seqcls.localtriton import free_ports

        self.root = Path(root)
        self.settings = settings
        self.port = port
        self.url = f"http://{LOOPBACK}:{port}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        #: more processes beside the components, by name (the team stack's Celery workers)
        self.extra_commands: dict[str, list[str]] = {}
        #: a process's working directory, by name (the team stack's Celery workers each have their own)
        self.cwd: dict[str, Path] = {}
        self.logs = self.root / "logs"
        self.env = airflow_env(self.root, settings)
        for conn_id in CONNECTIONS:  # would hide the database's rows from tasks (the variables win)
            self.env.pop(f"AIRFLOW_CONN_{conn_id.upper()}", None)
        home = Path(self.env["AIRFLOW_HOME"])
        home.chmod(0o700)
        self.secrets = stack_secrets(home)
        self.password = password or self.secrets.admin_password
        self.passwords_file = home / "simple_auth_manager_passwords.json"
        self.log_ports: tuple[int, int] = tuple(log_ports or free_ports(2))  # type: ignore[assignment]
        self.connections = local_connections(settings)
        worker_log, trigger_log = self.log_ports
        self.env.update(
            {
                "AIRFLOW_CONFIG": str(home / "airflow.cfg"),  # this home's, never a file the caller points at
                "AIRFLOW__API__HOST": LOOPBACK,
                "AIRFLOW__API__PORT": str(port),
                "AIRFLOW__API__BASE_URL": self.url,
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": f"{MODULE}.{loopback_hostname.__name__}",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.passwords_file),
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(worker_log),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(trigger_log),
                "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
                "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": LOOPBACK,
                **self.secrets.env(),
            }
        )

    def commands(self) -> dict[str, list[str]]:
        """The command line of each process the stack starts, by name (log server first)."""
        airflow = str(Path(sys.executable).parent / "airflow")
        worker_log, trigger_log = self.log_ports
        serve = [sys.executable, "-m", MODULE, LOG_SERVER, LOOPBACK, str(worker_log), str(trigger_log)]
        return {
            LOG_SERVER: serve,
            **{
                name: [airflow, name, *(["--skip-serve-logs"] if name in SKIP_SERVE_LOGS else [])]
                for name in COMPONENTS
            },
            **self.extra_commands,
        }

    def write_login(self) -> None:
        """The SimpleAuthManager passwords file (0600) with this stack's login."""
        self.passwords_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.passwords_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # an older file keeps its mode through O_CREAT
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({USER: self.password}, f)

    def write_connections(self, timeout: float = 120) -> None:
        """:data:`CONNECTIONS` into the metadata database (after ``db migrate``): added, or updated in place."""
        self.logs.mkdir(parents=True, exist_ok=True)
        home = Path(self.env["AIRFLOW_HOME"])
        file = home / f".seqcls-connections-{os.getpid()}.json"
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self.connections, f)
        out = self.logs / "connections-import.log"
        try:
            proc = airflow_cli(
                ["connections", "import", str(file), "--overwrite"], self.env, timeout=timeout, log_file=out
            )
        finally:
            file.unlink(missing_ok=True)
        if proc.returncode:
            raise SeqclsError(f"`airflow connections import` of {', '.join(self.connections)} failed; see {out}")
        log.info(
            "Connections %s written to %s", ", ".join(self.connections), self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        )

    def spawn(self, name: str, extra_env: dict[str, str] | None = None) -> None:
        """Start process ``name`` of :meth:`commands` (its log appended, its own session and working directory);
        ``extra_env`` on top of the stack's environment (a drill's fault plan)."""
        with open(self.logs / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(
                self.commands()[name], env={**self.env, **(extra_env or {})}, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=self.cwd.get(name),
            )  # fmt: skip

    def start(self, timeout: float = 180) -> None:
        self.check_ports()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.write_login()
        if airflow_cli(["db", "migrate"], self.env, timeout=600, log_file=self.logs / "db-migrate.log").returncode:
            raise SeqclsError(f"`airflow db migrate` failed; see {self.logs / 'db-migrate.log'}")
        self.write_connections()
        for name in self.commands():
            self.spawn(name)
        self.wait_ready(timeout)

    def check_ports(self) -> None:
        """Fail before the slow start-up when the api-server's or a log server's port is taken, naming who
        holds it: a stranger answering there (a Triton's gRPC) otherwise surfaced as a bare protocol error."""
        worker_log, trigger_log = self.log_ports
        ports = (
            ("Airflow api-server", self.port),
            ("worker log server", worker_log),
            ("triggerer log server", trigger_log),
        )
        for service, port in ports:
            check_port_free(LOOPBACK, port, service, error=SeqclsError)

    def foreign_listener(self) -> str | None:
        """Who listens on the api-server's port when it is none of the stack's processes (or their children)."""
        listeners = port_listeners(self.port)
        if not listeners:
            return None
        ours: set[int] = set()
        for proc in self.procs.values():
            ours.add(proc.pid)
            with contextlib.suppress(psutil.Error):
                ours.update(child.pid for child in psutil.Process(proc.pid).children(recursive=True))
        strangers = [pid for pid in listeners if pid not in ours]
        return ", ".join(sorted({process_label(pid) for pid in strangers})) or None

    def wait_ready(self, timeout: float = 180) -> None:
        """Wait until the stack's own api-server answers its health check; stop the stack and fail when a
        component exits or something else answers on its port (an HTTP/2 server's frames read as a status line)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                stranger = self.foreign_listener() if dead[0] == "api-server" else None
                self.stop()
                held = f" (port {self.port} is held by {stranger})" if stranger else ""
                raise SeqclsError(
                    f"airflow {dead[0]} exited during start-up{held}; see {self.logs / (dead[0] + '.log')}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=3) as r:
                    healthy = r.status == 200
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                healthy = False
                refused = isinstance(getattr(exc, "reason", exc), ConnectionRefusedError)
            else:
                refused = False
            if not refused and (stranger := self.foreign_listener()):
                self.stop()
                raise SeqclsError(
                    f"port {self.port} is held by {stranger}, not this stack's api-server: stop that process or "
                    f"choose another port for the stack; its processes are stopped (see {self.logs / 'api-server.log'})"
                )
            if healthy:
                log.info(
                    "airflow UI at %s (user %s) after %.0fs; task logs served on %s ports %s",
                    self.url,
                    USER,
                    timeout - (deadline - time.monotonic()),
                    LOOPBACK,
                    "/".join(map(str, self.log_ports)),
                )
                return
            time.sleep(1)
        self.stop()
        raise SeqclsError(
            f"airflow api-server did not answer at {self.url} within {timeout:.0f}s; see {self.logs / 'api-server.log'}"
        )

    def token(self) -> str:
        req = urllib.request.Request(
            f"{self.url}/auth/token",
            method="POST",
            data=json.dumps({"username": USER, "password": self.password}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())["access_token"]

    def api(self, method: str, path: str, body: dict | None = None, token: str | None = None) -> dict:
        req = urllib.request.Request(
            f"{self.url}{path}",
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token or self.token()}"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"{}")

    def stop(self, timeout: float = 30) -> None:
        """SIGINT to each component (clean shutdown), then SIGTERM/SIGKILL to stragglers' groups."""
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGINT)
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        for p in self.procs.values():
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                time.sleep(1)
        self.procs.clear()

    def __enter__(self) -> AirflowStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _main(argv: Sequence[str]) -> int:
    """``python -m seqcls_tools.demo.stack serve-logs HOST PORT...`` (the stack's log-server process)."""
    if len(argv) < 3 or argv[0] != LOG_SERVER:
        print(f"usage: python -m {MODULE} {LOG_SERVER} HOST PORT [PORT...]", file=sys.stderr)
        return 2
    serve_logs([int(p) for p in argv[2:]], host=argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
