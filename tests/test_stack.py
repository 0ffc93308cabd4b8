"""The local Airflow UI stack (``make airflow-ui``, ``seqcls_tools.demo.stack``) keeps to itself (issue 25).

- **Loopback only**: the api-server on 127.0.0.1; the task log servers are Airflow's own log-server
  app bound to 127.0.0.1 on free ports (Airflow 3.3's ``serve-logs`` binds every interface and has no
  host option, so the scheduler and triggerer run with ``--skip-serve-logs``); the hostname the
  components record — the one the api-server fetches logs from — is the loopback address. A real log
  server process listens on 127.0.0.1 only and serves a log to a token signed with the home's key.
- **Per-home secrets**: the JWT secret, the API secret key, the Fernet key and the UI password are
  generated once into ``<AIRFLOW_HOME>/seqcls-stack-secrets.json`` (0600), reused by later starts,
  refused when others may read them; no secret is a constant of the source.
- **Real Connections**: ``triton_default`` and ``mlflow_default`` are rows of the stack's metadata
  database (type ``triton`` / ``mlflow``, updated on every start), not ``AIRFLOW_CONN_*`` variables
  that hide them from the Connections page; Airflow's own ``connections test`` passes on them.
- **Test on a sqlite MLflow store** opens the store read-only: an MLflow store answers, a missing one
  is reported (and not created), a file that is no MLflow store fails, nothing is written.
- **Ctrl-C ends only what it started**: ``seqcls airflow-ui`` stops the local Triton it started, and
  leaves running one it found running.
"""

from __future__ import annotations

import base64
import importlib
import json
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest

from seqcls.localtriton import free_ports
from seqcls.settings import Settings
from tests.helpers.airflow import airflow_db, listening, private_airflow_home, seed_migrated_db

private_airflow_home()  # before anything imports airflow (the hook tests below)
__all__ = ["airflow_db"]  # the session's migrated Airflow database, the fixture imported for this module

STACK_SOURCE = Path(__file__).resolve().parents[1] / "tools" / "seqcls_tools" / "demo" / "stack.py"
SECRET_VARS = ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY", "AIRFLOW__CORE__FERNET_KEY")


def _settings(root: Path, *, grpc_port: int = 18001, uri: str | None = None) -> Settings:
    return Settings(
        home=root / "home",
        triton_repository=root / "repo",
        triton_grpc=(f"127.0.0.1:{grpc_port}",),
        triton_http=(f"127.0.0.1:{grpc_port - 1}",),
        mlflow_tracking_uri=uri or f"sqlite:///{root / 'home' / 'mlflow.db'}",
    )


def _stack(root: Path, **kwargs):
    from seqcls_tools.demo.stack import AirflowStack

    return AirflowStack(root / "stack", _settings(root), port=18080, **kwargs)


# ----------------------------------------------------------------------------- loopback only


