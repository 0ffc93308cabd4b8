"""A real Airflow 3 for tests: one private AIRFLOW_HOME per process, its migrated sqlite, DAG runs with
``dag.test()`` and what they leave (task states, champion Asset events, what Triton serves).

Airflow reads its configuration once per process, at first import: a module using these calls
:func:`private_airflow_home` at import time, before anything imports airflow. The fixtures
(:func:`airflow_db`, :func:`triton`, the autouse :func:`task_logs_reach_this_test`) are imported by
the modules that run DAGs, so that only those get them.
"""

from __future__ import annotations

import atexit
import contextlib
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
from seqcls.contract.names import ModelName

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


#: A copy of the session's sqlite right after `airflow db migrate`, before any test wrote to it.
PRISTINE_DB = ".seqcls-migrated.db"


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """`airflow db migrate` once per test session (sqlite in the private AIRFLOW_HOME); a pristine copy
    of the migrated database is kept for other Airflow homes (:func:`seed_migrated_db`)."""
    import sqlite3

    home = private_airflow_home()
    marker = home / ".seqcls-migrated"
    if not marker.exists():
        t0 = time.perf_counter()
        out = airflow_cli("db", "migrate", timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        with sqlite3.connect(home / "airflow.db") as src, sqlite3.connect(home / PRISTINE_DB) as dst:
            src.backup(dst)
        marker.write_text(f"{time.perf_counter() - t0:.1f}s\n")
    return home


def seed_migrated_db(db: Path, airflow_home: Path) -> None:
    """Start another Airflow home's sqlite ``db`` from the session's freshly migrated one (``airflow_home``
    from :func:`airflow_db`): its own `airflow db migrate` then finds the schema current instead of
    building it again (tens of seconds on 2 cores)."""
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(airflow_home / PRISTINE_DB, db)


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


def dag_test(dag, **kwargs):
    """``dag.test(**kwargs)`` without its idle seconds (:func:`prompt_dag_test`): the DagRun."""
    with prompt_dag_test():
        return dag.test(**kwargs)


@contextlib.contextmanager
def prompt_dag_test(poll: float = 0.05) -> Iterator[list[float]]:
    """While in this block, ``dag.test()``'s own idle wait polls every ``poll`` s instead of every second.

    When no task is runnable, dag.test() sleeps 1 s before it re-reads the run from the database (it
    waits for a triggerer or a human-in-the-loop answer that could change a task's state); a failed or
    skipped task's downstream tasks are marked one level per turn, so a failure early in the release
    chain cost ~10 idle seconds per run. Only sleeps called by ``dag.test`` itself are shortened (the
    caller's frame is checked): task code, which dag.test() runs in this process, sleeps as long as it
    asks. Yields the idle waits dag.test() asked for."""
    import airflow.sdk.definitions.dag as dag_module

    real_sleep, dag_file, asked = time.sleep, dag_module.__file__, []

    def sleep(seconds: float) -> None:
        caller = sys._getframe(1).f_code
        if caller.co_name == "test" and caller.co_filename == dag_file:
            asked.append(seconds)
            seconds = min(seconds, poll)
        real_sleep(seconds)

    time.sleep = sleep
    try:
        yield asked
    finally:
        time.sleep = real_sleep


def run_dag(dag, conf: dict) -> tuple[object, dict[str, str]]:
    """``dag.test(run_conf=conf)`` (:func:`prompt_dag_test`): the DagRun and each task's state, the timing
    printed to stderr."""
    t0 = time.perf_counter()
    with prompt_dag_test() as idle:
        dr = dag.test(run_conf=conf)
    tis = {ti.task_id: ti for ti in dr.get_task_instances()}
    states = {tid: str(getattr(ti.state, "value", ti.state)) for tid, ti in tis.items()}
    timing = ", ".join(f"{tid} {tis[tid].duration or 0:.1f}s" for tid in TASKS if tid in tis)
    # dag.test() swaps sys.stdout; the original stream still reaches pytest's capture / the terminal
    print(
        f"\n{DAG_ID} run {dr.state} in {time.perf_counter() - t0:.1f}s ({sum(idle):.0f}s of idle polls shortened):"
        f" {timing}",
        file=sys.__stderr__,
        flush=True,
    )
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


def champion_version(model: str = ModelName("seqcls")):
    """MLflow's champion version of ``model`` (None if there is none)."""
    from seqcls.registry.ledger import CHAMPION, aliased_version, client
    from seqcls.settings import Settings

    return aliased_version(client(Settings.from_env()), model, CHAMPION)


def listening(ports: set[int]) -> list[str]:
    """Sockets still in LISTEN state on any of ``ports`` (any address: serve-logs binds 0.0.0.0)."""
    import psutil

    return [
        f"{c.laddr.ip}:{c.laddr.port} (pid {c.pid})"
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in ports
    ]


def process_tree(pid: int) -> list[str]:
    """Each process of ``pid``'s tree: pid, status, command line (what a hung shutdown waits on)."""
    import psutil

    out = []
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                out.append(f"{p.pid} {p.status()} {' '.join(p.cmdline())[:200]} [{_wait_channels(p.pid)}]")
    return out


def _wait_channels(pid: int) -> str:
    """Each thread's kernel wait channel (``do_wait``: joining a child; ``futex``: a lock or a thread join;
    ``pipe_read``: a queue), so a hung shutdown's report says what it waits on without a debugger."""
    chans = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        with contextlib.suppress(OSError):
            chans.append(f"{task.name}:{(task / 'wchan').read_text() or '-'}")
    return f"{len(chans)} threads: {' '.join(chans)}"


LOCAL_EXECUTOR_WORKER = "airflow worker -- LocalExecutor"


def hung_in_local_executor_end(tree: list[str], log: str) -> bool:
    """Whether a component that ignored two SIGINTs hung the way Airflow 3.3's ``LocalExecutor.end()`` can
    (apache/airflow#67870, fixed upstream after 3.3.2): the scheduler logged "Shutting down LocalExecutor"
    and waits on executor workers that are all idle — no task, nothing of seqcls's, running under it.
    Anything else under a hung component is a hang of ours."""
    workers = tree[1:]
    return (
        "Shutting down LocalExecutor" in log
        and bool(workers)
        and all(LOCAL_EXECUTOR_WORKER in line and "<idle>" in line for line in workers)
    )


def stop_components(
    procs: dict[str, subprocess.Popen], timeout: float = 45.0
) -> tuple[dict[str, int | None], dict[str, list[str]]]:
    """SIGINT to each Airflow component (not SIGTERM to a parent: that orphans children), as Ctrl-C does.

    Returns each component's exit code (None: it ignored two SIGINTs and was killed) plus
    ``leftover_processes`` (children still running 15 s later, then killed), and what each component
    that needed a second signal was still running when it got it."""
    import signal

    import psutil

    members = {}
    for name, proc in procs.items():
        with contextlib.suppress(psutil.Error):
            members[name] = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGINT)
    codes: dict[str, int | None] = {}
    stuck: dict[str, list[str]] = {}
    for name, proc in procs.items():
        try:
            codes[name] = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Airflow 3's LocalExecutor.end() joins its workers unbounded (apache/airflow#67870) and
            # says "Signal again if you don't want to wait": what is still running is kept for the
            # report, then the second signal it asks for — to the component's whole process group, as a
            # terminal's Ctrl-C does, so an idle executor worker it joins gets it too (a fresh-clone run
            # saw the scheduler ignore a second SIGINT to itself alone); a component that ignores that fails.
            stuck[name] = process_tree(proc.pid)
            if name == "scheduler":  # its SIGUSR2 handler logs every thread's stack to the scheduler's log
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGUSR2)
                time.sleep(2)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            try:
                codes[name] = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                codes[name] = None
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
    # children (executor workers, serve-logs, gunicorn/uvicorn workers) must be gone too
    leftovers = [p for ps in members.values() for p in ps if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    _, alive = psutil.wait_procs(leftovers, timeout=15)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    codes["leftover_processes"] = len(alive)
    return codes, stuck
