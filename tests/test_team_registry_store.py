"""A PostgreSQL MLflow store opened directly (``postgresql://host/db``, no MLflow server between): what the
embedded sqlite store does for itself must hold there too — artifacts in the home every worker shares, not
MLflow's ``./mlruns`` in whatever directory a process runs in, and two first releases at once not both
migrating the schema. On the team stack's throwaway PostgreSQL (``team_postgres``)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from seqcls.registry.ledger import client, experiment, opens_database
from seqcls.settings import Settings
from seqcls_tools.teamstack import Postgres
from tests.helpers.airflow import private_airflow_home
from tests.helpers.registry_race import open_store_at_once

private_airflow_home()  # before anything imports airflow (the Connection's test below)

pytestmark = [pytest.mark.slow, pytest.mark.integration]

#: libpq's own variables: a URI with credentials is refused (it is logged and recorded).
DB_LOGIN = {"PGUSER": "mlflow", "PGPASSWORD": "mlflow"}


def fresh_database(pg: Postgres) -> str:
    """A new empty database owned by the compose file's ``mlflow`` role; its URI (no credentials)."""
    pg.run_init_scripts()
    name = f"mlflow_{secrets.token_hex(4)}"
    conn = pg.connect("postgres")
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name} OWNER mlflow")
    finally:
        conn.close()
    return f"postgresql+psycopg2://127.0.0.1:{pg.port}/{name}"


def test_which_uris_the_client_opens_itself() -> None:
    assert opens_database("sqlite:////x/mlflow.db") and opens_database("postgresql+psycopg2://db:5432/mlflow")
    assert opens_database("mysql://db/mlflow") and not opens_database("http://mlflow:5000")
    assert not opens_database("https://mlflow.example.com") and not opens_database("databricks")


def test_two_first_releases_on_a_fresh_postgresql_store_then_artifacts_in_the_home(
    team_postgres: Postgres, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = fresh_database(team_postgres)
    # both set the schema up at once: one migrates, the other waits for it (never "expected to match one row")
    assert open_store_at_once(DB_LOGIN, str(home), uri) == ["ok", "ok"]
    for key, value in DB_LOGIN.items():
        monkeypatch.setenv(key, value)
    elsewhere = tmp_path / "worker-cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # an Airflow worker's directory: nothing of the release may land there
    settings = Settings.from_env(home=home, mlflow_tracking_uri=uri)
    c = client(settings)
    exp = c.get_experiment(experiment(c, settings, "direct"))
    assert exp.artifact_location == (settings.mlflow_artifacts_dir / "seqcls-direct").as_uri()
    run_id = c.create_run(exp.experiment_id).info.run_id
    c.log_text(run_id, "evidence", "parity/report.txt")
    assert list((settings.mlflow_artifacts_dir / "seqcls-direct").rglob("report.txt"))
    assert not list(elsewhere.iterdir())


def test_an_airflow_connection_to_a_postgresql_store_logs_in_through_libpq(
    team_postgres: Postgres, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Connection's login and password reach psycopg2 (``PGUSER`` / ``PGPASSWORD``), not MLflow's HTTP
    variables, which a database store never reads: the Connection's *Test* and every task log in."""
    import json

    from seqcls.airflow.hooks import MlflowHook

    uri = fresh_database(team_postgres)
    for key in DB_LOGIN:
        monkeypatch.delenv(key, raising=False)
    conn = {"conn_type": "generic", "login": "mlflow", "password": "mlflow", "extra": {"tracking_uri": uri}}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_PG", json.dumps(conn))
    hook = MlflowHook("mlflow_pg")
    assert hook.credentials_env() == DB_LOGIN
    ok, message = hook.test_connection()
    assert ok, message