def test_every_listener_of_the_stack_is_on_loopback_on_free_ports(tmp_path: Path) -> None:
    from seqcls_tools.demo.stack import LOG_SERVER

    a, b = _stack(tmp_path / "a"), _stack(tmp_path / "b")
    ports = []
    for stack in (a, b):
        env = stack.env
        worker, trigger = (
            int(env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"]),
            int(env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"]),
        )
        assert {worker, trigger}.isdisjoint({8793, 8794}), (worker, trigger)  # Airflow's fixed defaults
        ports += [worker, trigger]
        assert env["AIRFLOW__API__HOST"] == "127.0.0.1" and env["AIRFLOW__API__BASE_URL"] == "http://127.0.0.1:18080"
        assert env["AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST"] == "127.0.0.1"
        # the hostname a task records is where the api-server fetches its log from: the loopback address
        module, _, name = env["AIRFLOW__CORE__HOSTNAME_CALLABLE"].rpartition(".")
        assert getattr(importlib.import_module(module), name)() == "127.0.0.1"
        commands = stack.commands()
        assert set(commands) == {"api-server", "scheduler", "dag-processor", "triggerer", LOG_SERVER}
        for name in ("scheduler", "triggerer"):  # their own serve-logs would bind 0.0.0.0 / [::]
            assert "--skip-serve-logs" in commands[name], commands[name]
        assert commands[LOG_SERVER][-3:] == ["127.0.0.1", str(worker), str(trigger)], commands[LOG_SERVER]
    assert len(set(ports)) == 4, ports
    given = _stack(tmp_path / "c", log_ports=(18793, 18794)).env
    assert (given["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"], given["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"]) == (
        "18793",
        "18794",
    )


@pytest.mark.slow
@pytest.mark.integration
def test_the_log_server_listens_on_loopback_only_and_serves_to_the_homes_key(tmp_path: Path) -> None:
    """The stack's log server, alone: 127.0.0.1 on both ports and nothing else; a task log for a token
    signed with the home's API secret key (what the api-server sends), 403 without; SIGINT ends it (0)."""
    import jwt
    import psutil
    import requests

    from seqcls_tools.demo.stack import LOG_SERVER

    stack = _stack(tmp_path)
    worker, trigger = stack.log_ports
    rel = "dag_id=d/run_id=r/task_id=t/attempt=1.log"
    path = Path(stack.env["AIRFLOW_HOME"]) / "logs" / rel
    path.parent.mkdir(parents=True)
    path.write_text("a task log line\n")
    stack.logs.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with (stack.logs / f"{LOG_SERVER}.log").open("wb") as out:
        proc = subprocess.Popen(stack.commands()[LOG_SERVER], env=stack.env, stdout=out, stderr=subprocess.STDOUT)
    try:

        def listeners() -> set[tuple[str, int]]:
            found = {(c.laddr.ip, c.laddr.port) for c in psutil.Process(proc.pid).net_connections(kind="inet")}
            return {a for a in found if a[1] in (worker, trigger)}

        deadline = time.monotonic() + 60
        while len(listeners()) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert listeners() == {("127.0.0.1", worker), ("127.0.0.1", trigger)}, (
            stack.logs / f"{LOG_SERVER}.log"
        ).read_text()
        now = int(time.time())
        claims = {"filename": rel, "aud": "task-instance-logs", "iat": now, "nbf": now, "exp": now + 30}
        token = jwt.encode(claims, stack.secrets.api_secret_key, algorithm="HS512")
        for port in (worker, trigger):
            ok = requests.get(f"http://127.0.0.1:{port}/log/{rel}", headers={"Authorization": token}, timeout=10)
            assert ok.status_code == 200 and ok.text == "a task log line\n", (ok.status_code, ok.text[:300])
            assert requests.get(f"http://127.0.0.1:{port}/log/{rel}", timeout=10).status_code == 403
        forged = jwt.encode(claims, "seqcls-local-demo-secret" * 3, algorithm="HS512")  # the old constant
        bad = requests.get(f"http://127.0.0.1:{worker}/log/{rel}", headers={"Authorization": forged}, timeout=10)
        assert bad.status_code == 403
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    print(f"\nlog server up, checked and stopped in {time.perf_counter() - t0:.1f}s")
    assert code == 0, (stack.logs / f"{LOG_SERVER}.log").read_text()[-2000:]
    assert listening({worker, trigger}) == []


# ----------------------------------------------------------------------------- per-home secrets


def test_secrets_are_generated_per_home_0600_and_reused(tmp_path: Path) -> None:
    from seqcls_tools.demo.stack import DEFAULT_PASSWORD, SECRETS_FILE

    first = _stack(tmp_path / "a")
    home = Path(first.env["AIRFLOW_HOME"])
    file = home / SECRETS_FILE
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) & 0o077 == 0  # the DB, logs and login file: the owner's only
    values = [first.env[v] for v in SECRET_VARS]
    source = STACK_SOURCE.read_text(encoding="utf-8")
    assert all(len(v) >= 43 and v not in source for v in values), "a secret of the stack is a constant of its source"
    assert "seqcls-local-demo-secret" not in source
    stored = json.loads(file.read_text(encoding="utf-8"))
    assert sorted(values) == sorted(stored[k] for k in ("jwt_secret", "api_secret_key", "fernet_key"))
    # a later start of the same home: the same secrets (sessions and encrypted Connections survive)
    again = _stack(tmp_path / "a", password=None)
    assert [again.env[v] for v in SECRET_VARS] == values
    assert again.password == stored["admin_password"] != DEFAULT_PASSWORD and len(again.password) >= 16
    other = _stack(tmp_path / "b")
    assert not {other.env[v] for v in SECRET_VARS} & set(values)  # another home, other secrets
    # the login file the api-server reads: written 0600
    again.write_login()
    assert stat.S_IMODE(again.passwords_file.stat().st_mode) == 0o600
    assert json.loads(again.passwords_file.read_text()) == {"admin": stored["admin_password"]}


def test_a_secrets_file_others_may_read_is_refused_and_a_homes_fernet_key_adopted(tmp_path: Path) -> None:
    from seqcls.errors import InputError
    from seqcls_tools.demo.stack import SECRETS_FILE

    stack = _stack(tmp_path / "a")
    file = Path(stack.env["AIRFLOW_HOME"]) / SECRETS_FILE
    file.chmod(0o644)
    with pytest.raises(InputError, match=rf"{SECRETS_FILE}.*readable by others.*chmod 600"):
        _stack(tmp_path / "a")
    # a home from before the secrets file: Airflow's airflow.cfg holds the key its DB is encrypted with
    old = tmp_path / "old" / "stack" / "airflow"
    old.mkdir(parents=True)
    key = base64.urlsafe_b64encode(b"an earlier home's 32-byte key!!!").decode()
    (old / "airflow.cfg").write_text(f"[core]\nfernet_key = {key}\n")
    assert _stack(tmp_path / "old").env["AIRFLOW__CORE__FERNET_KEY"] == key


def test_the_cli_password_defaults_to_the_homes_generated_one() -> None:
    from seqcls.cli import build_parser

    assert build_parser().parse_args(["airflow-ui"]).password is None  # None: the home's generated password


# ----------------------------------------------------------------------------- real Connections


@pytest.mark.slow
@pytest.mark.integration
def test_connections_are_rows_of_the_metadata_db_updated_on_every_start(
    airflow_db: Path, empty_mlflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the Connections page lists and *Test* tests: rows of the stack's database, encrypted with the
    home's Fernet key, rewritten from the settings on every start; no AIRFLOW_CONN_* variable shadows them."""
    from cryptography.fernet import Fernet

    from seqcls_tools.demo.stack import AirflowStack

    monkeypatch.setenv("AIRFLOW_CONN_TRITON_DEFAULT", json.dumps({"conn_type": "generic", "host": "elsewhere"}))
    store = tmp_path / "mlflow" / "mlflow.db"
    store.parent.mkdir()
    shutil.copyfile(empty_mlflow_db, store)
    settings = _settings(tmp_path, grpc_port=18001, uri=f"sqlite:///{store}")
    stack = AirflowStack(tmp_path / "stack", settings, port=18080)
    assert not {"AIRFLOW_CONN_TRITON_DEFAULT", "AIRFLOW_CONN_MLFLOW_DEFAULT"} & set(stack.env)
    db = Path(stack.env["AIRFLOW_HOME"]) / "airflow.db"
    seed_migrated_db(db, airflow_db)

    def rows() -> dict[str, dict]:
        fernet = Fernet(stack.secrets.fernet_key.encode())
        with sqlite3.connect(db) as c:
            c.row_factory = sqlite3.Row
            found = [dict(r) for r in c.execute("SELECT * FROM connection ORDER BY conn_id")]
        for row in found:
            if row["is_extra_encrypted"]:
                row["extra"] = fernet.decrypt(row["extra"].encode()).decode()
        return {r["conn_id"]: r for r in found}

    t0 = time.perf_counter()
    stack.write_connections()
    first = rows()
    assert sorted(first) == ["mlflow_default", "triton_default"]
    triton, mlflow = first["triton_default"], first["mlflow_default"]
    assert (triton["conn_type"], triton["host"], triton["port"], triton["password"]) == (
        "triton",
        "127.0.0.1",
        18001,
        None,
    )
    assert json.loads(triton["extra"]) == {
        "grpc_endpoints": "127.0.0.1:18001",
        "http_endpoints": "127.0.0.1:18000",
        "repository": str(tmp_path / "repo"),
    }
    assert mlflow["conn_type"] == "mlflow" and json.loads(mlflow["extra"]) == {"tracking_uri": f"sqlite:///{store}"}
    assert triton["is_extra_encrypted"]  # by the home's key (decrypted above)

    moved = AirflowStack(tmp_path / "stack", _settings(tmp_path, grpc_port=18101, uri=f"sqlite:///{store}"), port=18080)
    moved.write_connections()  # the next start, the settings changed: updated in place, not duplicated
    second = rows()
    assert sorted(second) == ["mlflow_default", "triton_default"]
    assert second["triton_default"]["port"] == 18101 and second["triton_default"]["id"] == triton["id"]

    # what the api-server's POST /connections/test does with the row: Connection from the secrets backends
    # (the database: no variable shadows it), then the provider hook's test_connection on the sqlite store
    code = (
        "import json; from airflow.models import Connection; "
        "c = Connection.get_connection_from_secrets('mlflow_default'); "
        "print(json.dumps([c.conn_type, *c.test_connection()]))"
    )
    env = {**moved.env, "_AIRFLOW_PROCESS_CONTEXT": "server"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    print(f"\nconnections written twice and tested in {time.perf_counter() - t0:.1f}s")
    assert out.returncode == 0, out.stderr[-3000:]
    conn_type, status, message = json.loads(out.stdout.strip().splitlines()[-1])
    assert conn_type == "mlflow" and status, message
    assert f"the model registry at sqlite:///{store} answered (sqlite store opened read-only" in message, message


# ----------------------------------------------------------------------------- Test on a sqlite MLflow store


def _mlflow_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, uri: str) -> str:
    extra = {"tracking_uri": uri}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "mlflow", "extra": extra}))
    return conn_id


