"""A local Airflow 3 UI stack (api-server, scheduler, dag-processor, triggerer) on loopback.

For ``make airflow-ui`` and the browser test: each component is its own process (stopping
``airflow standalone`` with SIGTERM orphans its children; SIGINT to each component stops it
cleanly), bound to 127.0.0.1, logs under ``<demo dir>/logs``, sqlite database, a known login
(SimpleAuthManager user ``admin`` with the password written to its passwords file). The local
Triton and the MLflow sqlite store come from the same settings as ``seqcls demo``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from seqcls.errors import SeqclsError
from seqcls.settings import Settings
from seqcls_tools.demo.run import airflow_cli, airflow_env

log = logging.getLogger(__name__)

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
USER = "admin"
DEFAULT_PASSWORD = "seqcls-demo"


class AirflowStack:
    """Start/stop the Airflow components; ``with AirflowStack(...) as stack:`` for tests."""

    def __init__(
        self,
        root: Path,
        settings: Settings,
        *,
        port: int = 8080,
        password: str = DEFAULT_PASSWORD,
        log_ports: tuple[int, int] | None = None,
    ) -> None:
        self.root = Path(root)
        self.settings = settings
        self.port = port
        self.password = password
        self.url = f"http://127.0.0.1:{port}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = self.root / "logs"
        self.env = airflow_env(self.root, settings)
        passwords = Path(self.env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json"
        worker_log, trigger_log = log_ports or (8793, 8794)
        self.env.update(
            {
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(port),
                "AIRFLOW__API__BASE_URL": self.url,
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(worker_log),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(trigger_log),
                "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
                "AIRFLOW__API_AUTH__JWT_SECRET": "seqcls-local-demo-secret",
            }
        )
        self.passwords_file = passwords

    def start(self, timeout: float = 180) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.passwords_file.parent.mkdir(parents=True, exist_ok=True)
        self.passwords_file.write_text(json.dumps({USER: self.password}))
        if airflow_cli(["db", "migrate"], self.env, timeout=600, log_file=self.logs / "db-migrate.log").returncode:
            raise SeqclsError(f"`airflow db migrate` failed; see {self.logs / 'db-migrate.log'}")
        airflow = str(Path(sys.executable).parent / "airflow")
        for name in COMPONENTS:
            out = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (owned by the child)
            self.procs[name] = subprocess.Popen(
                [airflow, name], env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                self.stop()
                raise SeqclsError(f"airflow {dead[0]} exited during start-up; see {self.logs / (dead[0] + '.log')}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=3) as r:
                    if r.status == 200:
                        log.info(
                            "airflow UI at %s (user %s) after %.0fs",
                            self.url,
                            USER,
                            timeout - (deadline - time.monotonic()),
                        )
                        return
            except (urllib.error.URLError, OSError):
                pass
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
