"""A real Airflow 3 for tests: one private AIRFLOW_HOME per process, its migrated sqlite, DAG runs with
``dag.test()`` and what they leave (task states, champion Asset events, what Triton serves).

Airflow reads its configuration once per process, at first import: a module using these calls
:func:`private_airflow_home` at import time, before anything imports airflow. The fixtures
(:func:`airflow_db`, :func:`triton`, the autouse :func:`task_logs_reach_this_test`) are imported by
the modules that run DAGs, so that only those get them.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from seqcls.airflow.context import TASK_ORDER

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"
PLUGINS = ROOT / "plugins"
DAG_ID = "seqcls_release"
SYNC_DAG_ID = "seqcls_sync"
#: Every task of the release DAG in order (rollback last), derived from the step table (no Airflow import).
TASKS: tuple[str, ...] = TASK_ORDER


def tasks_between(first: str | None, last: str | None) -> tuple[str, ...]:
    """The release tasks strictly after ``first`` and strictly before ``last`` (None: from the start / to the end)."""
    start = TASKS.index(first) + 1 if first else 0
    return TASKS[start : TASKS.index(last) if last else len(TASKS)]


def private_airflow_home() -> Path:
    """One AIRFLOW_HOME per pytest process, shared by the Airflow test modules (never ~/airflow), removed at exit.

    Set before anything imports airflow: its configuration is read once per process.
    """
    home = os.environ.get("SEQCLS_TEST_AIRFLOW_HOME")
    if not home:
        if "airflow.configuration" in sys.modules:
            pytest.skip("airflow was imported before the Airflow tests could isolate AIRFLOW_HOME")
        home = tempfile.mkdtemp(prefix="seqcls-airflow-")
        atexit.register(shutil.rmtree, home, ignore_errors=True)
        os.environ.update(
            SEQCLS_TEST_AIRFLOW_HOME=home,
            AIRFLOW_HOME=home,
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
            AIRFLOW__CORE__PLUGINS_FOLDER=str(PLUGINS),
            AIRFLOW__CORE__PARALLELISM="4",
        )
    return Path(home)


def airflow_cli(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``airflow <args>`` of this venv in a subprocess (this process's environment unless ``env``)."""
    cmd = [str(Path(sys.executable).with_name("airflow")), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or os.environ.copy())


@pytest.fixture(autouse=True)
def task_logs_reach_this_test() -> Iterator[None]:
    """Airflow configures logging once per process, binding the root StreamHandler to the
    sys.stdout of that moment (pytest's capture file of an earlier test): point it at fd 1, which
    pytest redirects to this test's capture (capfd included)."""
    import logging

    stream = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    for handler in logging.getLogger().handlers:
        if type(handler) is logging.StreamHandler:
            handler.stream = stream  # not setStream(): it flushes the old, possibly closed stream
    yield
    stream.flush()


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """`airflow db migrate` once per test session (sqlite in the private AIRFLOW_HOME)."""
    home = private_airflow_home()
    marker = home / ".seqcls-migrated"
    if not marker.exists():
        t0 = time.perf_counter()
        out = airflow_cli("db", "migrate", timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        marker.write_text(f"{time.perf_counter() - t0:.1f}s\n")
    return home


@pytest.fixture
def triton(server, monkeypatch: pytest.MonkeyPatch):
    """conftest's real local Triton, wired in as the `triton_default` connection."""
    cfg = server.config
    conn = {
        "conn_type": "generic",
        "host": "127.0.0.1",
        "port": cfg.grpc_port,
        "extra": {"grpc_endpoints": cfg.grpc_url, "http_endpoints": cfg.http_url, "repository": str(cfg.repository)},
    }
    monkeypatch.setenv("AIRFLOW_CONN_TRITON_DEFAULT", json.dumps(conn))
    return server


def parse_dag(monkeypatch: pytest.MonkeyPatch | None = None, **env: str | None):
    """Parse the dags folder (fresh each time: the DAG reads its env at parse time)."""
    from airflow.dag_processing.dagbag import DagBag

    mp = monkeypatch or pytest.MonkeyPatch()
    env = {"SEQCLS_MODELS_FILE": "none", **env}  # the single DAG, whatever models file a checkout has
    for key, value in env.items():
        if value is None:
            mp.delenv(key, raising=False)
        else:
            mp.setenv(key, value)
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}, bag.import_errors
    assert sorted(bag.dags) == [DAG_ID, SYNC_DAG_ID]
    return bag.dags[DAG_ID]


def run_dag(dag, conf: dict) -> tuple[object, dict[str, str]]:
    """``dag.test(run_conf=conf)``: the DagRun and each task's state, the timing printed to stderr."""
    t0 = time.perf_counter()
    dr = dag.test(run_conf=conf)
    tis = {ti.task_id: ti for ti in dr.get_task_instances()}
    states = {tid: str(getattr(ti.state, "value", ti.state)) for tid, ti in tis.items()}
    timing = ", ".join(f"{tid} {tis[tid].duration or 0:.1f}s" for tid in TASKS if tid in tis)
    # dag.test() swaps sys.stdout; the original stream still reaches pytest's capture / the terminal
    print(f"\n{DAG_ID} run {dr.state} in {time.perf_counter() - t0:.1f}s: {timing}", file=sys.__stderr__, flush=True)
    return dr, states


def ready_models(server) -> dict[str, list[str]]:
    """What ``server`` has READY: model name → versions."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=server.config.grpc_url)
    out: dict[str, list[str]] = {}
    for m in client.get_model_repository_index(headers=server.control_headers()).models:
        if m.state == "READY":
            out.setdefault(m.name, []).append(m.version)
    return out


def champion_events(uri: str) -> list[dict]:
    """Every Airflow AssetEvent of the asset ``uri``: extra, source DAG/run, id (oldest first)."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.uri == uri)
            .order_by(AssetEvent.id)
        ).all()
        return [{"extra": e.extra, "dag_id": e.source_dag_id, "run_id": e.source_run_id, "id": e.id} for e in rows]


def champion_version(model: str = "seqcls"):
    """MLflow's champion version of ``model`` (None if there is none)."""
    from seqcls.registry.ledger import CHAMPION, aliased_version, client
    from seqcls.settings import Settings

    return aliased_version(client(Settings.from_env()), model, CHAMPION)