def test_mlflow_test_on_a_sqlite_store_opens_it_read_only(
    empty_mlflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seqcls.airflow.hooks import MlflowHook

    store = tmp_path / "store" / "mlflow.db"
    store.parent.mkdir()
    shutil.copyfile(empty_mlflow_db, store)
    before = store.read_bytes()
    status, message = MlflowHook(_mlflow_conn(monkeypatch, "m_store", f"sqlite:///{store}")).test_connection()
    assert status and f"the model registry at sqlite:///{store} answered" in message, message
    assert "no registered model yet" in message and "read-only" in message
    assert store.read_bytes() == before and sorted(p.name for p in store.parent.iterdir()) == ["mlflow.db"]

    missing = tmp_path / "nowhere" / "mlflow.db"
    status, message = MlflowHook(_mlflow_conn(monkeypatch, "m_missing", f"sqlite:///{missing}")).test_connection()
    assert status and f"no MLflow store at {missing} yet" in message and "the first release creates it" in message
    assert not missing.parent.exists()  # a Test creates nothing

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE t (x)")
    before = other.read_bytes()
    status, message = MlflowHook(_mlflow_conn(monkeypatch, "m_other", f"sqlite:///{other}")).test_connection()
    assert not status and f"{other} is not an MLflow store" in message, message
    assert other.read_bytes() == before

    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    status, message = MlflowHook(_mlflow_conn(monkeypatch, "m_junk", f"sqlite:///{junk}")).test_connection()
    assert not status and f"{junk} is not a sqlite database" in message, message

    status, message = MlflowHook(_mlflow_conn(monkeypatch, "m_dir", f"sqlite:///{tmp_path}")).test_connection()
    assert not status and f"{tmp_path} is a directory" in message, message


# ----------------------------------------------------------------------------- Ctrl-C ends only what it started


class _CtrlCStack:
    """Stands in for the Airflow components: checks Triton is up when they would start, then Ctrl-C."""

    seen: ClassVar[list[dict]] = []

    def __init__(self, root: Path, settings: Settings, *, port: int, password: str | None, **_: object) -> None:
        from seqcls.localtriton import LocalTriton, TritonServerConfig

        self.triton = LocalTriton(TritonServerConfig.from_settings(settings))
        self.url, self.password = f"http://127.0.0.1:{port}", password or "generated"
        self.record: dict = {"password": password}
        _CtrlCStack.seen.append(self.record)

    def start(self) -> None:
        self.record["triton_live_at_start"] = self.triton.status().live
        raise KeyboardInterrupt  # the user's Ctrl-C while the components start

    def stop(self) -> None:
        self.record["stopped"] = True


@pytest.mark.slow
@pytest.mark.integration
def test_ctrl_c_stops_the_triton_it_started_and_leaves_one_it_found_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import seqcls_tools.demo.stack as stack_module
    from seqcls.cli import main
    from seqcls.localtriton import LocalTriton, TritonServerConfig

    http, grpc, metrics = free_ports(3)
    env = {
        "SEQCLS_DEMO_DIR": str(tmp_path / "demo"),
        "SEQCLS_HOME": str(tmp_path / "home"),
        "SEQCLS_TRITON_REPOSITORY": str(tmp_path / "repo"),
        "SEQCLS_TRITON_GRPC": f"127.0.0.1:{grpc}",
        "SEQCLS_TRITON_HTTP": f"127.0.0.1:{http}",
        "SEQCLS_TRITON_METRICS": f"127.0.0.1:{metrics}",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(stack_module, "AirflowStack", _CtrlCStack)
    _CtrlCStack.seen = []
    triton = LocalTriton(TritonServerConfig.from_settings(Settings.from_env()))
    sigterm = signal.getsignal(signal.SIGTERM)
    t0 = time.perf_counter()

    assert main(["airflow-ui", "--port", "18080"]) == 0  # nothing running: the CLI starts Triton, Ctrl-C stops it
    started = _CtrlCStack.seen[-1]
    assert started == {"password": None, "triton_live_at_start": True, "stopped": True}, started
    assert not triton.status().running
    assert "stopped: the Airflow components and the local Triton" in capsys.readouterr().out

    triton.start()  # somebody's `seqcls triton start`, before `make airflow-ui`
    try:
        assert main(["airflow-ui", "--port", "18080"]) == 0
        reused = _CtrlCStack.seen[-1]
        assert reused["triton_live_at_start"] and reused["stopped"], reused
        status = triton.status()
        assert status.running and status.live, status  # not ours to stop
        out = capsys.readouterr().out
        assert "the local Triton was already running: left running" in out, out
    finally:
        triton.stop()
    assert signal.getsignal(signal.SIGTERM) == sigterm  # the CLI's handler does not outlive it
    print(f"\ntwo airflow-ui runs (one Triton started and stopped) in {time.perf_counter() - t0:.1f}s")
