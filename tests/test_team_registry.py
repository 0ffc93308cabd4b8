"""The team stack's registry for real: the compose file's ``mlflow`` service run as a local process on a
throwaway PostgreSQL, basic auth on, artifacts proxied (``seqcls_tools.teamstack``).

The compose file cannot run here (no container engine); its MLflow command line, environment and the
postgres service's init script are what the local server is started from, so a change to one is a
change to the other. The release drills that kill this server (register, promote, undo) are in
``test_drills.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqcls.steps.register import MODEL_METRICS
from seqcls_tools.compose_mlflow import auth_ini
from seqcls_tools.teamstack import COMPOSE_FILE, MlflowServer, Postgres, compose_service, local_database_url
from tests.helpers.drills import Drill

# ----------------------------------------------------------------------------- the mapping (no server)


def test_the_local_server_is_the_compose_service_with_hosts_and_secrets_mapped(tmp_path: Path) -> None:
    class _NoInit(Postgres):
        def run_init_scripts(self, compose_file: Path = COMPOSE_FILE) -> None:
            self.ran = compose_file

    pg = _NoInit(port=15432)
    server = MlflowServer(pg, tmp_path, port=15000).prepare()
    compose = compose_service("mlflow")
    flags = {a.split("=", 1)[0]: a.partition("=")[2] for a in server.argv if a.startswith("--")}
    # every flag of the compose command is there; only hosts, ports and volumes changed
    assert set(flags) == {str(a).split("=", 1)[0] for a in compose["command"] if str(a).startswith("--")}
    assert "--serve-artifacts" in server.argv
    assert flags["--backend-store-uri"] == "postgresql+psycopg2://mlflow:mlflow@127.0.0.1:15432/mlflow"
    assert flags["--artifacts-destination"] == str(tmp_path / "artifacts")
    assert (flags["--host"], flags["--port"], flags["--app-name"]) == ("127.0.0.1", "15000", "basic-auth")
    assert "127.0.0.1:15000" in flags["--allowed-hosts"].split(",")
    # the .env secrets are generated, never the compose file's ${…} text; the ini holds the admin
    assert "${" not in json.dumps(server.env) and server.env["MLFLOW_ADMIN_PASSWORD"] == server.password
    assert server.env["MLFLOW_AUTH_DATABASE_URI"].endswith("@127.0.0.1:15432/mlflow_auth")
    ini = Path(server.env["MLFLOW_AUTH_CONFIG_PATH"])
    assert ini.stat().st_mode & 0o077 == 0
    assert f"admin_password = {server.password}" in ini.read_text(encoding="utf-8")
    # the compose file's credential cache reaches MLflow's ini: a password hashed once a minute, not per request
    assert server.env["MLFLOW_AUTH_CACHE_TTL_SECONDS"] == "60"
    assert "auth_cache_ttl_seconds = 60\n" in ini.read_text(encoding="utf-8")
    assert pg.ran == COMPOSE_FILE


def test_the_image_entrypoint_names_a_missing_variable() -> None:
    with pytest.raises(SystemExit, match="set MLFLOW_ADMIN_PASSWORD"):
        auth_ini({"MLFLOW_ADMIN_USERNAME": "seqcls", "MLFLOW_AUTH_DATABASE_URI": "postgresql://x"})


def test_the_credential_cache_must_be_whole_seconds() -> None:
    env = {"MLFLOW_ADMIN_USERNAME": "seqcls", "MLFLOW_ADMIN_PASSWORD": "p" * 12, "MLFLOW_AUTH_DATABASE_URI": "x"}
    assert "auth_cache_ttl_seconds = 0\n" in auth_ini(env)  # unset: MLflow's default, off
    with pytest.raises(SystemExit, match=r"MLFLOW_AUTH_CACHE_TTL_SECONDS must be a whole number.*'1m'"):
        auth_ini({**env, "MLFLOW_AUTH_CACHE_TTL_SECONDS": "1m"})


def test_a_database_url_must_name_the_postgres_service() -> None:
    with pytest.raises(ValueError, match="expected the compose service postgres"):
        local_database_url("postgresql+psycopg2://u:p@elsewhere:5432/db", Postgres(port=1))


# ----------------------------------------------------------------------------- a release through it


@pytest.mark.slow
@pytest.mark.integration
def test_a_release_registers_in_postgres_behind_basic_auth(
    drill: Drill,
    team_mlflow: MlflowServer,
    team_postgres: Postgres,
    tiny_checkpoint_src: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {**team_mlflow.client_env(), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    # the wrong password: refused by the server, nothing reaches Triton or the registry
    denied = drill.cli(
        "release", "--checkpoint", str(tiny_checkpoint_src), "--model-name", "teamreg",
        **{**env, "MLFLOW_TRACKING_PASSWORD": "not-the-password"},
    )  # fmt: skip
    assert denied.returncode != 0
    assert "refused the credentials" in denied.stderr and "MLFLOW_TRACKING_PASSWORD" in denied.stderr, denied.stderr
    assert not team_postgres.query("mlflow", "SELECT name FROM registered_models WHERE name = 'teamreg'")
    assert not (drill.repo / "teamreg").exists()

    server_log = team_mlflow.root / "mlflow.log"
    seen = server_log.stat().st_size
    out = drill.cli("release", "--checkpoint", str(tiny_checkpoint_src), "--model-name", "teamreg", "--json", **env)
    assert out.returncode == 0, out.stderr[-3000:]
    with server_log.open("rb") as fh:
        fh.seek(seen)
        requests = [line for line in fh.read().decode(errors="replace").splitlines() if '"GET /' in line
                    or '"POST /' in line or '"PUT /' in line or '"PATCH /' in line or '"DELETE /' in line]  # fmt: skip
    # every request pays basic auth's password hash: the model is logged without fetching each metric's history
    assert not [r for r in requests if "/metrics/get-history" in r], len(requests)
    print(f"\n{len(requests)} requests to the MLflow server for one release")
    # the registry is PostgreSQL: the version and its champion alias are rows there
    versions = team_postgres.query("mlflow", "SELECT version FROM model_versions WHERE name = 'teamreg'")
    aliases = team_postgres.query(
        "mlflow", "SELECT alias, version FROM registered_model_aliases WHERE name = 'teamreg'"
    )
    assert versions == [(1,)] and ("champion", 1) in aliases, (versions, aliases)
    # artifacts went through the server's proxy into its artifact store, not beside the client
    assert list((team_mlflow.root / "artifacts").rglob("MLmodel")), "no model artifacts in the proxied store"
    status = drill.cli("status", "--model-name", "teamreg", **env)
    assert status.returncode == 0, status.stdout[-2000:]
    # the server remembers the verified credential (MLFLOW_AUTH_CACHE_TTL_SECONDS), never a wrong one beside it
    import base64
    import urllib.error
    import urllib.request

    search = f"{team_mlflow.url}/api/2.0/mlflow/registered-models/search"
    for password, expected in ((team_mlflow.password, 200), ("not-the-password", 401)):
        token = base64.b64encode(f"{team_mlflow.username}:{password}".encode()).decode()
        request = urllib.request.Request(search, headers={"Authorization": f"Basic {token}"})
        try:
            code = urllib.request.urlopen(request, timeout=30).status
        except urllib.error.HTTPError as exc:
            code = exc.code
        assert code == expected, (password == team_mlflow.password, code)
    # the logged model is the run's output and carries the run's headline metrics (the run has them all)
    from mlflow.tracking import MlflowClient

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    c = MlflowClient(tracking_uri=team_mlflow.url, registry_uri=team_mlflow.url)
    version = c.get_model_version("teamreg", "1")
    assert version.source.startswith("models:/m-"), version.source  # the logged model is the version's source
    model, run = c.get_logged_model(version.source.removeprefix("models:/")), c.get_run(version.run_id)
    assert model.source_run_id == run.info.run_id
    assert [o.model_id for o in run.outputs.model_outputs] == [model.model_id]
    headline = {k: v for k, v in run.data.metrics.items() if k in MODEL_METRICS}
    assert {m.key: m.value for m in model.metrics} == headline, headline  # (no eval set here: no eval.*_f1)
    assert {"numeric.passed", "decisions.passed", "decisions.agreement", "eval.passed"} <= set(headline), headline
    assert not model.params  # the run's params stay the run's: the version names the run


@pytest.mark.slow
@pytest.mark.integration
def test_seqcls_team_registry_serves_until_ctrl_c_and_removes_its_data(team_postgres: Postgres, tmp_path: Path) -> None:
    """The command a developer runs: both servers up, the exports printed, SIGTERM stops both, data removed.
    (``team_postgres`` only for its rule: PostgreSQL must be installed — skipped without it, failed under CI.)"""
    import base64
    import os
    import re
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    err = tmp_path / "stderr.txt"
    with open(err, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "seqcls.cli", "team-registry"], stdout=subprocess.PIPE, stderr=fh, text=True
        )
    try:
        deadline = time.monotonic() + 180
        pattern = r"data in (\S+)\); .*\n  export (\S+)=(\S+) (\S+)=(\S+) (\S+)=(\S+)"
        while not (found := re.search(pattern, err.read_text(errors="replace"))):
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        data = Path(found.group(1))
        exports = dict(zip(found.groups()[1::2], found.groups()[2::2], strict=True))
        url = exports["SEQCLS_MLFLOW_TRACKING_URI"]
        auth = f"{exports['MLFLOW_TRACKING_USERNAME']}:{exports['MLFLOW_TRACKING_PASSWORD']}"
        request = urllib.request.Request(
            f"{url}/api/2.0/mlflow/registered-models/search",
            headers={"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()},
        )
        assert urllib.request.urlopen(request, timeout=10).status == 200
        assert (data / "data" / "PG_VERSION").is_file()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.read_text(errors="replace")[-3000:]
    assert "stopped: the MLflow server and PostgreSQL" in out
    assert not data.exists()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/health", timeout=3)
